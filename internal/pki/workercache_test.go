package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"time"
)

// workerLeaf signs an Ed25519 worker certificate valid [notBefore,
// notAfter] with the command root, without IssueWorkerCert's refusal of a
// leaf that outlives its root (to test the root's share of the window).
func workerLeaf(t *testing.T, root *x509.Certificate, rootKey ed25519.PrivateKey, pub ed25519.PublicKey, notBefore, notAfter time.Time) []byte {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "worker w"},
		URIs: []*url.URL{WorkerSPIFFEID(td, "w")}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
		NotBefore: notBefore, NotAfter: notAfter,
	}, root, pub, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// sameAnswer fails unless the memo's answer is VerifyWorkerChain's: the
// same key, or an error with the same text (x509's errors name the time
// and the certificate, so equal text means the same refusal).
func sameAnswer(t *testing.T, what string, gotPub ed25519.PublicKey, gotErr error, wantPub ed25519.PublicKey, wantErr error) {
	t.Helper()
	switch {
	case wantErr != nil:
		if gotErr == nil || gotErr.Error() != wantErr.Error() {
			t.Fatalf("%s: memo err = %v, VerifyWorkerChain err = %v", what, gotErr, wantErr)
		}
		if gotPub != nil {
			t.Fatalf("%s: memo returned a key with its error", what)
		}
	case gotErr != nil || !gotPub.Equal(wantPub):
		t.Fatalf("%s: memo = (%x, %v), VerifyWorkerChain = (%x, nil)", what, gotPub, gotErr, wantPub)
	}
}

// TestWorkerChainCacheNeverAdmitsMore checks that the memo answers exactly
// as VerifyWorkerChain for valid, wrong-root, wrong-trust-domain,
// not-yet-valid and expired inputs (bounds included, for the leaf's and
// the root's validity), on an empty memo and after a success for the same
// DER was stored: a stored success never admits a time outside the chain's
// validity, other roots or another trust domain.
func TestWorkerChainCacheNeverAdmitsMore(t *testing.T) {
	f := newWorkerChainFixture(t)
	b, other, rootKey, wpub, der, otherDER := f.b, f.other, f.rootKey, f.wpub, f.der, f.otherDER
	leaf := parse(t, der)
	wrongTD, _ := IssueWorkerCert(b.CommandRoot, rootKey, "prod.bc.local", "worker-1", wpub, 24*time.Hour, t0)
	root := b.CommandRoot
	// Leaves that begin before the root does, and end after it: the
	// window must be the root's there, not the leaf's.
	early := workerLeaf(t, root, rootKey, wpub, root.NotBefore.Add(-time.Hour), root.NotBefore.Add(time.Hour))
	late := workerLeaf(t, root, rootKey, wpub, root.NotAfter.Add(-time.Hour), root.NotAfter.Add(time.Hour))

	mine := []*x509.Certificate{root}
	type input struct {
		name  string
		der   []byte
		roots []*x509.Certificate
		td    string
		at    time.Time
	}
	// primes are successes the memo stores; each refusal below shares its
	// DER with one of them.
	primes := []input{
		{"valid", der, mine, td, t0},
		{"early leaf inside the root's validity", early, mine, td, root.NotBefore.Add(30 * time.Minute)},
		{"late leaf inside the root's validity", late, mine, td, root.NotAfter.Add(-30 * time.Minute)},
	}
	cases := append(append([]input(nil), primes...), []input{
		{"valid an hour before expiry", der, mine, td, t0.Add(23 * time.Hour)},
		{"valid at NotBefore exactly", der, mine, td, leaf.NotBefore},
		{"valid at NotAfter exactly", der, mine, td, leaf.NotAfter},
		{"valid among several roots", der, []*x509.Certificate{other.CommandRoot, root}, td, t0},
		{"valid with a nil root", der, []*x509.Certificate{nil, root}, td, t0},
		{"not yet valid", der, mine, td, leaf.NotBefore.Add(-time.Millisecond)},
		{"not yet valid by a day", der, mine, td, t0.Add(-24 * time.Hour)},
		{"expired", der, mine, td, leaf.NotAfter.Add(time.Millisecond)},
		{"expired by a day", der, mine, td, t0.Add(48 * time.Hour)},
		{"wrong root", der, []*x509.Certificate{other.CommandRoot}, td, t0},
		{"node CA is not a command root", der, []*x509.Certificate{b.NodeCA}, td, t0},
		{"only a nil root", der, []*x509.Certificate{nil}, td, t0},
		{"no roots", der, nil, td, t0},
		{"wrong trust domain", der, mine, "prod.bc.local", t0},
		{"certificate for another trust domain", wrongTD, mine, td, t0},
		{"chains to another root", otherDER, mine, td, t0},
		{"zero time", der, mine, td, time.Time{}},
		{"early leaf before its root is valid", early, mine, td, root.NotBefore.Add(-time.Millisecond)},
		{"late leaf after its root expired", late, mine, td, root.NotAfter.Add(time.Millisecond)},
		{"garbage DER", []byte{0x30, 0x03, 1, 2, 3}, mine, td, t0},
	}...)
	check := func(t *testing.T, c *WorkerChainCache, in input, what string) {
		t.Helper()
		wantPub, wantErr := VerifyWorkerChain(in.der, in.roots, in.td, in.at)
		gotPub, gotErr := c.Verify(in.der, in.roots, in.td, in.at)
		sameAnswer(t, what, gotPub, gotErr, wantPub, wantErr)
	}
	for _, in := range cases {
		t.Run(in.name, func(t *testing.T) {
			c := NewWorkerChainCache(0)
			check(t, c, in, "empty memo")
			check(t, c, in, "second call")
			for _, p := range primes {
				check(t, c, p, "prime "+p.name)
			}
			check(t, c, in, "after successes were stored")
			// Twice more, so a success of this very input is served from
			// the memo too.
			check(t, c, in, "again")
			for _, p := range primes {
				check(t, c, p, "stored "+p.name)
			}
		})
	}
	// Only successes are kept: the primes, the other valid inputs with a
	// distinct key (several roots, a nil root). Refusals leave no entry.
	c := NewWorkerChainCache(0)
	for _, in := range cases {
		_, _ = c.Verify(in.der, in.roots, in.td, in.at)
	}
	if got := c.Len(); got != len(primes)+2 {
		t.Fatalf("memo holds %d entries, want %d (successes only)", got, len(primes)+2)
	}
}

