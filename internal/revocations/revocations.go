// Package revocations is the one revocation feed: every revocation of a
// node certificate, an SSH certificate, an API key, a session, an
// identity or a ticket is an entry with a sequence number, written by
// AppendTx in the revoking transaction itself, so that an entry exists
// exactly when its revocation committed. Numbers are gapless and in commit
// order: a follower that read up to N never later finds a smaller one.
//
// The workers sign each entry (revwire.SigContext, the worker key, as
// they sign commands) and poke the followers: every gateway, which closes
// the sessions of revoked node certificates and relays a node's own
// entries to it, and every api process, which closes the tunnels of
// revoked credentials. A revocation never waits for a signature: it
// commits unsigned, and what needs the signature (a node) gets the entry
// once it is signed.
package revocations

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Entry is one entry of the feed (revwire.Entry).
type Entry = revwire.Entry

// AppendTx appends entries to the feed inside tx, the transaction of the
// revocation they record, numbering them after every entry committed
// before; Seq, Signed are ignored. It takes the feed's counter row, which
// every other revoker then waits for until tx ends: call it last in tx,
// after the revocation's own writes, so that a transaction holding the
// counter never waits for another lock (no deadlock between revokers).
// Nothing is appended when entries is empty.
func AppendTx(ctx context.Context, tx *sql.Tx, entries ...Entry) error {
	if len(entries) == 0 {
		return nil
	}
	var last int64
	if err := tx.QueryRowContext(ctx, sqlTakeSeq, len(entries)).Scan(&last); err != nil {
		return fmt.Errorf("revocations: take sequence numbers: %w", err)
	}
	first := last - int64(len(entries)) + 1
	for i, e := range entries {
		if e.Kind == "" || e.Subject == "" {
			return fmt.Errorf("revocations: an entry needs a kind and a subject")
		}
		if _, err := tx.ExecContext(ctx, sqlInsert, first+int64(i), e.Kind, e.Subject, e.TenantID, e.NodeID, e.At.UnixMilli(), e.Reason, int64(e.Generation)); err != nil {
			return fmt.Errorf("revocations: append: %w", err)
		}
	}
	return nil
}

// Feed reads the feed and signs its entries.
type Feed struct {
	db  *store.DB
	clk clock.Clock
	bus *bus.Bus
	log *slog.Logger
}

// New returns the feed on db; b carries its pokes.
func New(db *store.DB, clk clock.Clock, b *bus.Bus, log *slog.Logger) *Feed {
	return &Feed{db: db, clk: clk, bus: b, log: log}
}

// Since returns the entries after seq after, in feed order, at most limit,
// signed or not.
func (f *Feed) Since(ctx context.Context, after int64, limit int) ([]Entry, error) {
	return f.query(ctx, sqlSince, after, limit)
}

// SignedSince returns the entries after seq after, in feed order, at most
// limit, up to the first that is not signed yet (a follower that relays
// signatures resumes there once it is).
func (f *Feed) SignedSince(ctx context.Context, after int64, limit int) ([]Entry, error) {
	all, err := f.Since(ctx, after, limit)
	if err != nil {
		return nil, err
	}
	for i, e := range all {
		if e.Signed == nil {
			return all[:i], nil
		}
	}
	return all, nil
}

// ForNode returns the signed entries naming nodeID at or after since, the
// newest limit of them, in feed order: what a gateway sends a node whose
// session opens (revwire.NodeWindow).
func (f *Feed) ForNode(ctx context.Context, nodeID string, since time.Time, limit int) ([]Entry, error) {
	out, err := f.query(ctx, sqlForNode, nodeID, since.UnixMilli(), limit)
	if err != nil {
		return nil, err
	}
	slices.Reverse(out)
	return out, nil
}

// Head returns the last sequence number committed (0: none yet).
func (f *Feed) Head(ctx context.Context) (int64, error) {
	var n int64
	if err := f.db.QueryRowContext(ctx, sqlHead).Scan(&n); err != nil {
		return 0, fmt.Errorf("revocations: head: %w", err)
	}
	return n, nil
}

