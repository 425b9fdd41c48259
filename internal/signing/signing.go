// Package signing is the workers' command signer. It holds a 24 h Ed25519
// worker key certified by the command-signing root, rotates it before it
// runs out, and signs the exact body bytes of every queued command, and
// every TimeStatementEvery a time statement that nodes take as a lower
// bound on the time. It is the only package that can produce a command or
// time signature; the gateway never imports it (a test in package gateway
// checks).
package signing

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Worker key lifetimes: a key is certified for KeyLifetime and replaced
// once less than RotateBefore of it is left.
const (
	KeyLifetime  = 24 * time.Hour
	RotateBefore = 12 * time.Hour
)

// Signer signs queued commands with the current worker key.
type Signer struct {
	db          *store.DB
	commands    *commands.Store
	clk         clock.Clock
	kek         pki.KEK
	root        *x509.Certificate
	rootKey     ed25519.PrivateKey
	trustDomain string
	bus         *bus.Bus
	batches     BatchGate
	log         *slog.Logger

	// timeMu serialises time statements; lastTime is when this signer
	// last signed one (by its clock).
	timeMu   sync.Mutex
	lastTime time.Time
	// keyMu serialises making a worker key, so two callers that both find
	// none (the signing loop and a ticket, at start) make one, not two.
	keyMu sync.Mutex
}

// BatchGate tells the signer whether a batch has its quorum; the quorum
// module implements it. A batched command is signed only then, so a
// command of an unapproved batch never leaves the queue.
type BatchGate interface {
	Approved(ctx context.Context, batchID string) (bool, error)
}

// Deps are the signer's dependencies; every field is required (New panics
// on a missing one; KEK and TrustDomain are values the PKI bundle gives).
type Deps struct {
	// DB holds the signer's own tables (worker_keys, time_statements).
	DB *store.DB
	// Commands is the commands table: the signer reads the unsigned
	// commands and stores their signatures through it.
	Commands *commands.Store
	Clock    clock.Clock
	KEK      pki.KEK
	// Root and RootKey are the command-signing root that certifies the
	// worker keys.
	Root        *x509.Certificate
	RootKey     ed25519.PrivateKey
	TrustDomain string
	Bus         *bus.Bus
	// Batches is the quorum module: a batched command is signed only once
	// its batch is approved.
	Batches BatchGate
	Log     *slog.Logger
}

// New returns a signer. It panics when a required dependency is missing:
// that is a wiring error, never a state to run in.
func New(d Deps) *Signer {
	switch {
	case d.DB == nil:
		panic("signing: New needs Deps.DB")
	case d.Commands == nil:
		panic("signing: New needs Deps.Commands")
	case d.Clock == nil:
		panic("signing: New needs Deps.Clock")
	case d.Root == nil || len(d.RootKey) != ed25519.PrivateKeySize:
		panic("signing: New needs the command-signing root and its key")
	case d.Bus == nil:
		panic("signing: New needs Deps.Bus")
	case d.Batches == nil:
		panic("signing: New needs Deps.Batches")
	case d.Log == nil:
		panic("signing: New needs Deps.Log")
	}
	return &Signer{db: d.DB, commands: d.Commands, clk: d.Clock, kek: d.KEK, root: d.Root, rootKey: d.RootKey, trustDomain: d.TrustDomain,
		bus: d.Bus, batches: d.Batches, log: d.Log}
}

// workerKey is an unsealed worker key and its certificate.
type workerKey struct {
	id   string
	cert []byte
	key  ed25519.PrivateKey
}

func sealAAD(id string) []byte { return []byte("bc-worker-key/" + id) }

// CurrentKey returns the worker key in use, making and certifying a new one
// when none has at least RotateBefore left. Its id is returned for tests
// and operators; the private key stays sealed at rest.
func (s *Signer) CurrentKey(ctx context.Context) (string, error) {
	k, err := s.currentKey(ctx)
	if err != nil {
		return "", err
	}
	return k.id, nil
}

func (s *Signer) currentKey(ctx context.Context) (*workerKey, error) {
	k, err := s.storedKey(ctx)
	if k != nil || err != nil {
		return k, err
	}
	if s.rootKey == nil {
		return nil, ErrNoWorkerKey
	}
	s.keyMu.Lock()
	defer s.keyMu.Unlock()
	// Another caller may have made one while this one waited.
	if k, err := s.storedKey(ctx); k != nil || err != nil {
		return k, err
	}
	return s.newKey(ctx, s.clk.Now())
}

