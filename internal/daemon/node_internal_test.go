package daemon

import (
	"crypto/x509"
	"testing"
	"time"
)

func TestRenewAtJitterBounds(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	life := 24 * time.Hour
	n := &Node{chain: []*x509.Certificate{{NotBefore: nb, NotAfter: nb.Add(life)}}}
	lo, hi := nb.Add(life*2/3-life/10), nb.Add(life*2/3+life/10)
	seen := map[time.Time]bool{}
	for i := 0; i < 500; i++ {
		at := n.renewAt()
		if at.Before(lo) || at.After(hi) {
			t.Fatalf("renew at %v, outside [%v, %v]", at, lo, hi)
		}
		seen[at] = true
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct renewal times in 500: no jitter", len(seen))
	}
}