// List returns the entries after after, at most limit, in feed order:
// every entry when all (the root tenant's view), else only tenant's. The
// caller decides all from its scope (this module cannot import iam, which
// revokes through apikeys).
func (f *Feed) List(ctx context.Context, tenant string, all bool, after int64, limit int) ([]Entry, error) {
	if all {
		return f.Since(ctx, after, limit)
	}
	return f.query(ctx, sqlListTenant, after, limit, tenant)
}

func (f *Feed) query(ctx context.Context, q string, args ...any) ([]Entry, error) {
	rows, err := f.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("revocations: read: %w", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		var e Entry
		var at, gen int64
		var body, sig, cert []byte
		if err := rows.Scan(&e.Seq, &e.Kind, &e.Subject, &e.TenantID, &e.NodeID, &at, &e.Reason, &gen, &body, &sig, &cert); err != nil {
			return nil, fmt.Errorf("revocations: scan: %w", err)
		}
		e.At, e.Generation = time.UnixMilli(at).UTC(), uint64(gen)
		if len(sig) > 0 {
			e.Signed = &nodev1.SignedRevocation{Body: body, Signature: sig, SignerCertDer: cert}
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("revocations: read: %w", err)
	}
	return out, nil
}

// Signer signs a body with the current worker key (signing.Signer).
type Signer interface {
	SignRevocation(ctx context.Context, body *nodev1.RevocationBody) (*nodev1.SignedRevocation, error)
}

// signRound is how many entries one round of signing takes.
const signRound = 500

// SignPending signs every unsigned entry with s, each body naming
// deployment and trustDomain, and pokes the followers when it signed any.
// It returns how many it signed.
func (f *Feed) SignPending(ctx context.Context, s Signer, deployment, trustDomain string) (int, error) {
	total := 0
	for {
		todo, err := f.query(ctx, sqlUnsigned, signRound)
		if err != nil || len(todo) == 0 {
			return total, err
		}
		for _, e := range todo {
			sr, err := s.SignRevocation(ctx, revwire.Body(e, deployment, trustDomain))
			if err != nil {
				return total, fmt.Errorf("revocations: sign entry %d: %w", e.Seq, err)
			}
			if _, err := f.db.ExecContext(ctx, sqlSign, sr.Body, sr.Signature, sr.SignerCertDer, e.Seq); err != nil {
				return total, fmt.Errorf("revocations: store signature: %w", err)
			}
			total++
		}
		f.bus.Publish(bus.TopicRevocationsSigned)
		if len(todo) < signRound {
			return total, nil
		}
	}
}

// RunSigner signs pending entries on every revocation poke (this process's
// or, on PostgreSQL, another's) and at least every interval, until ctx
// ends. It runs in the workers role.
func (f *Feed) RunSigner(ctx context.Context, s Signer, deployment, trustDomain string, interval time.Duration) {
	local, stop := f.bus.Subscribe(bus.TopicRevoked)
	defer stop()
	remote, stopRemote := f.bus.Subscribe(bus.RemoteTopic(bus.TopicRevoked))
	defer stopRemote()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := f.SignPending(ctx, s, deployment, trustDomain); err != nil && ctx.Err() == nil {
			f.log.Error("sign revocations", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-local:
		case <-remote:
		case <-t.C:
		}
	}
}

// Follow calls fn with the entries after the head of the feed as they
// commit, in feed order, never skipping one, until ctx ends: it reads
// `seq > last` on every revocation poke (local or remote) and at least
// every poll. The api role follows it to close tunnels.
func (f *Feed) Follow(ctx context.Context, poll time.Duration, fn func([]Entry)) error {
	last, err := f.Head(ctx)
	if err != nil {
		return err
	}
	local, stop := f.bus.Subscribe(bus.TopicRevoked)
	defer stop()
	remote, stopRemote := f.bus.Subscribe(bus.RemoteTopic(bus.TopicRevoked))
	defer stopRemote()
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-local:
		case <-remote:
		case <-t.C:
		}
		for {
			batch, err := f.Since(ctx, last, signRound)
			if err != nil {
				if ctx.Err() == nil {
					f.log.Error("follow revocations", "err", err)
				}
				break
			}
			if len(batch) == 0 {
				break
			}
			fn(batch)
			last = batch[len(batch)-1].Seq
		}
	}
}