// storedKey returns the stored worker key with at least RotateBefore
// left, opened, or nil when there is none.
func (s *Signer) storedKey(ctx context.Context) (*workerKey, error) {
	now := s.clk.Now()
	stored, ok, err := readCurrentKey(ctx, s.db, now.Add(RotateBefore), s.root)
	if err != nil {
		return nil, err
	}
	if ok {
		raw, err := pki.Open(s.kek, stored.sealed, sealAAD(stored.id))
		if err != nil {
			return nil, fmt.Errorf("signing: open worker key %s: %w", stored.id, err)
		}
		if len(raw) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("signing: worker key %s has the wrong size", stored.id)
		}
		return &workerKey{id: stored.id, cert: stored.cert, key: ed25519.PrivateKey(raw)}, nil
	}
	return nil, nil
}

// ErrNoWorkerKey: a ticket signer (NewTicketSigner) found no current
// worker key; only the workers role makes one.
var ErrNoWorkerKey = errors.New("signing: no current worker key yet (the workers role makes one)")

// NewTicketSigner returns a signer for an api process without the
// workers role: it signs tickets (SignTicket) with the current worker key
// the workers made and stored, sealed under kek, and never makes one
// itself (it holds no command-signing root key). It signs no commands.
func NewTicketSigner(db *store.DB, clk clock.Clock, kek pki.KEK, root *x509.Certificate, trustDomain string, log *slog.Logger) *Signer {
	return &Signer{db: db, clk: clk, kek: kek, root: root, trustDomain: trustDomain, log: log}
}

// newKey makes, certifies, seals and stores a new worker key.
func (s *Signer) newKey(ctx context.Context, now time.Time) (*workerKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("signing: generate worker key: %w", err)
	}
	k := &workerKey{id: ids.New("wk"), key: priv}
	if k.cert, err = pki.IssueWorkerCert(s.root, s.rootKey, s.trustDomain, k.id, pub, KeyLifetime, now); err != nil {
		return nil, fmt.Errorf("signing: certify worker key: %w", err)
	}
	sealed, err := pki.Seal(s.kek, priv, sealAAD(k.id))
	if err != nil {
		return nil, fmt.Errorf("signing: seal worker key: %w", err)
	}
	if err := insertKey(ctx, s.db, storedKey{id: k.id, cert: k.cert, sealed: sealed}, now.Add(KeyLifetime), now); err != nil {
		return nil, err
	}
	s.log.Info("worker key rotated", "worker_key", k.id)
	return k, nil
}

