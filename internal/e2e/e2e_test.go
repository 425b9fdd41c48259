// Package e2e drives the built binaries as a user would: the README's
// `better-compute dev`, then the CLI against it.
package e2e

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestDevAndCLI builds both binaries, starts `better-compute dev`, waits
// for its ready line, and runs the commands the README shows.
func TestDevAndCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "github.com/bettercompute/bettercompute/cmd/better-compute", "github.com/bettercompute/bettercompute/cmd/bcd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	data := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A page on a loopback port the simulated nodes let tunnels reach
	// (issue 16's "Done when": curl through `tunnel --listen`).
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("the page behind the tunnel\n"))
	}))
	defer page.Close()
	pagePort := page.Listener.Addr().(*net.TCPAddr).Port
	dev := exec.CommandContext(ctx, filepath.Join(bin, "better-compute"), "dev", "--data", data, "--nodes", "2",
		"--api", freeAddr(t), "--gateway", freeAddr(t), "--tunnel-ports", strconv.Itoa(pagePort))
	dev.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dev.Process.Signal(os.Interrupt)
		_ = dev.Wait()
	})
	sc := bufio.NewScanner(out)
	ready := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ready:") {
			ready = true
			break
		}
	}
	if !ready {
		t.Fatal("dev exited before it was ready")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	env := map[string]string{}
	b, err := os.ReadFile(filepath.Join(data, "env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "="); ok {
			env[k] = strings.Trim(v, "'")
		}
	}
	cli := func(args ...string) (string, int) {
		c := exec.CommandContext(ctx, filepath.Join(bin, "better-compute"), args...)
		c.Env = append(os.Environ(), "BC_ADDR="+env["BC_ADDR"], "BC_API_KEY_FILE="+env["BC_API_KEY_FILE"], "BC_CA_FILE="+env["BC_CA_FILE"])
		o, err := c.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
			o = append(o, ee.Stderr...)
		} else if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return string(o), code
	}
	o, code := cli("nodes", "list", "--json")
	type listed struct {
		ID        string `json:"id"`
		Role      string `json:"role"`
		Connected bool   `json:"connected"`
	}
	var list struct {
		Nodes []listed `json:"nodes"`
	}
	jerr := json.Unmarshal([]byte(o), &list)
	// dev also pairs its bastion, a machine of role bastion: the two
	// simulated nodes are the rest.
	var nodes, bastions []listed
	for _, n := range list.Nodes {
		if n.Role == "bastion" {
			bastions = append(bastions, n)
		} else {
			nodes = append(nodes, n)
		}
	}
	if jerr != nil || code != 0 || len(nodes) != 2 || !nodes[0].Connected || !nodes[1].Connected || len(bastions) != 1 {
		t.Fatalf("nodes list (exit %d): %s", code, o)
	}
	o, code = cli("commands", "run", "--node", nodes[0].ID, "--kind", "diag.run", "--wait", "--json")
	var cmd struct {
		ID       string          `json:"id"`
		State    string          `json:"state"`
		Attested bool            `json:"attested"`
		Result   json.RawMessage `json:"result"`
		Reason   string          `json:"reason"`
	}
	if err := json.Unmarshal([]byte(o), &cmd); err != nil || code != 0 || cmd.State != "succeeded" || !cmd.Attested {
		t.Fatalf("commands run (exit %d): %s", code, o)
	}
	o, code = cli("commands", "show", cmd.ID, "--json")
	if code != 0 || !strings.Contains(o, `"succeeded"`) {
		t.Fatalf("commands show (exit %d): %s", code, o)
	}
	// One call queues a command for every node that carries a label.
	o, code = cli("commands", "fanout", "--label", "sim=true", "--kind", "node.ping", "--json")
	var fan struct {
		Count      int      `json:"count"`
		CommandIDs []string `json:"command_ids"`
	}
	if err := json.Unmarshal([]byte(o), &fan); err != nil || code != 0 || fan.Count != 2 || len(fan.CommandIDs) != 2 {
		t.Fatalf("commands fanout (exit %d): %s", code, o)
	}
	if o, code = cli("commands", "fanout", "--label", "sim=nope", "--kind", "node.ping"); code != 1 || !strings.Contains(o, "INVALID_INPUT") {
		t.Fatalf("fanout matching no node (exit %d): %s", code, o)
	}
	// A destructive kind outside a batch is refused on the node, and
	// --wait exits non-zero.
	o, code = cli("commands", "run", "--node", nodes[1].ID, "--kind", "disk.wipe", "--wait", "--json")
	if code == 0 || !strings.Contains(o, `"unbatched-destructive"`) {
		t.Fatalf("unbatched disk.wipe (exit %d): %s", code, o)
	}
	// The README's sealed-secret block: put from a file, then a keyed
	// digest under a fresh nonce that whoever knows the value can check.
	valueFile := filepath.Join(t.TempDir(), "value.txt")
	if err := os.WriteFile(valueFile, []byte("readme-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if o, code = cli("secrets", "put", "--name", "demo", "--value-file", valueFile); code != 0 {
		t.Fatalf("secrets put (exit %d): %s", code, o)
	}
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		t.Fatal(err)
	}
	o, code = cli("commands", "run", "--node", nodes[0].ID, "--kind", "secret.digest", "--payload", `{"ref":"secret://root/demo","nonce":"`+hex.EncodeToString(nonce)+`"}`, "--wait", "--json")
	var digest struct {
		State  string `json:"state"`
		Result struct {
			HMAC string `json:"hmac_sha256"`
		} `json:"result"`
	}
	mac := hmac.New(sha256.New, []byte("readme-secret"))
	mac.Write(nonce)
	if err := json.Unmarshal([]byte(o), &digest); err != nil || code != 0 || digest.State != "succeeded" || digest.Result.HMAC != hex.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("secret.digest (exit %d): %s", code, o)
	}
	devTunnel(t, ctx, bin, env, nodes[0].ID, pagePort, cli)
}

// devTunnel is the tunnel part of TestDevAndCLI: `tunnel --listen`
// forwards a local port to the page on the node's allowed port, and a
// port not on the list is refused with the node's reason.
func devTunnel(t *testing.T, ctx context.Context, bin string, env map[string]string, node string, pagePort int, cli func(args ...string) (string, int)) {
	t.Helper()
	listen := freeAddr(t)
	tun := exec.CommandContext(ctx, filepath.Join(bin, "better-compute"), "tunnel", "--node", node, "--port", strconv.Itoa(pagePort), "--listen", listen)
	tun.Env = append(os.Environ(), "BC_ADDR="+env["BC_ADDR"], "BC_API_KEY_FILE="+env["BC_API_KEY_FILE"], "BC_CA_FILE="+env["BC_CA_FILE"])
	stderr, err := tun.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := tun.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tun.Process.Signal(os.Interrupt)
		_ = tun.Wait()
	})
	sc := bufio.NewScanner(stderr)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "forwarding ") {
		t.Fatalf("tunnel --listen did not start: %q", sc.Text())
	}
	go func() {
		for sc.Scan() {
		}
	}()
	resp, err := http.Get("http://" + listen + "/")
	if err != nil {
		t.Fatalf("GET through the tunnel: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "the page behind the tunnel\n" {
		t.Fatalf("through the tunnel: %q", body)
	}
	other := pagePort + 1
	if other > 65535 {
		other = pagePort - 1
	}
	if o, code := cli("tunnel", "--node", node, "--port", strconv.Itoa(other), "--stdio"); code != 1 || !strings.Contains(o, "tunnel-port-not-allowed") {
		t.Fatalf("a port not on the list (exit %d): %s", code, o)
	}
}
