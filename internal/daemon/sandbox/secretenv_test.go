package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

const (
	testRef   = "secret://tabc/db"
	testValue = "s3cr3t-value-in-memory-only"
)

// fetcherOf returns a fetcher answering testValue for testRef and
// counting its calls.
func fetcherOf(calls *int) driver.SecretFetcher {
	return func(_ context.Context, ref string) ([]byte, error) {
		*calls++
		if ref != testRef {
			return nil, errors.New("refused")
		}
		return []byte(testValue), nil
	}
}

// envOf runs env in sandbox id and returns its lines.
func envOf(t *testing.T, h *Host, id string) []string {
	t.Helper()
	ex, _ := json.Marshal(spec.Exec{SandboxID: id, Argv: []string{"env"}, TimeoutMS: 1000})
	out, err := h.Exec(context.Background(), ex)
	if err != nil {
		t.Fatal(err)
	}
	var res spec.ExecResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
}

// TestHostSecretEnv: a create whose env names a secret resolves it
// through the command's fetcher; execs get the value; the state file
// keeps the reference and never the value; a create the broker refuses,
// or with no fetcher, fails secret-unavailable and leaves nothing; a
// claim resolves its env the same way, and one the host refuses fetches
// nothing; after bcd reopens, an exec is refused secret-unavailable (the
// value was in memory only).
func TestHostSecretEnv(t *testing.T) {
	clk := clock.NewFake(time.Now())
	rt := NewSim()
	h, digest := testHost(t, func(string) Runtime { return rt }, clk)
	mk := func(env map[string]string, warm bool) (string, []byte) {
		c := spec.Create{SandboxID: ids.New("sbx"), ImageDigest: digest, Runtime: spec.RuntimeSim, Limits: spec.Limits{CPUMillis: 100, MemoryMB: 64, Pids: 16, DiskMB: 8},
			Network: spec.NetworkNone, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli(), Env: env, Warm: warm}
		b, _ := json.Marshal(c)
		return c.SandboxID, b
	}
	env := map[string]string{"DB": testRef, "PLAIN": "p"}
	calls := 0
	ctx := driver.WithSecrets(context.Background(), fetcherOf(&calls))
	for name, c := range map[string]struct {
		ctx context.Context
		env map[string]string
	}{
		"no fetcher":     {context.Background(), env},
		"broker refuses": {ctx, map[string]string{"DB": "secret://tabc/other"}},
	} {
		id, raw := mk(c.env, false)
		if _, err := h.Create(c.ctx, raw); err == nil || err.Error() != ReasonSecretUnavailable {
			t.Fatalf("%s: %v, want %s", name, err, ReasonSecretUnavailable)
		}
		if _, ok := h.Get(id); ok {
			t.Fatalf("%s: the refused sandbox is held", name)
		}
	}
	id, raw := mk(env, false)
	if _, err := h.Create(ctx, raw); err != nil {
		t.Fatal(err)
	}
	if got := envOf(t, h, id); !slices.Contains(got, "DB="+testValue) || !slices.Contains(got, "PLAIN=p") {
		t.Fatalf("env in the sandbox %q", got)
	}
	warm, raw := mk(nil, true)
	if _, err := h.Create(ctx, raw); err != nil {
		t.Fatal(err)
	}
	// A claim the host refuses (of a sandbox that is not warm) fetches no
	// secret for it.
	before := calls
	cold, _ := json.Marshal(spec.Update{SandboxID: id, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli(), Claim: true, Env: env})
	if _, err := h.Update(ctx, cold); err == nil || err.Error() != "not-warm" || calls != before {
		t.Fatalf("a claim of a cold sandbox: %v, %d secrets fetched for it; want not-warm and none", err, calls-before)
	}
	upd, _ := json.Marshal(spec.Update{SandboxID: warm, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli(), Claim: true, Env: env})
	if _, err := h.Update(ctx, upd); err != nil {
		t.Fatal(err)
	}
	if got := envOf(t, h, warm); !slices.Contains(got, "DB="+testValue) {
		t.Fatalf("env in the claimed sandbox %q", got)
	}
	for _, x := range []string{id, warm} {
		b, err := os.ReadFile(filepath.Join(h.cfg.Dir, "state", x+".json"))
		if err != nil || bytes.Contains(b, []byte(testValue)) || !bytes.Contains(b, []byte(testRef)) {
			t.Fatalf("state of %s: %s (%v): want the reference, never the value", x, b, err)
		}
	}
	h2, err := OpenHost(context.Background(), HostConfig{Dir: h.cfg.Dir, Runtime: rt, Images: h.cfg.Images, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	// After a restart the value is gone with the process: an exec is
	// refused rather than run without the variable.
	ex, _ := json.Marshal(spec.Exec{SandboxID: id, Argv: []string{"env"}, TimeoutMS: 1000})
	if _, err := h2.Exec(ctx, ex); err == nil || err.Error() != ReasonSecretUnavailable {
		t.Fatalf("an exec after a restart: %v, want %s", err, ReasonSecretUnavailable)
	}
}
