package sandboxes

import (
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// TestSealEnvFor: a payload's env carries every plain value sealed (never
// the value), a secret reference as it is; the sealed value opens only
// under the data key of its tenant and sandbox, for its variable, and the
// payload needs the broker; without a key-encryption key a plain value is
// refused INVALID_CONFIG rather than sent in clear.
func TestSealEnvFor(t *testing.T) {
	kek := pki.KEK{9}
	s := &Service{kek: kek}
	const sbx, value = "sbxaaaaaaaaaaaaaaaa", "plain-value-1234567890"
	got, err := s.sealEnvFor("tabc", sbx, map[string]string{"A": value, "DB": "secret://tabc/db", "E": ""})
	if err != nil {
		t.Fatal(err)
	}
	if got["DB"] != "secret://tabc/db" || !needsBroker(got) {
		t.Fatalf("env %v", got)
	}
	for name, v := range got {
		if name != "DB" && (!strings.HasPrefix(v, spec.SealedEnvPrefix+"tabc:") || strings.Contains(v, value)) {
			t.Fatalf("%s carried as %q: want it sealed", name, v)
		}
	}
	k := spec.EnvDataKey(spec.EnvKey(kek), "tabc", sbx)
	if plain, err := spec.OpenEnvValue(k, sbx, "A", got["A"]); err != nil || plain != value {
		t.Fatalf("opens %q, %v", plain, err)
	}
	if plain, err := spec.OpenEnvValue(k, sbx, "E", got["E"]); err != nil || plain != "" {
		t.Fatalf("empty value opens %q, %v", plain, err)
	}
	for name, k := range map[string]pki.KEK{
		"another tenant's key":  spec.EnvDataKey(spec.EnvKey(kek), "tother", sbx),
		"another sandbox's key": spec.EnvDataKey(spec.EnvKey(kek), "tabc", "sbxbbbbbbbbbbbbbbbb"),
		"another KEK's key":     spec.EnvDataKey(spec.EnvKey(pki.KEK{8}), "tabc", sbx),
	} {
		if _, err := spec.OpenEnvValue(k, sbx, "A", got["A"]); err == nil {
			t.Fatalf("%s opens the value", name)
		}
	}
	if _, err := spec.OpenEnvValue(k, sbx, "B", got["A"]); err == nil {
		t.Fatal("the value opens as another variable")
	}
	if env, err := s.sealEnvFor("tabc", sbx, nil); env != nil || err != nil {
		t.Fatalf("empty env: %v %v", env, err)
	}
	if _, err := (&Service{}).sealEnvFor("tabc", sbx, map[string]string{"A": value}); errs.CodeOf(err) != errs.InvalidConfig {
		t.Fatalf("no KEK: %v, want INVALID_CONFIG", err)
	}
	refs := map[string]string{"DB": "secret://tabc/db"}
	if env, err := (&Service{}).sealEnvFor("tabc", sbx, refs); err != nil || env["DB"] != refs["DB"] {
		t.Fatalf("references only, no KEK: %v %v", env, err)
	}
}

// TestSealedValueBounds: a 4096-byte value, sealed, passes a payload's
// checks; a template's env still takes at most 4096 bytes a value.
func TestSealedValueBounds(t *testing.T) {
	s := &Service{kek: pki.KEK{9}}
	const sbx = "sbxaaaaaaaaaaaaaaaa"
	long := strings.Repeat("x", 4096)
	env, err := s.sealEnvFor(strings.Repeat("t", 64), sbx, map[string]string{"A": long})
	if err != nil {
		t.Fatal(err)
	}
	u := spec.Update{SandboxID: sbx, DeadlineMS: 1, Claim: true, Env: env}
	if err := u.Validate(); err != nil {
		t.Fatalf("a sealed 4096-byte value: %v", err)
	}
	if err := spec.ValidEnv(map[string]string{"A": spec.SealedEnvPrefix + long}); err == nil {
		t.Fatal("a template value over 4096 bytes passes")
	}
}
