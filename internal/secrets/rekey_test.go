package secrets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

func rekeyTestKEK(b byte) pki.KEK {
	var k pki.KEK
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

// sealedUnder counts the stored versions whose value opens, under its own
// aad, to the value put (want by ref and version) under next, and under
// old; it fails on a value that opens to anything else.
func sealedUnder(t *testing.T, db *store.DB, want map[string][]byte, old, next pki.KEK) (underNext, underOld int) {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT ref, version, tenant_id, sealed FROM secrets`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var r resealRow
		if err := rows.Scan(&r.ref, &r.version, &r.tenant, &r.sealed); err != nil {
			t.Fatal(err)
		}
		for _, k := range []pki.KEK{next, old} {
			pt, err := pki.Open(k, r.sealed, aad(r.ref, r.tenant, r.version))
			if err != nil {
				continue
			}
			if !bytes.Equal(pt, want[fmt.Sprintf("%s@%d", r.ref, r.version)]) {
				t.Fatalf("%s version %d opens to another value", r.ref, r.version)
			}
			if k == next {
				underNext++
			} else {
				underOld++
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return underNext, underOld
}

// TestResealSecrets moves every version, live and deleted, to the new
// KEK in batches; a value under a third key stops it naming the row, with
// the batches before it committed and its own rolled back; a second run
// finishes the rest and counts what was done; nothing stays readable under
// the old key.
func TestResealSecrets(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		old, next, third := rekeyTestKEK(1), rekeyTestKEK(99), rekeyTestKEK(150)
		s := New(db, clock.NewFake(testNow), old, nil, nil, nil, nil, slog.New(slog.DiscardHandler))
		actor := audit.Entry{TenantID: iam.RootTenant, Actor: "test"}
		want := map[string][]byte{}
		put := func(name string, v int) {
			value := []byte(fmt.Sprintf("value-%s-%d", name, v))
			m, err := s.Put(ctx, actor, iam.RootTenant, name, ScopeTenant, value)
			if err != nil {
				t.Fatal(err)
			}
			want[fmt.Sprintf("%s@%d", m.Ref, m.Version)] = value
		}
		for v := 1; v <= 3; v++ {
			put("multi", v)
		}
		if err := s.Delete(ctx, actor, Ref(iam.RootTenant, "multi"), ScopeTenant); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 120; i++ {
			put(fmt.Sprintf("n%03d", i), 1)
		}
		total := len(want)
		// One value under a third key, past the first batch.
		bad := Ref(iam.RootTenant, "n110")
		sealed, err := pki.Seal(third, want[bad+"@1"], aad(bad, iam.RootTenant, 1))
		if err != nil {
			t.Fatal(err)
		}
		setSealed(t, db, bad, sealed)
		_, err = Reseal(ctx, db, old, next)
		if !errors.Is(err, pki.ErrNotUnderEitherKey) || !strings.Contains(err.Error(), "table secrets, "+bad+" version 1:") {
			t.Fatalf("err = %v, want ErrNotUnderEitherKey naming %s", err, bad)
		}
		if n, o := sealedUnder(t, db, want, old, next); n != resealBatch || o != total-resealBatch-1 {
			t.Fatalf("after the refusal: %d under the new key, %d under the old, want %d and %d", n, o, resealBatch, total-resealBatch-1)
		}
		// Repaired (sealed under the old key again), a second run finishes.
		if sealed, err = pki.Seal(old, want[bad+"@1"], aad(bad, iam.RootTenant, 1)); err != nil {
			t.Fatal(err)
		}
		setSealed(t, db, bad, sealed)
		c, err := Reseal(ctx, db, old, next)
		if err != nil || c != (pki.RekeyCount{Resealed: total - resealBatch, AlreadyDone: resealBatch}) {
			t.Fatalf("second run: %+v %v", c, err)
		}
		if n, o := sealedUnder(t, db, want, old, next); n != total || o != 0 {
			t.Fatalf("after the rotation: %d under the new key, %d under the old, want %d and 0", n, o, total)
		}
		if c, err := Reseal(ctx, db, old, next); err != nil || c != (pki.RekeyCount{AlreadyDone: total}) {
			t.Fatalf("third run: %+v %v", c, err)
		}
		if _, err := Reseal(ctx, db, next, next); err == nil {
			t.Fatal("the same key twice accepted")
		}
	})
}

// setSealed replaces the sealed value of version 1 of ref, as damage or a
// third key would leave it.
func setSealed(t *testing.T, db *store.DB, ref string, sealed []byte) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), `UPDATE secrets SET sealed = $1 WHERE ref = $2 AND version = 1`, sealed, ref); err != nil {
		t.Fatal(err)
	}
}