// TestWorkerChainCacheBoundedAndConcurrent checks that the memo never
// holds more than its size (it forgets everything when full) and that
// concurrent use gives every caller VerifyWorkerChain's answer.
func TestWorkerChainCacheBoundedAndConcurrent(t *testing.T) {
	b, kek, _ := newBundle(t)
	rootKey, err := b.CommandRootKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	roots := []*x509.Certificate{b.CommandRoot}
	var ders [][]byte
	var pubs []ed25519.PublicKey
	for i := 0; i < 5; i++ {
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		der, err := IssueWorkerCert(b.CommandRoot, rootKey, td, fmt.Sprintf("worker-%d", i), pub, 24*time.Hour, t0)
		if err != nil {
			t.Fatal(err)
		}
		ders, pubs = append(ders, der), append(pubs, pub)
	}
	c := NewWorkerChainCache(2)
	var wg sync.WaitGroup
	errs := make(chan error, 8*len(ders)*20)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 20; k++ {
				for i, der := range ders {
					at := t0.Add(time.Duration(k) * time.Hour)
					pub, err := c.Verify(der, roots, td, at)
					if err != nil || !pub.Equal(pubs[i]) {
						errs <- fmt.Errorf("worker %d at %v: %x, %v", i, at, pub, err)
					}
					if _, err := c.Verify(der, roots, td, t0.Add(25*time.Hour)); err == nil {
						errs <- fmt.Errorf("worker %d admitted after expiry", i)
					}
					if n := c.Len(); n > 2 {
						errs <- fmt.Errorf("memo holds %d entries, size 2", n)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// BenchmarkWorkerChain compares the full verification with a memo hit.
func BenchmarkWorkerChain(b *testing.B) {
	bundle, kek, _ := newBundle(b)
	rootKey, _ := bundle.CommandRootKey(kek)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	der, err := IssueWorkerCert(bundle.CommandRoot, rootKey, td, "worker-1", pub, 24*time.Hour, t0)
	if err != nil {
		b.Fatal(err)
	}
	roots := []*x509.Certificate{bundle.CommandRoot}
	b.Run("VerifyWorkerChain", func(b *testing.B) {
		for b.Loop() {
			if _, err := VerifyWorkerChain(der, roots, td, t0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("WorkerChainCache", func(b *testing.B) {
		c := NewWorkerChainCache(0)
		for b.Loop() {
			if _, err := c.Verify(der, roots, td, t0); err != nil {
				b.Fatal(err)
			}
		}
	})
}
