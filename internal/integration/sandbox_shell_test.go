package integration

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// screen collects what a shell tunnel shows, for waits on its text.
type screen struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
	done    chan error
}

func watchScreen(tun *client.Tunnel) *screen {
	s := &screen{changed: make(chan struct{}, 1), done: make(chan error, 1)}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := tun.Read(b)
			s.mu.Lock()
			s.buf.Write(b[:n])
			s.mu.Unlock()
			select {
			case s.changed <- struct{}{}:
			default:
			}
			if err != nil {
				s.done <- err
				return
			}
		}
	}()
	return s
}

// waitFor waits until the screen shows want (failing after 30 s instead
// of hanging).
func (s *screen) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		s.mu.Lock()
		got := s.buf.String()
		s.mu.Unlock()
		if strings.Contains(got, want) {
			return
		}
		select {
		case <-s.changed:
		case err := <-s.done:
			s.done <- err
			s.mu.Lock()
			got = s.buf.String()
			s.mu.Unlock()
			if !strings.Contains(got, want) {
				t.Fatalf("the shell ended (%v) without showing %q:\n%q", err, want, got)
			}
			return
		case <-deadline:
			t.Fatalf("the shell did not show %q in 30 s:\n%q", want, got)
		}
	}
}

// TestSandboxShellOverTunnel: sandbox exec -it's path: an exec ticket
// decided on the sandbox, a terminal in the sandbox through its node's
// session (runc on a pseudo-terminal where runc runs, else the simulated
// shell): typed input reaches the program, a resize reaches its terminal,
// and its exit status comes back.
func TestSandboxShellOverTunnel(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		s := startSandboxes(t, db, nil, 0)
		ctx := context.Background()
		x, err := s.admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		tun, err := s.admin.OpenShell(ctx, x.ID, []string{"sh"})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		defer tun.Close()
		scr := watchScreen(tun)
		// The shell's prompt first: the terminal is set up and the
		// program reads it (runc follows a resize from then on).
		scr.waitFor(t, "$ ")
		if err := tun.Resize(123, 45); err != nil {
			t.Fatal(err)
		}
		if _, err := tun.Write([]byte("stty size\n")); err != nil {
			t.Fatal(err)
		}
		scr.waitFor(t, "45 123")
		if _, err := tun.Write([]byte("echo from-the-sandbox\nexit 3\n")); err != nil {
			t.Fatal(err)
		}
		scr.waitFor(t, "from-the-sandbox")
		// Read ends with io.EOF after the exit status.
		if err := <-scr.done; !errors.Is(err, io.EOF) {
			t.Fatalf("read ended with %v", err)
		}
		if err := tun.Wait(); err != nil {
			t.Fatalf("end: %v", err)
		}
		if code, ok := tun.ExitCode(); !ok || code != 3 {
			t.Fatalf("exit status %d %v, want 3", code, ok)
		}
	})
}

// TestSandboxShellKilledWhenTerminalCloses: closing the client's side
// kills the program in the sandbox.
func TestSandboxShellKilledWhenTerminalCloses(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		s := startSandboxes(t, db, nil, 0)
		ctx := context.Background()
		x, err := s.admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		tun, err := s.admin.OpenShell(ctx, x.ID, []string{"sh"})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		scr := watchScreen(tun)
		if _, err := tun.Write([]byte("echo started; sleep 987\n")); err != nil {
			t.Fatal(err)
		}
		scr.waitFor(t, "started")
		host := s.Nodes[0].Sandbox
		if s.rt == spec.RuntimeSim {
			n, changed, _ := host.Shells()
			if n != 1 {
				t.Fatalf("%d shells alive, want 1", n)
			}
			tun.Close()
			for n != 0 {
				select {
				case n = <-changed:
				case <-time.After(30 * time.Second):
					t.Fatal("the shell is still alive 30 s after its terminal closed")
				}
			}
			return
		}
		// The typed line is echoed before it runs: wait until ps shows it.
		for start := time.Now(); !sleeping(t, s, x.ID); {
			if time.Since(start) > 30*time.Second {
				t.Fatal("sleep 987 is not running in the sandbox")
			}
		}
		tun.Close()
		deadline := time.Now().Add(30 * time.Second)
		for sleeping(t, s, x.ID) {
			if time.Now().After(deadline) {
				t.Fatal("sleep 987 still runs 30 s after its terminal closed")
			}
		}
	})
}