// SignPending signs every queued, unsigned command and pokes the nodes'
// gateways, in batches of up to 1000. It returns how many it signed.
func (s *Signer) SignPending(ctx context.Context) (int, error) {
	total := 0
	for {
		n, more, err := s.signBatch(ctx)
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

// roundSize is how many commands one round of signing takes.
const roundSize = 1000

// signBatch signs up to roundSize commands: it reads the unsigned
// commands and their batches' approvals, decides which may be signed,
// signs them outside any transaction, then stores the signatures in one
// transaction and pokes the nodes' gateways. more reports whether another
// round may find work.
func (s *Signer) signBatch(ctx context.Context) (signed int, more bool, err error) {
	all, err := s.commands.Unsigned(ctx, roundSize)
	if err != nil {
		return 0, false, err
	}
	approved, err := s.approvals(ctx, all)
	if err != nil {
		return 0, false, err
	}
	todo := signable(all, approved)
	if len(todo) == 0 {
		return 0, false, nil
	}
	k, err := s.currentKey(ctx)
	if err != nil {
		return 0, false, err
	}
	now := s.clk.Now()
	sigs, err := signAll(k.key, todo, now)
	if err != nil {
		return 0, false, err
	}
	signedNodes, err := s.commands.StoreSignatures(ctx, sigs, k.cert, now)
	if err != nil {
		return 0, false, err
	}
	for _, id := range signedNodes {
		s.bus.Publish(bus.NodeTopic(id))
	}
	if len(signedNodes) > 0 {
		s.bus.Publish(bus.TopicSigned)
	}
	// Another round when this one was full and made progress (held batched
	// commands can fill a round without being signable).
	return len(signedNodes), len(all) == roundSize && len(signedNodes) > 0, nil
}

// approvals asks the quorum module, once per batch, whether each batch
// that commands of all belong to is approved.
func (s *Signer) approvals(ctx context.Context, all []commands.Unsigned) (map[string]bool, error) {
	out := map[string]bool{}
	for _, u := range all {
		if u.BatchID == "" {
			continue
		}
		if _, asked := out[u.BatchID]; asked {
			continue
		}
		ok, err := s.batches.Approved(ctx, u.BatchID)
		if err != nil {
			return nil, fmt.Errorf("signing: batch state: %w", err)
		}
		out[u.BatchID] = ok
	}
	return out, nil
}

// signable returns the commands of all that may be signed now: those of
// no batch, and those whose batch is approved. A batched command waits,
// unsigned, until its batch has its quorum; the batch id goes into the
// signed body, so the gateway can neither detach nor swap it.
func signable(all []commands.Unsigned, approved map[string]bool) []commands.Unsigned {
	var out []commands.Unsigned
	for _, u := range all {
		if u.BatchID == "" || approved[u.BatchID] {
			out = append(out, u)
		}
	}
	return out
}

// commandBody is the body a worker signs for u, issued at now with nonce.
func commandBody(u commands.Unsigned, now time.Time, nonce string) *nodev1.CommandBody {
	return &nodev1.CommandBody{CommandId: u.ID, NodeId: u.NodeID, Kind: u.Kind, Payload: u.Payload, ExpiresAtMs: u.ExpiresAtMs,
		BatchId: u.BatchID, IssuedAtMs: now.UnixMilli(), Nonce: nonce}
}

// signAll encodes and signs the body of each command of todo with key,
// spread over the CPUs (the signatures are independent).
func signAll(key ed25519.PrivateKey, todo []commands.Unsigned, now time.Time) ([]commands.Signature, error) {
	sigs := make([]commands.Signature, len(todo))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i := range todo {
		g.Go(func() error {
			body, err := proto.MarshalOptions{Deterministic: true}.Marshal(commandBody(todo[i], now, ids.Secret(12)))
			if err != nil {
				return fmt.Errorf("signing: encode body: %w", err)
			}
			sigs[i] = commands.Signature{CommandID: todo[i].ID, Body: body, Sig: ed25519.Sign(key, append([]byte(wire.CommandSigContext), body...))}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return sigs, nil
}

// Run signs on every poke and at least every interval until ctx ends, and
// signs a fresh time statement once TimeStatementEvery has passed since
// the last one (by the signer's clock).
func (s *Signer) Run(ctx context.Context, interval time.Duration) {
	poke, stop := s.bus.Subscribe(bus.TopicSign)
	defer stop()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := s.SignPending(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("sign pending commands", "err", err)
		}
		if err := s.signTimeIfDue(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("sign time statement", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-poke:
		case <-t.C:
		}
	}
}

// TimeStatementEvery is how often the workers sign a fresh time statement.
// A node takes the latest one as a lower bound on the time (it may be this
// old by the time the node reads it, never newer than the truth).
const TimeStatementEvery = 10 * time.Second

// SignTime signs a time statement (the signer's clock now, a nonce, the
// trust domain) with the current worker key and stores it as the latest,
// unless a newer one is stored already. It returns the statement signed.
func (s *Signer) SignTime(ctx context.Context) (*nodev1.SignedTimeStatement, error) {
	s.timeMu.Lock()
	defer s.timeMu.Unlock()
	return s.signTimeLocked(ctx)
}

// signTimeIfDue signs a time statement when none was signed yet or
// TimeStatementEvery has passed since the last one.
func (s *Signer) signTimeIfDue(ctx context.Context) error {
	s.timeMu.Lock()
	defer s.timeMu.Unlock()
	if !s.lastTime.IsZero() && s.clk.Now().Before(s.lastTime.Add(TimeStatementEvery)) {
		return nil
	}
	_, err := s.signTimeLocked(ctx)
	return err
}

func (s *Signer) signTimeLocked(ctx context.Context) (*nodev1.SignedTimeStatement, error) {
	k, err := s.currentKey(ctx)
	if err != nil {
		return nil, err
	}
	now := s.clk.Now()
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(&nodev1.TimeStatement{
		ServerTimeMs: now.UnixMilli(), Nonce: ids.Secret(12), TrustDomain: s.trustDomain})
	if err != nil {
		return nil, fmt.Errorf("signing: encode time statement: %w", err)
	}
	st := &nodev1.SignedTimeStatement{Body: body, Signature: ed25519.Sign(k.key, append([]byte(wire.TimeSigContext), body...)), SignerCertDer: k.cert}
	if err := storeTime(ctx, s.db, st, now); err != nil {
		return nil, err
	}
	s.lastTime = now
	return st, nil
}
