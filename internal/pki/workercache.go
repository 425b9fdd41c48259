package pki

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"sync"
	"time"
)

// DefaultWorkerChainCacheSize is the number of verified worker chains a
// WorkerChainCache keeps when made with size <= 0. Workers rotate their key
// daily, so a node sees a handful of distinct chains a day; 64 leaves room
// for many workers and several command roots.
const DefaultWorkerChainCacheSize = 64

// WorkerChainCache memoises successful VerifyWorkerChain answers, so that
// a node does not parse and verify the same worker certificate for every
// command signed under the same worker key (a worker key lives 24 h and
// signs every command meanwhile, each carrying byte-identical signer DER).
//
// It never admits more than VerifyWorkerChain would:
//   - An entry is keyed by every input that decides the answer apart from
//     the time: the SHA-256 of the worker DER, of each root's Raw DER in
//     order (a nil root has its own marker) and of the trust domain. Other
//     roots or another trust domain never find an entry made for these.
//   - Only successes are stored, with the validity window of the chain
//     that verified: the latest NotBefore and the earliest NotAfter over
//     every certificate in it (leaf and root). x509's Verify checks each
//     certificate of a chain as !at.Before(NotBefore) && !at.After(NotAfter)
//     and nothing else in it, nor in VerifyWorkerChain's checks after it,
//     depends on the time, so at any time inside that window (bounds
//     included) VerifyWorkerChain gives the same key.
//   - A time outside the window, or anything not stored, goes through the
//     full VerifyWorkerChain, and its error is returned unchanged.
//
// The cache is bounded: when it holds size entries and another success
// must be stored, it forgets every entry first (the next commands verify
// in full again). That is simple and costs at most one full verification
// per distinct chain after a clear.
//
// It is safe for concurrent use and holds no global state; one cache may be
// shared by the nodes of one process (fleetsim does), because the answer is
// a pure function of the key and the time.
type WorkerChainCache struct {
	size int

	mu      sync.Mutex
	entries map[[sha256.Size]byte]workerChainEntry
}

// workerChainEntry is one verified chain: its key and the window of times
// at which the chain verifies.
type workerChainEntry struct {
	pub                 ed25519.PublicKey
	notBefore, notAfter time.Time
}

// NewWorkerChainCache returns an empty cache holding at most size verified
// chains (DefaultWorkerChainCacheSize when size <= 0).
func NewWorkerChainCache(size int) *WorkerChainCache {
	if size <= 0 {
		size = DefaultWorkerChainCacheSize
	}
	return &WorkerChainCache{size: size, entries: make(map[[sha256.Size]byte]workerChainEntry)}
}

// Verify returns what VerifyWorkerChain(workerDER, commandRoots,
// trustDomain, at) returns: from the cache when the same inputs verified
// before and at lies inside that chain's validity window, otherwise by
// running VerifyWorkerChain (and storing a success). The returned key is a
// copy the caller may keep. A nil cache verifies in full every time, so a
// verifier with an optional cache calls Verify either way.
func (c *WorkerChainCache) Verify(workerDER []byte, commandRoots []*x509.Certificate, trustDomain string, at time.Time) (ed25519.PublicKey, error) {
	if c == nil {
		return VerifyWorkerChain(workerDER, commandRoots, trustDomain, at)
	}
	key := workerChainKey(workerDER, commandRoots, trustDomain)
	if !at.IsZero() {
		c.mu.Lock()
		e, ok := c.entries[key]
		c.mu.Unlock()
		// The same comparisons as x509's isValid, for every certificate
		// of the chain at once.
		if ok && !at.Before(e.notBefore) && !at.After(e.notAfter) {
			return append(ed25519.PublicKey(nil), e.pub...), nil
		}
	}
	pub, chain, err := verifyWorkerChain(workerDER, commandRoots, trustDomain, at)
	if err != nil {
		return nil, err
	}
	e := workerChainEntry{pub: append(ed25519.PublicKey(nil), pub...)}
	e.notBefore, e.notAfter = chainValidity(chain)
	c.mu.Lock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.size {
		clear(c.entries)
	}
	c.entries[key] = e
	c.mu.Unlock()
	return pub, nil
}

// Len returns how many verified chains the cache holds.
func (c *WorkerChainCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// workerChainKey digests the inputs of VerifyWorkerChain other than the
// time into a fixed-length, unambiguous key: SHA-256 over the worker DER's
// digest, the number of roots, each root's digest (or a nil marker), and
// the trust domain's digest. Every part has a fixed length, so no two
// different inputs encode alike.
func workerChainKey(workerDER []byte, commandRoots []*x509.Certificate, trustDomain string) [sha256.Size]byte {
	h := sha256.New()
	d := sha256.Sum256(workerDER)
	h.Write(d[:])
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(commandRoots)))
	h.Write(n[:])
	for _, r := range commandRoots {
		if r == nil {
			h.Write([]byte{0})
			continue
		}
		d = sha256.Sum256(r.Raw)
		h.Write([]byte{1})
		h.Write(d[:])
	}
	d = sha256.Sum256([]byte(trustDomain))
	h.Write(d[:])
	var key [sha256.Size]byte
	h.Sum(key[:0])
	return key
}
