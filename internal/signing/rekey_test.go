package signing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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

// keysUnder counts the worker keys whose sealed key opens, under its own
// aad, to the key stored (want by id) under next, and under old.
func keysUnder(t *testing.T, db *store.DB, want map[string][]byte, old, next pki.KEK) (underNext, underOld int) {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT id, sealed_key FROM worker_keys`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var r resealRow
		if err := rows.Scan(&r.id, &r.sealed); err != nil {
			t.Fatal(err)
		}
		for _, k := range []pki.KEK{next, old} {
			pt, err := pki.Open(k, r.sealed, sealAAD(r.id))
			if err != nil {
				continue
			}
			if !bytes.Equal(pt, want[r.id]) {
				t.Fatalf("worker key %s opens to another key", r.id)
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

// TestResealWorkerKeys moves every worker key, expired or not, to the new
// KEK in batches; a key under a third KEK stops it naming the key, with the
// batches before it committed and its own rolled back; a second run
// finishes the rest; nothing stays readable under the old key.
func TestResealWorkerKeys(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		old, next, third := rekeyTestKEK(1), rekeyTestKEK(99), rekeyTestKEK(150)
		now := time.UnixMilli(1_800_000_000_000)
		want := map[string][]byte{}
		const total = 150
		for i := 0; i < total; i++ {
			id := fmt.Sprintf("wk%03d", i)
			want[id] = []byte("private-" + id)
			kek := old
			if id == "wk120" {
				kek = third
			}
			sealed, err := pki.Seal(kek, want[id], sealAAD(id))
			if err != nil {
				t.Fatal(err)
			}
			// Half of them long expired.
			if err := insertKey(ctx, db, storedKey{id: id, cert: []byte("cert"), sealed: sealed}, now.Add(time.Duration(i-total/2)*time.Hour), now); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Reseal(ctx, db, old, next)
		if !errors.Is(err, pki.ErrNotUnderEitherKey) || !strings.Contains(err.Error(), "table worker_keys, id wk120:") {
			t.Fatalf("err = %v, want ErrNotUnderEitherKey naming wk120", err)
		}
		if n, o := keysUnder(t, db, want, old, next); n != resealBatch || o != total-resealBatch-1 {
			t.Fatalf("after the refusal: %d under the new key, %d under the old, want %d and %d", n, o, resealBatch, total-resealBatch-1)
		}
		sealed, err := pki.Seal(old, want["wk120"], sealAAD("wk120"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `UPDATE worker_keys SET sealed_key = $1 WHERE id = 'wk120'`, sealed); err != nil {
			t.Fatal(err)
		}
		c, err := Reseal(ctx, db, old, next)
		if err != nil || c != (pki.RekeyCount{Resealed: total - resealBatch, AlreadyDone: resealBatch}) {
			t.Fatalf("second run: %+v %v", c, err)
		}
		if n, o := keysUnder(t, db, want, old, next); n != total || o != 0 {
			t.Fatalf("after the rotation: %d under the new key, %d under the old, want %d and 0", n, o, total)
		}
		if c, err := Reseal(ctx, db, old, next); err != nil || c != (pki.RekeyCount{AlreadyDone: total}) {
			t.Fatalf("third run: %+v %v", c, err)
		}
		if _, err := Reseal(ctx, db, old, pki.KEK{}); err == nil {
			t.Fatal("an all-zero new key accepted")
		}
	})
}
