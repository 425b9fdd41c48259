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
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

const sealedPlain = "plain-value-sealed-end-to-end-1234567890"

// testEnvKey is the control plane's env key in these tests.
var testEnvKey = spec.EnvKey(pki.KEK{7, 7, 7})

// sealedFetcher answers the env key of tenant tabc for any sandbox, and
// testValue for testRef; every other reference is refused.
func sealedFetcher(_ context.Context, ref string) ([]byte, error) {
	if tenant, sbx, ok := spec.ParseEnvKeyRef(ref); ok && tenant == "tabc" {
		k := spec.EnvDataKey(testEnvKey, tenant, sbx)
		return k[:], nil
	}
	if ref == testRef {
		return []byte(testValue), nil
	}
	return nil, errors.New("refused")
}

// sealFor seals value of variable name for sandbox id of tabc.
func sealFor(t *testing.T, id, name, value string) string {
	t.Helper()
	v, err := spec.SealEnvValue(spec.EnvDataKey(testEnvKey, "tabc", id), "tabc", id, name, value)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestHostSealedEnv: a create whose env holds sealed values opens them
// with the sandbox's env key fetched for the command, and its programs
// see the plain values while the state file holds only the sealed form; a
// value that does not open (tampered, sealed for another sandbox or
// variable), or whose key the broker refuses or no broker gives, fails
// the create env-unavailable and leaves nothing; after bcd reopens, an
// exec without env references is refused env-unavailable, one naming the
// key but not a secret reference secret-unavailable, and one naming both
// runs with both values.
func TestHostSealedEnv(t *testing.T) {
	clk := clock.NewFake(time.Now())
	rt := NewSim()
	h, digest := testHost(t, func(string) Runtime { return rt }, clk)
	mk := func(id string, env map[string]string) []byte {
		c := spec.Create{SandboxID: id, ImageDigest: digest, Runtime: spec.RuntimeSim, Limits: spec.Limits{CPUMillis: 100, MemoryMB: 64, Pids: 16, DiskMB: 8},
			Network: spec.NetworkNone, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli(), Env: env}
		b, _ := json.Marshal(c)
		return b
	}
	ctx := driver.WithSecrets(context.Background(), sealedFetcher)
	other := ids.New("sbx")
	for name, c := range map[string]struct {
		ctx context.Context
		env func(id string) map[string]string
	}{
		"tampered": {ctx, func(id string) map[string]string {
			v := sealFor(t, id, "A", sealedPlain)
			i := len(v) - 5
			return map[string]string{"A": v[:i] + string(v[i]^1) + v[i+1:]}
		}},
		"another sandbox's value":  {ctx, func(string) map[string]string { return map[string]string{"A": sealFor(t, other, "A", sealedPlain)} }},
		"another variable's value": {ctx, func(id string) map[string]string { return map[string]string{"A": sealFor(t, id, "B", sealedPlain)} }},
		"malformed":                {ctx, func(string) map[string]string { return map[string]string{"A": spec.SealedEnvPrefix + sealedPlain} }},
		"another tenant's key": {ctx, func(id string) map[string]string {
			v, _ := spec.SealEnvValue(spec.EnvDataKey(testEnvKey, "tother", id), "tother", id, "A", sealedPlain)
			return map[string]string{"A": v}
		}},
		"no broker": {context.Background(), func(id string) map[string]string { return map[string]string{"A": sealFor(t, id, "A", sealedPlain)} }},
	} {
		id := ids.New("sbx")
		if _, err := h.Create(c.ctx, mk(id, c.env(id))); err == nil || err.Error() != spec.ReasonEnvUnavailable {
			t.Fatalf("%s: %v, want %s", name, err, spec.ReasonEnvUnavailable)
		}
		if _, ok := h.Get(id); ok {
			t.Fatalf("%s: the refused sandbox is held", name)
		}
	}
	id := ids.New("sbx")
	if _, err := h.Create(ctx, mk(id, map[string]string{"A": sealFor(t, id, "A", sealedPlain), "DB": testRef, "OLD": "p"})); err != nil {
		t.Fatal(err)
	}
	if got := envOf(t, h, id); !slices.Contains(got, "A="+sealedPlain) || !slices.Contains(got, "DB="+testValue) || !slices.Contains(got, "OLD=p") {
		t.Fatalf("env in the sandbox %q", got)
	}
	b, err := os.ReadFile(filepath.Join(h.cfg.Dir, "state", id+".json"))
	if err != nil || bytes.Contains(b, []byte(sealedPlain)) || !bytes.Contains(b, []byte(spec.SealedEnvPrefix)) {
		t.Fatalf("state: %s (%v): want the sealed form, never the value", b, err)
	}
	h2, err := OpenHost(context.Background(), HostConfig{Dir: h.cfg.Dir, Runtime: rt, Images: h.cfg.Images, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	key := spec.EnvKeyRef("tabc", id)
	for _, c := range []struct {
		refs []string
		want string
	}{
		{nil, ""}, // either value is missing
		{[]string{testRef}, spec.ReasonEnvUnavailable},
		{[]string{key}, ReasonSecretUnavailable},
	} {
		ex, _ := json.Marshal(spec.Exec{SandboxID: id, Argv: []string{"env"}, TimeoutMS: 1000, EnvRefs: c.refs})
		_, err := h2.Exec(ctx, ex)
		if err == nil || (c.want != "" && err.Error() != c.want) || (c.want == "" && err.Error() != spec.ReasonEnvUnavailable && err.Error() != ReasonSecretUnavailable) {
			t.Fatalf("an exec after a restart naming %q: %v, want %q", c.refs, err, c.want)
		}
	}
	ex, _ := json.Marshal(spec.Exec{SandboxID: id, Argv: []string{"env"}, TimeoutMS: 1000, EnvRefs: []string{key, testRef}})
	out, err := h2.Exec(ctx, ex)
	if err != nil {
		t.Fatal(err)
	}
	var res spec.ExecResult
	_ = json.Unmarshal(out, &res)
	if got := strings.Split(string(res.Stdout), "\n"); !slices.Contains(got, "A="+sealedPlain) || !slices.Contains(got, "DB="+testValue) {
		t.Fatalf("env after a restart %q", got)
	}
	// Resolved once, the values serve the sandbox's later programs.
	if got := envOf(t, h2, id); !slices.Contains(got, "A="+sealedPlain) {
		t.Fatalf("env of a later exec %q", got)
	}
}

// TestHelperEnvRefs: for the root helper's host, the node fetches only
// sandbox env keys: a create's or claim's for its sealed values (of its
// own sandbox), an exec's that its env refs name; never a secret
// reference (the helper's host refuses those, secret-unavailable).
func TestHelperEnvRefs(t *testing.T) {
	const sbx = "sbxaaaaaaaaaaaaaaaa"
	key := spec.EnvKeyRef("tabc", sbx)
	create, _ := json.Marshal(spec.Create{SandboxID: sbx, Env: map[string]string{"A": spec.SealedEnvPrefix + "tabc:AAAA", "B": spec.SealedEnvPrefix + "tabc:BBBB", "DB": testRef, "P": "p"}})
	if got := helperEnvRefs("sandbox.create", create); !slices.Equal(got, []string{key}) {
		t.Fatalf("create: %q", got)
	}
	if got := helperEnvRefs("sandbox.update", create); !slices.Equal(got, []string{key}) {
		t.Fatalf("claim: %q", got)
	}
	exec, _ := json.Marshal(spec.Exec{SandboxID: sbx, EnvRefs: []string{testRef, key}})
	if got := helperEnvRefs("sandbox.exec", exec); !slices.Equal(got, []string{key}) {
		t.Fatalf("exec: %q", got)
	}
	plain, _ := json.Marshal(spec.Create{SandboxID: sbx, Env: map[string]string{"DB": testRef}})
	if got := helperEnvRefs("sandbox.create", plain); len(got) != 0 {
		t.Fatalf("no sealed value: %q", got)
	}
}
