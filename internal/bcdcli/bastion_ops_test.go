package bcdcli_test

import (
	"bytes"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"

	"github.com/bettercompute/bettercompute/internal/bastion/agent"
	"github.com/bettercompute/bettercompute/internal/bastion/ops"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
	"github.com/bettercompute/bettercompute/internal/bcdcli"
)

// pairedFolder is a bastion data folder as pairing leaves it (its
// WireGuard key and the paired marker), without a control plane.
func pairedFolder(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bastion")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	k, err := wgtun.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"wg.key": k.String() + "\n", "bastion.paired": "nbastiontest0000001\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runIn runs bcd with stdin.
func runIn(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := bcdcli.Main(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// TestBastionApproveCommands drives the person's commands on a paired
// folder: enroll shows the secret once, a pending request is listed and
// approved with a code read from standard input (a wrong code exits 1
// with its reason, a reused one too), a share is added and listed, and a
// standing grant is given, listed and dropped.
func TestBastionApproveCommands(t *testing.T) {
	dir := pairedFolder(t)
	code, out, errOut := run(t, "bastion", "enroll", "--data", dir)
	m := regexp.MustCompile(`otpauth://\S+`).FindString(out)
	if code != 0 || m == "" {
		t.Fatalf("enroll: %d %q %q", code, out, errOut)
	}
	u, _ := url.Parse(m)
	secret := u.Query().Get("secret")
	if code, _, errOut := run(t, "bastion", "enroll", "--data", dir); code != 1 || !strings.Contains(errOut, "already-enrolled") {
		t.Fatalf("enroll twice: %d %q", code, errOut)
	}

	st, err := agent.OpenApprovals(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	req, err := st.Ask(ops.KindFilesMove, ops.Digest(ops.KindFilesMove, []byte(`{}`)), "move a to b")
	if err != nil {
		t.Fatal(err)
	}
	code, out, _ = run(t, "bastion", "pending", "--data", dir, "--json")
	var pending struct{ Requests []struct{ ID string } }
	if code != 0 || json.Unmarshal([]byte(out), &pending) != nil || len(pending.Requests) != 1 || pending.Requests[0].ID != req.ID {
		t.Fatalf("pending: %d %q", code, out)
	}
	if code, _, errOut := runIn(t, "000000\n", "bastion", "approve", req.ID, "--data", dir); code != 1 || !strings.Contains(errOut, "code-invalid") {
		t.Fatalf("approve with a wrong code: %d %q", code, errOut)
	}
	now := time.Now()
	c, _ := totp.GenerateCode(secret, now)
	if code, out, errOut := runIn(t, c+"\n", "bastion", "approve", req.ID, "--data", dir); code != 0 || !strings.Contains(out, "approved "+req.ID) || !strings.Contains(errOut, "move a to b") {
		t.Fatalf("approve: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := runIn(t, c+"\n", "bastion", "ops", "grant", "--kind", "files:move-plan", "--data", dir); code != 1 || !strings.Contains(errOut, "code-reused") {
		t.Fatalf("standing grant with a used code: %d %q", code, errOut)
	}
	if code, _, errOut := runIn(t, "", "bastion", "ops", "grant", "--kind", "action:apply", "--data", dir); code != 2 || !strings.Contains(errOut, "standing grant is for") {
		t.Fatalf("standing grant for an apply: %d %q", code, errOut)
	}
	c2, _ := totp.GenerateCode(secret, now.Add(30*time.Second))
	if code, out, errOut := runIn(t, c2+"\n", "bastion", "ops", "grant", "--kind", "files:move-plan", "--per-hour", "3", "--data", dir); code != 0 || !strings.Contains(out, "standing grant sg_") {
		t.Fatalf("standing grant: %d %q %q", code, out, errOut)
	}
	code, out, _ = run(t, "bastion", "ops", "list", "--data", dir, "--json")
	var grants struct {
		Grants []struct {
			ID      string
			PerHour int `json:"PerHour"`
			Valid   bool
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &grants) != nil || len(grants.Grants) != 1 || !grants.Grants[0].Valid {
		t.Fatalf("ops list: %d %q", code, out)
	}
	if code, out, _ := run(t, "bastion", "ops", "drop", "--all", "--data", dir); code != 0 || !strings.Contains(out, "dropped 1") {
		t.Fatalf("ops drop --all: %d %q", code, out)
	}

	shared := t.TempDir()
	if code, out, errOut := run(t, "bastion", "share", shared, "--exclude", ".ssh", "--data", dir); code != 0 || !strings.Contains(out, "shared "+shared) {
		t.Fatalf("share: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := run(t, "bastion", "share", dir, "--data", dir); code != 2 || !strings.Contains(errOut, "share-holds-data-dir") {
		t.Fatalf("sharing the data folder: %d %q", code, errOut)
	}
	code, out, _ = run(t, "bastion", "shares", "--data", dir, "--json")
	if code != 0 || !strings.Contains(out, `".ssh"`) {
		t.Fatalf("shares: %d %q", code, out)
	}
}
