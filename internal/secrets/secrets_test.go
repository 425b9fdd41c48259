package secrets

import (
	"context"
	"log/slog"
	"testing"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
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

// TestAADBindsRefTenantVersion: a value put through the service opens,
// as a release opens it, only for its own reference, tenant and version:
// its ciphertext moved to another reference or tenant, or read as an
// older version, does not open.
func TestAADBindsRefTenantVersion(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := New(db, clock.NewFake(testNow), rekeyTestKEK(7), nil, nil, nil, nil, slog.New(slog.DiscardHandler))
		actor := audit.Entry{TenantID: iam.RootTenant, Actor: "test"}
		for _, v := range []string{"x1", "x2"} {
			if _, err := s.Put(ctx, actor, iam.RootTenant, "x", ScopeTenant, []byte(v)); err != nil {
				t.Fatal(err)
			}
		}
		ref := Ref(iam.RootTenant, "x")
		var sec sealedSecret
		if err := db.QueryRowContext(ctx, sqlSealedLatest, ref, iam.RootTenant).Scan(&sec.version, &sec.sealed, new(string)); err != nil {
			t.Fatal(err)
		}
		if got, err := s.value(ref, iam.RootTenant, sec); err != nil || string(got) != "x2" || sec.version != 2 {
			t.Fatalf("own row: %q %v (version %d), want x2 at version 2", got, err, sec.version)
		}
		for name, c := range map[string]struct {
			ref, tenant string
			version     int64
		}{
			"another reference": {Ref(iam.RootTenant, "y"), iam.RootTenant, 2},
			"another tenant":    {Ref("tother", "x"), "tother", 2},
			"an older version":  {ref, iam.RootTenant, 1},
		} {
			if got, err := s.value(c.ref, c.tenant, sealedSecret{version: c.version, sealed: sec.sealed}); err == nil {
				t.Errorf("%s: the ciphertext opened to %q", name, got)
			}
		}
	})
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
