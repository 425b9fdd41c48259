package revocations_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func feed(db *store.DB) *revocations.Feed {
	return revocations.New(db, clock.NewFake(t0), bus.New(), slog.New(slog.DiscardHandler))
}

func entry(subject string) revocations.Entry {
	return revocations.Entry{Kind: revwire.KindAPIKey, Subject: subject, TenantID: iam.RootTenant, At: t0, Reason: "test"}
}

// seqs returns subject -> seq of every entry after after.
func seqs(t *testing.T, f *revocations.Feed, after int64) map[string]int64 {
	t.Helper()
	all, err := f.Since(context.Background(), after, 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for i, e := range all {
		if e.Seq != after+int64(i)+1 {
			t.Fatalf("entry %d has seq %d: the feed has a gap after %d", i, e.Seq, after)
		}
		out[e.Subject] = e.Seq
	}
	return out
}

// TestFeedOrderUnderConcurrentRevokers forces two revokers to overlap on
// PostgreSQL: the first has taken its number and not committed; the
// second must wait for it (the counter row's lock, as pg_blocking_pids
// shows), so that a follower reading meanwhile sees neither, and then
// both in commit order with no gap. Without the wait the second would
// commit a higher number first, and a follower reading then would pass
// the first's lower number forever. A rolled-back revoker's number is
// taken again (gapless).
func TestFeedOrderUnderConcurrentRevokers(t *testing.T) {
	db := storetest.NewTestPostgres(t)
	ctx := context.Background()
	f := feed(db)
	head, err := f.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback()
	if err := revocations.AppendTx(ctx, first, entry("first")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- db.Tx(ctx, func(tx *sql.Tx) error { return revocations.AppendTx(ctx, tx, entry("second")) })
	}()
	storetest.WaitBlockedBy(t, db, storetest.BackendPID(t, first), storetest.Finished(done),
		"a second revoker committed its entry while the first held an earlier number uncommitted")
	if got := seqs(t, f, head); len(got) != 0 {
		t.Fatalf("a follower sees %v before the first revoker committed", got)
	}
	if err := first.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := seqs(t, f, head)
	if got["first"] != head+1 || got["second"] != head+2 {
		t.Fatalf("feed after both: %v, want first at %d and second at %d", got, head+1, head+2)
	}
	// A rolled-back revocation takes no number for good.
	rolled, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := revocations.AppendTx(ctx, rolled, entry("rolled-back")); err != nil {
		t.Fatal(err)
	}
	if err := rolled.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := db.Tx(ctx, func(tx *sql.Tx) error { return revocations.AppendTx(ctx, tx, entry("third")) }); err != nil {
		t.Fatal(err)
	}
	got = seqs(t, f, head)
	if _, ok := got["rolled-back"]; ok || got["third"] != head+3 {
		t.Fatalf("feed after a rollback: %v, want third at %d", got, head+3)
	}
}

// fixture is a tenant with an identity holding a key, a session made with
// it, and a second key.
type fixture struct {
	iam                *iam.Service
	keys               *apikeys.Service
	tenant, identity   string
	key1, key2, sessID string
	key1Value          string
	key2Value          string
	sessValue          string
}

func newFixture(t *testing.T, db *store.DB, name string) fixture {
	t.Helper()
	ctx := context.Background()
	clk := clock.NewFake(t0)
	is := iam.New(db, clk)
	ks := apikeys.New(db, clk, is)
	actor := audit.Entry{TenantID: iam.RootTenant, Actor: "test"}
	tn, err := is.CreateTenant(ctx, actor, iam.RootTenant, name)
	if err != nil {
		t.Fatal(err)
	}
	id, err := is.CreateIdentity(ctx, actor, tn.ID, name+"-op", "person")
	if err != nil {
		t.Fatal(err)
	}
	fx := fixture{iam: is, keys: ks, tenant: tn.ID, identity: id.ID}
	if fx.key1, fx.key1Value, err = ks.Create(ctx, actor, tn.ID, id.ID, "one", 0); err != nil {
		t.Fatal(err)
	}
	if fx.key2, fx.key2Value, err = ks.Create(ctx, actor, tn.ID, id.ID, "two", 0); err != nil {
		t.Fatal(err)
	}
	s, err := ks.CreateSession(ctx, actor, apikeys.Principal{KeyID: fx.key1, HomeTenant: tn.ID, Identity: id.ID}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fx.sessID, fx.sessValue = s.ID, s.Value
	return fx
}

// plantNext puts a row at the feed's next number without taking it, so
// that the next revocation's append fails (a unique violation) and its
// transaction rolls back; the returned func removes it.
func plantNext(t *testing.T, db *store.DB, f *revocations.Feed) func() {
	t.Helper()
	ctx := context.Background()
	head, err := f.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO revocations (seq, kind, subject, tenant_id, node_id, at, reason) VALUES ($1, 'api-key', 'planted', 'root', '', 0, 'test')`, head+1); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := db.ExecContext(ctx, `DELETE FROM revocations WHERE subject = 'planted'`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEachRevocationAppendsInItsOwnTransaction: revoking a key (and the
// session made with it), deleting an identity and tearing down a tenant
// each append their entries (kind, subject, tenant, reason) in the
// revocation's own transaction: when the append fails, the revocation is
// rolled back with it (the credential still authenticates, the identity
// still exists), and when the revocation succeeds its entries are there.
func TestEachRevocationAppendsInItsOwnTransaction(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		f := feed(db)
		actorIn := func(tenant string) audit.Entry { return audit.Entry{TenantID: tenant, Actor: "test"} }
		key1 := func(fx fixture) error { _, err := fx.keys.Authenticate(ctx, fx.key1Value); return err }
		key2 := func(fx fixture) error { _, err := fx.keys.Authenticate(ctx, fx.key2Value); return err }
		for _, c := range []struct {
			name   string
			revoke func(fx fixture) error
			valid  func(fx fixture) error // nil while what revoke revokes still authenticates
			want   func(fx fixture) []string
		}{
			{"api key", func(fx fixture) error { return fx.keys.Revoke(ctx, actorIn(fx.tenant), fx.tenant, fx.key1) }, key1,
				func(fx fixture) []string {
					return []string{"api-key " + fx.key1 + " revoked", "session " + fx.sessID + " maker-revoked"}
				}},
			{"session", func(fx fixture) error { return fx.keys.RevokeSession(ctx, actorIn(fx.tenant), fx.tenant, fx.sessID) },
				func(fx fixture) error { _, err := fx.keys.AuthenticateSession(ctx, fx.sessValue); return err },
				func(fx fixture) []string { return []string{"session " + fx.sessID + " revoked"} }},
			{"identity", func(fx fixture) error { return fx.iam.DeleteIdentity(ctx, actorIn(fx.tenant), fx.tenant, fx.identity) }, key2,
				func(fx fixture) []string {
					return []string{"identity " + fx.identity + " identity-deleted", "api-key " + fx.key1 + " identity-deleted",
						"api-key " + fx.key2 + " identity-deleted", "session " + fx.sessID + " identity-deleted"}
				}},
			{"tenant", func(fx fixture) error {
				_, _, err := fx.keys.RevokeTenant(ctx, actorIn(fx.tenant), fx.tenant)
				return err
			}, key2,
				func(fx fixture) []string {
					return []string{"api-key " + fx.key1 + " tenant-deleted", "api-key " + fx.key2 + " tenant-deleted", "session " + fx.sessID + " tenant-deleted"}
				}},
		} {
			t.Run(c.name, func(t *testing.T) {
				fx := newFixture(t, db, "rv-"+c.name[:3]+fmt.Sprint(time.Now().UnixNano()%1e6))
				// The append fails: the revocation does not happen.
				unplant := plantNext(t, db, f)
				if err := c.revoke(fx); err == nil {
					t.Fatal("the revocation committed although its feed entry could not be appended")
				}
				unplant()
				if err := c.valid(fx); err != nil {
					t.Fatalf("a revocation whose append failed still revoked: %v", err)
				}
				head, err := f.Head(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.revoke(fx); err != nil {
					t.Fatal(err)
				}
				all, err := f.Since(ctx, head, 100)
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]bool{}
				for _, e := range all {
					if e.TenantID != fx.tenant {
						t.Errorf("entry %d (%s %s) in tenant %q, want %q", e.Seq, e.Kind, e.Subject, e.TenantID, fx.tenant)
					}
					got[e.Kind+" "+e.Subject+" "+e.Reason] = true
				}
				want := c.want(fx)
				if len(all) != len(want) {
					t.Errorf("%d entries %v, want %v", len(all), got, want)
				}
				for _, w := range want {
					if !got[w] {
						t.Errorf("no entry %q in %v", w, got)
					}
				}
				if err := c.valid(fx); errs.CodeOf(err) != errs.Unauthenticated {
					t.Errorf("after the revocation: %v, want UNAUTHENTICATED", err)
				}
			})
		}
	})
}