// sleeping reports whether `sleep 987` runs in sandbox id (busybox ps).
func sleeping(t *testing.T, s sandboxEnv, id string) bool {
	t.Helper()
	r, err := s.admin.Exec(context.Background(), id, []string{"ps"}, 10)
	if err != nil {
		t.Fatalf("ps: %v", err)
	}
	return bytes.Contains(r.Stdout, []byte("sleep 987"))
}

// TestSandboxExecTicketRefusals: an exec ticket is refused for a sandbox
// expiring within a minute (INVALID_STATE) and for another tenant's
// sandbox exactly as for a missing one.
func TestSandboxExecTicketRefusals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		s := startSandboxes(t, db, clk, 0)
		ctx := context.Background()
		brief, err := s.admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		x, err := s.admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		var tk apitypes.TunnelTicket
		if err := s.admin.Call(ctx, "sandboxes.execTicket", apitypes.ExecTicketIn{ID: brief.ID, Argv: []string{"sh"}}, &tk); err != nil {
			t.Fatalf("a ticket with 10 minutes left: %v", err)
		}
		_, other := s.TenantAdmin(t, "shell-other")
		errForeign := other.Call(ctx, "sandboxes.execTicket", apitypes.ExecTicketIn{ID: x.ID, Argv: []string{"sh"}}, &tk)
		errMissing := other.Call(ctx, "sandboxes.execTicket", apitypes.ExecTicketIn{ID: "sb-does-not-exist", Argv: []string{"sh"}}, &tk)
		var f, m *client.Error
		if !errors.As(errForeign, &f) || !errors.As(errMissing, &m) || f.Code != m.Code || f.Status != m.Status ||
			strings.ReplaceAll(f.Message, x.ID, "X") != strings.ReplaceAll(m.Message, "sb-does-not-exist", "X") {
			t.Fatalf("foreign sandbox: %v; missing sandbox: %v", errForeign, errMissing)
		}
		err = s.admin.Call(ctx, "sandboxes.execTicket", apitypes.ExecTicketIn{ID: x.ID, Argv: []string{""}}, &tk)
		wantAPIError(t, err, "INVALID_INPUT", "argv")
		clk.Set(brief.ExpiresAt.Add(-59 * time.Second))
		err = s.admin.Call(ctx, "sandboxes.execTicket", apitypes.ExecTicketIn{ID: brief.ID, Argv: []string{"sh"}}, &tk)
		wantAPIError(t, err, "INVALID_STATE", "expires within a minute")
	})
}

// TestSandboxShellClosedWhenAccessRevoked: an open shell is re-decided
// as compute:sandboxes:exec on the sandbox: deleting the caller's role
// binding closes it with ACCESS_DENIED.
func TestSandboxShellClosedWhenAccessRevoked(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		s := startSandboxes(t, db, nil, 0)
		ctx := context.Background()
		id, err := s.Client.CreateIdentity(ctx, s.tenant, "shell-op", "person")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Client.Bind(ctx, s.tenant, id.ID, "admin"); err != nil {
			t.Fatal(err)
		}
		k, err := s.Client.CreateAPIKey(ctx, s.tenant, id.ID, "shell-op", 0)
		if err != nil {
			t.Fatal(err)
		}
		op := s.NewClient(t, k.Key)
		x, err := op.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		tun, err := op.OpenShell(ctx, x.ID, []string{"sh"})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		defer tun.Close()
		scr := watchScreen(tun)
		if _, err := tun.Write([]byte("echo open\n")); err != nil {
			t.Fatal(err)
		}
		scr.waitFor(t, "open")
		bs, err := s.Client.Bindings(ctx, s.tenant)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			if b.IdentityID == id.ID {
				if err := s.Client.Call(ctx, "bindings.delete", apitypes.TenantIDIn{TenantIn: apitypes.TenantIn{TenantID: s.tenant}, ID: b.ID}, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		defer time.AfterFunc(30*time.Second, func() { tun.Close() }).Stop()
		err = <-scr.done
		wantAPIError(t, err, "ACCESS_DENIED", "revoked")
	})
}
