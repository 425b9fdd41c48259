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
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"time"

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
}

// BatchGate tells the signer whether a batch has its quorum; the quorum
// module implements it. A batched command is signed only then, so a
// command of an unapproved batch never leaves the queue.
type BatchGate interface {
	Approved(ctx context.Context, batchID string) (bool, error)
}

// HoldBatchesUntilApproved connects the quorum module; call it before Run.
// Without it the signer signs no batched command.
func (s *Signer) HoldBatchesUntilApproved(g BatchGate) { s.batches = g }

// New returns a signer. rootKey is the command-signing root's private key.
func New(db *store.DB, clk clock.Clock, kek pki.KEK, root *x509.Certificate, rootKey ed25519.PrivateKey, trustDomain string, b *bus.Bus, log *slog.Logger) *Signer {
	return &Signer{db: db, clk: clk, kek: kek, root: root, rootKey: rootKey, trustDomain: trustDomain, bus: b, log: log}
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
	now := s.clk.Now()
	var k workerKey
	var sealed []byte
	err := s.db.QueryRowContext(ctx, `SELECT id, cert_der, sealed_key FROM worker_keys WHERE not_after > $1 ORDER BY not_after DESC LIMIT 1`,
		now.Add(RotateBefore).UnixMilli()).Scan(&k.id, &k.cert, &sealed)
	if err == nil {
		raw, err := pki.Open(s.kek, sealed, sealAAD(k.id))
		if err != nil {
			return nil, fmt.Errorf("signing: open worker key %s: %w", k.id, err)
		}
		if len(raw) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("signing: worker key %s has the wrong size", k.id)
		}
		k.key = ed25519.PrivateKey(raw)
		return &k, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("signing: read worker key: %w", err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("signing: generate worker key: %w", err)
	}
	k.id = ids.New("wk")
	k.key = priv
	if k.cert, err = pki.IssueWorkerCert(s.root, s.rootKey, s.trustDomain, k.id, pub, KeyLifetime, now); err != nil {
		return nil, fmt.Errorf("signing: certify worker key: %w", err)
	}
	if sealed, err = pki.Seal(s.kek, priv, sealAAD(k.id)); err != nil {
		return nil, fmt.Errorf("signing: seal worker key: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO worker_keys (id, cert_der, sealed_key, not_after, created_at) VALUES ($1, $2, $3, $4, $5)`,
		k.id, k.cert, sealed, now.Add(KeyLifetime).UnixMilli(), now.UnixMilli()); err != nil {
		return nil, fmt.Errorf("signing: store worker key: %w", err)
	}
	s.log.Info("worker key rotated", "worker_key", k.id)
	return &k, nil
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

// signBatch signs up to 1000 commands in one transaction.
func (s *Signer) signBatch(ctx context.Context) (int, bool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, node_id, kind, payload, expires_at, batch_id FROM commands WHERE state = $1 AND body IS NULL ORDER BY created_at LIMIT 1000`,
		commands.StateQueued)
	if err != nil {
		return 0, false, fmt.Errorf("signing: list unsigned: %w", err)
	}
	var all []*nodev1.CommandBody
	for rows.Next() {
		b := &nodev1.CommandBody{}
		var batch sql.NullString
		if err := rows.Scan(&b.CommandId, &b.NodeId, &b.Kind, &b.Payload, &b.ExpiresAtMs, &batch); err != nil {
			rows.Close()
			return 0, false, fmt.Errorf("signing: scan unsigned: %w", err)
		}
		b.BatchId = batch.String
		all = append(all, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("signing: list unsigned: %w", err)
	}
	// A batched command waits, unsigned, until its batch has its quorum;
	// the batch id goes into the signed body, so the gateway can neither
	// detach nor swap it.
	var todo []*nodev1.CommandBody
	for _, b := range all {
		if b.BatchId != "" {
			if s.batches == nil {
				continue
			}
			ok, err := s.batches.Approved(ctx, b.BatchId)
			if err != nil {
				return 0, false, fmt.Errorf("signing: batch state: %w", err)
			}
			if !ok {
				continue
			}
		}
		todo = append(todo, b)
	}
	if len(todo) == 0 {
		return 0, false, nil
	}
	k, err := s.currentKey(ctx)
	if err != nil {
		return 0, false, err
	}
	now := s.clk.Now()
	// Encode and sign outside the transaction, spread over the CPUs: the
	// signatures are independent, and the transaction then only writes.
	bodies, sigs := make([][]byte, len(todo)), make([][]byte, len(todo))
	workers := min(runtime.GOMAXPROCS(0), len(todo))
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for i := w; i < len(todo); i += workers {
				b := todo[i]
				b.IssuedAtMs = now.UnixMilli()
				b.Nonce = ids.Secret(12)
				body, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
				if err != nil {
					errc <- fmt.Errorf("signing: encode body: %w", err)
					return
				}
				bodies[i], sigs[i] = body, ed25519.Sign(k.key, append([]byte(commands.CommandSigContext), body...))
			}
			errc <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if e := <-errc; e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		return 0, false, err
	}
	var signedNodes []string
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		signedNodes = signedNodes[:0]
		// One statement per 200 commands: a round trip per command costs
		// PostgreSQL far more than the write itself.
		const perStmt = 200
		for start := 0; start < len(todo); start += perStmt {
			end := min(start+perStmt, len(todo))
			a := s.db.NewArgs()
			var q strings.Builder
			q.WriteString(`WITH v(id, body, sig) AS (VALUES `)
			for i := start; i < end; i++ {
				if i > start {
					q.WriteString(", ")
				}
				q.WriteString("(" + a.Typed(todo[i].CommandId, "text") + ", " + a.Typed(bodies[i], "bytea") + ", " + a.Typed(sigs[i], "bytea") + ")")
			}
			q.WriteString(`) UPDATE commands SET body = v.body, signature = v.sig, signer_cert = ` + a.Typed(k.cert, "bytea") + `, updated_at = ` + a.Add(now.UnixMilli()) +
				` FROM v WHERE commands.id = v.id AND commands.body IS NULL AND commands.state = ` + a.Add(commands.StateQueued) + ` RETURNING commands.node_id`)
			rows, err := tx.QueryContext(ctx, q.String(), a.Values()...)
			if err != nil {
				return fmt.Errorf("signing: store signatures: %w", err)
			}
			for rows.Next() {
				var node string
				if err := rows.Scan(&node); err != nil {
					rows.Close()
					return fmt.Errorf("signing: store signatures: %w", err)
				}
				signedNodes = append(signedNodes, node)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("signing: store signatures: %w", err)
			}
		}
		return nil
	})
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
	return len(signedNodes), len(all) == 1000 && len(signedNodes) > 0, nil
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
	if _, err := s.db.ExecContext(ctx, `INSERT INTO time_statements (id, body, signature, signer_cert, time_ms) VALUES ('latest', $1, $2, $3, $4)
		ON CONFLICT (id) DO UPDATE SET body = excluded.body, signature = excluded.signature, signer_cert = excluded.signer_cert, time_ms = excluded.time_ms
		WHERE time_statements.time_ms < excluded.time_ms`, st.Body, st.Signature, st.SignerCertDer, now.UnixMilli()); err != nil {
		return nil, fmt.Errorf("signing: store time statement: %w", err)
	}
	s.lastTime = now
	return st, nil
}

// LatestTimeStatement returns the newest stored time statement, or nil
// when the workers have signed none yet. It reads only signed bytes, so
// a process without keys (the gateway's services) can relay it.
func LatestTimeStatement(ctx context.Context, db *store.DB) (*nodev1.SignedTimeStatement, error) {
	st := &nodev1.SignedTimeStatement{}
	err := db.QueryRowContext(ctx, `SELECT body, signature, signer_cert FROM time_statements WHERE id = 'latest'`).Scan(&st.Body, &st.Signature, &st.SignerCertDer)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("signing: read time statement: %w", err)
	}
	return st, nil
}
