package secrets

import (
	"context"
	"testing"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

func TestParseRef(t *testing.T) {
	good := map[string][2]string{
		"secret://root/demo":          {iam.RootTenant, "demo"},
		"secret://tabcdefgh/bmc-pass": {"tabcdefgh", "bmc-pass"},
	}
	for in, want := range good {
		tn, name, ok := ParseRef(in)
		if !ok || tn != want[0] || name != want[1] || Ref(tn, name) != in {
			t.Errorf("%s: %q %q %v", in, tn, name, ok)
		}
	}
	for _, in := range []string{"", "secret://", "secret://root", "secret://root/", "secret:///x", "https://root/x", "secret://root/UPPER", "secret://root/a/b"} {
		if _, _, ok := ParseRef(in); ok {
			t.Errorf("%q accepted", in)
		}
	}
}

func FuzzParseRef(f *testing.F) {
	f.Add("secret://root/demo")
	f.Add("secret://t/a.b_c-d")
	f.Add("secret:///")
	f.Fuzz(func(t *testing.T, in string) {
		tn, name, ok := ParseRef(in)
		if ok && Ref(tn, name) != in {
			t.Fatalf("%q accepted but renders as %q", in, Ref(tn, name))
		}
	})
}

func TestAADBindsRefTenantVersion(t *testing.T) {
	base := string(aad("secret://a/x", "a", 1))
	for _, other := range []string{string(aad("secret://a/y", "a", 1)), string(aad("secret://a/x", "b", 1)), string(aad("secret://a/x", "a", 2))} {
		if other == base {
			t.Fatal("authenticated data does not bind every field")
		}
	}
}

// TestTenantOfReadsNothing checks that the envelope's resolver answers from
// the reference alone: the service here has no database, so any read would
// panic. An existing tenant's reference, a missing tenant's and a missing
// name's take the same path and give their tenant; a malformed one is
// NOT_FOUND.
func TestTenantOfReadsNothing(t *testing.T) {
	s := &Service{}
	for ref, want := range map[string]string{
		"secret://tabc/db-password": "tabc",
		"secret://tnobody/x":        "tnobody",
		"secret://root/site-bmc":    iam.RootTenant,
	} {
		got, err := s.TenantOf(context.Background(), ref)
		if err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", ref, got, err, want)
		}
	}
	if _, err := s.TenantOf(context.Background(), "secret://x/UPPER"); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("malformed reference: %v, want NOT_FOUND", err)
	}
}
