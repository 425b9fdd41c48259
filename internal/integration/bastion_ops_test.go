package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/bastion/agent"
	"github.com/bettercompute/bettercompute/internal/bastion/approval"
	"github.com/bettercompute/bettercompute/internal/bastion/share"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// opsBastion is a paired, running bastion with an enrolled factor whose
// secret the test holds (as the person's authenticator does).
type opsBastion struct {
	a      *agent.Agent
	st     *approval.Store
	secret string
	step   time.Time // the last step a code was made for
}

// enrolledBastion pairs a bastion and enrolls a second factor on it.
func enrolledBastion(t *testing.T, e *testenv.Env, cfg agent.Config) *opsBastion {
	t.Helper()
	a := pairBastionWith(t, e, cfg)
	st, err := agent.OpenApprovals(a.DataDir(), nil)
	if err != nil {
		t.Fatalf("open approvals: %v", err)
	}
	uri, err := st.Enroll("test")
	if err != nil {
		t.Fatalf("enroll: %v", err)
	}
	u, err := url.Parse(uri)
	if err != nil || u.Query().Get("secret") == "" {
		t.Fatalf("enroll URI %q: %v", uri, err)
	}
	return &opsBastion{a: a, st: st, secret: u.Query().Get("secret")}
}

// code is a fresh code: for the next 30 s step after the last one used
// (a code is accepted once, so each approval needs a later step; the
// store accepts one step ahead of its clock).
func (b *opsBastion) code(t *testing.T) string {
	t.Helper()
	now := time.Now().Truncate(30 * time.Second)
	if !now.After(b.step) {
		now = b.step.Add(30 * time.Second)
	}
	b.step = now
	c, err := totp.GenerateCode(b.secret, now)
	if err != nil {
		t.Fatalf("code: %v", err)
	}
	return c
}

// op sends one op through the control plane's API.
func op(t *testing.T, e *testenv.Env, id, kind, args, approvalID string) (apitypes.BastionOpAnswer, error) {
	t.Helper()
	var ans apitypes.BastionOpAnswer
	err := e.Client.Call(context.Background(), "bastions.op", apitypes.BastionOpIn{BastionID: id, Kind: kind, Args: json.RawMessage(args), Approval: approvalID}, &ans)
	return ans, err
}

// wantOpRefused asserts err is code with the bastion's reason.
func wantOpRefused(t *testing.T, what string, err error, code errs.Code, reason string) {
	t.Helper()
	if errs.CodeOf(err) != code || !strings.Contains(err.Error(), "("+reason+")") {
		t.Fatalf("%s: %v, want %s (%s)", what, err, code, reason)
	}
}

// mustOp sends an op that must be done.
func mustOp(t *testing.T, e *testenv.Env, id, kind, args, approvalID string) apitypes.BastionOpAnswer {
	t.Helper()
	ans, err := op(t, e, id, kind, args, approvalID)
	if err != nil || ans.Status != "done" {
		t.Fatalf("%s %s: %+v %v", kind, args, ans, err)
	}
	return ans
}

// sharedFolder makes a folder with a plain file, an excluded one, an
// .agent folder and a link out, and shares it excluding "secrets".
func sharedFolder(t *testing.T, dir string) share.Share {
	t.Helper()
	root := t.TempDir()
	for name, body := range map[string]string{"notes/todo.txt": "buy milk", "notes/secrets/key.txt": "hunter2",
		".agent/index.txt": "plaintext of every file", "old/report.txt": "q3"} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/hostname", filepath.Join(root, "notes", "out")); err != nil {
		t.Fatal(err)
	}
	s, err := share.Add(dir, root, []string{"secrets"}, time.Now())
	if err != nil {
		t.Fatalf("share: %v", err)
	}
	return s
}

// TestBastionOpsSharedFoldersAndApprovals pairs a bastion, enrolls a
// factor and shares a folder: a files:read of a shared file works; an
// excluded file, a path into .agent, a link out of the folder and a path
// with .. are refused by reason; a move plan waits for a code entered on
// the machine, runs once with it and archives (nothing deleted); the
// approval spent, and a code used once, are refused again.
func TestBastionOpsSharedFoldersAndApprovals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := bastionEnv(t, db)
		b := enrolledBastion(t, e, agent.Config{})
		id := b.a.ID()
		s := sharedFolder(t, b.a.DataDir())

		ans := mustOp(t, e, id, "files:read", `{"share":"`+s.ID+`","path":"notes/todo.txt"}`, "")
		var read struct {
			Data string `json:"data_base64"`
		}
		if err := json.Unmarshal(ans.Result, &read); err != nil {
			t.Fatal(err)
		}
		if got, _ := base64.StdEncoding.DecodeString(read.Data); string(got) != "buy milk" {
			t.Fatalf("files:read = %q", got)
		}
		for _, c := range []struct{ path, reason string }{{"notes/secrets/key.txt", "excluded"}, {".agent/index.txt", "agent-folder"},
			{"notes/out", "link-outside"}, {"notes/../../etc/passwd", "path-invalid"}} {
			_, err := op(t, e, id, "files:read", `{"share":"`+s.ID+`","path":"`+c.path+`"}`, "")
			wantOpRefused(t, "read "+c.path, err, refusedCode(c.reason), c.reason)
		}

		moves := `{"share":"` + s.ID + `","moves":[{"from":"old/report.txt","to":""}]}`
		pending := mustApprovalRequired(t, e, id, "files:move-plan", moves)
		code := b.code(t)
		if err := b.st.Approve(pending, code); err != nil {
			t.Fatalf("approve: %v", err)
		}
		ans = mustOp(t, e, id, "files:move-plan", moves, pending)
		archived := filepath.Join(s.Path, "Archive", time.Now().UTC().Format("2006-01-02"), "old", "report.txt")
		if got, err := os.ReadFile(archived); err != nil || string(got) != "q3" {
			t.Fatalf("archived file %s: %q %v (answer %s)", archived, got, err, ans.Result)
		}
		_, err := op(t, e, id, "files:move-plan", moves, pending)
		wantOpRefused(t, "approval reused", err, errs.AccessDenied, approval.ReasonApprovalSpent)

		again := mustApprovalRequired(t, e, id, "files:move-plan", `{"share":"`+s.ID+`","moves":[{"from":"notes/todo.txt","to":""}]}`)
		wantStoreRefusal(t, "code reused", b.st.Approve(again, code), approval.ReasonCodeReused)
	})
}

// refusedCode is the API code a share refusal answers with.
func refusedCode(reason string) errs.Code {
	if reason == "path-invalid" {
		return errs.InvalidInput
	}
	return errs.AccessDenied
}

// mustApprovalRequired sends an op that must wait for the person's
// approval and returns the pending request's id.
func mustApprovalRequired(t *testing.T, e *testenv.Env, id, kind, args string) string {
	t.Helper()
	ans, err := op(t, e, id, kind, args, "")
	if err != nil || ans.Status != "approval-required" || !strings.HasPrefix(ans.ApprovalRequest, "apr_") {
		t.Fatalf("%s without approval: %+v %v, want approval-required", kind, ans, err)
	}
	return ans.ApprovalRequest
}

// wantStoreRefusal asserts err is an approval refusal with reason.
func wantStoreRefusal(t *testing.T, what string, err error, reason string) {
	t.Helper()
	var r interface{ RefusalReason() string }
	if err == nil || !errors.As(err, &r) || r.RefusalReason() != reason {
		t.Fatalf("%s: %v, want reason %s", what, err, reason)
	}
}
