package idempotency

import (
	"bytes"
	"testing"
	"time"
)

// The rule for a key already taken, case by case.
func TestDecide(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	sum, other := []byte("digest-a"), []byte("digest-b")
	ms := func(d time.Duration) int64 { return now.Add(d).UnixMilli() }
	cases := []struct {
		name       string
		r          row
		digest     []byte
		credential bool
		want       verdict
	}{
		{"finished, same request: replay", row{digest: sum, status: 200, created: ms(-time.Hour)}, sum, false, replay},
		{"finished 4xx is replayed too", row{digest: sum, status: 409, created: ms(-time.Hour)}, sum, false, replay},
		{"finished, other body", row{digest: sum, status: 200, created: ms(-time.Hour)}, other, false, otherRequest},
		{"running under its lease", row{digest: sum, status: 0, created: ms(-time.Minute), lease: ms(time.Minute)}, sum, false, running},
		{"running, other body: other request first", row{digest: sum, status: 0, created: ms(-time.Minute), lease: ms(time.Minute)}, other, false, otherRequest},
		{"lease ran out: take over", row{digest: sum, status: 0, created: ms(-time.Minute), lease: ms(0)}, sum, false, takeOver},
		{"credential answer: shown once", row{digest: sum, status: 200, created: ms(-time.Hour)}, sum, true, shownOnce},
		{"finished at exactly TTL: expired", row{digest: sum, status: 200, created: ms(-TTL)}, other, false, expired},
		{"finished just inside TTL", row{digest: sum, status: 200, created: ms(-TTL + time.Millisecond)}, sum, false, replay},
		{"older than TTL, lease over: expired", row{digest: sum, status: 0, created: ms(-TTL - time.Hour), lease: ms(-time.Second)}, sum, false, expired},
		{"older than TTL but still running: not expired", row{digest: sum, status: 0, created: ms(-TTL - time.Hour), lease: ms(time.Second)}, sum, false, running},
	}
	for _, c := range cases {
		if got := decide(c.r, c.digest, now, c.credential); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// Whatever the row, a request never replays an answer stored for another
// request, never replays a credential, and never replays or takes over a
// row of another body.
func FuzzDecide(f *testing.F) {
	f.Add([]byte("a"), []byte("a"), 200, int64(0), int64(0), int64(1000), false)
	f.Add([]byte("a"), []byte("b"), 0, int64(-10), int64(100), int64(0), true)
	f.Add([]byte("x"), []byte("x"), 0, int64(-86_400_000), int64(-1), int64(0), false)
	f.Fuzz(func(t *testing.T, stored, digest []byte, status int, created, lease, nowMS int64, credential bool) {
		r := row{digest: stored, status: status, created: created, lease: lease}
		v := decide(r, digest, time.UnixMilli(nowMS), credential)
		same := bytes.Equal(stored, digest)
		switch v {
		case replay:
			if !same || status == 0 || credential {
				t.Fatalf("replay of %+v for digest %x (credential %v)", r, digest, credential)
			}
		case takeOver, running:
			if !same || status != 0 {
				t.Fatalf("%v of %+v for digest %x", v, r, digest)
			}
		case shownOnce:
			if !credential {
				t.Fatalf("shown once without a credential: %+v", r)
			}
		case expired:
			if status == 0 && nowMS < lease {
				t.Fatalf("expired a running row: %+v at %d", r, nowMS)
			}
		}
	})
}
