package bastions

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// HostAddr is the control plane's own address in every bastion's tunnel.
var HostAddr = netip.AddrFrom4([4]byte{100, 100, 0, 1})

// TunnelRange is where bastions' tunnel addresses are allocated from
// (100.100.0.0 and HostAddr are never handed out).
var TunnelRange = netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 100, 0, 0}), 16)

// Tunnel is what a bastion is told at its hello: its own tunnel address,
// the control plane's (HostAddr), the note verifier key of the grant key it
// pins, and the control plane's WireGuard public key (base64), its one peer.
type Tunnel struct {
	BastionAddr    string
	HostAddr       string
	GrantVerifyKey string
	HostPublicKey  string
}

// Peer is a paired bastion that said hello, as the control plane's
// WireGuard end configures it: its key and its one allowed address.
type Peer struct {
	BastionID string
	PublicKey wgtun.Key
	Addr      netip.Addr
}

// row is one bastions row.
type row struct {
	id, tenant, name, state string
	wgKey, addr             sql.NullString
	createdAt               int64
	unpairedAt              sql.NullInt64
}

// querier is a *sql.DB or *sql.Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// readRow reads bastion id's row (sql.ErrNoRows when it has none).
func (s *Service) readRow(ctx context.Context, q querier, id string) (row, error) {
	var r row
	err := q.QueryRowContext(ctx, sqlBastionRow, id).Scan(&r.id, &r.tenant, &r.name, &r.wgKey, &r.addr, &r.state, &r.createdAt, &r.unpairedAt)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("bastions: read bastion: %w", err)
	}
	return r, err
}

// parsePublicKey parses a bastion's WireGuard public key, refusing a
// malformed or all-zero one (ReasonWGKeyMalformed).
func parsePublicKey(s string) (wgtun.Key, error) {
	k, err := wgtun.ParseKey(s)
	if err != nil || k == (wgtun.Key{}) || k.String() != s {
		return wgtun.Key{}, refuse(errs.InvalidInput, ReasonWGKeyMalformed, "")
	}
	return k, nil
}

// Fingerprint is a short, non-secret name of a WireGuard public key: the
// first 8 bytes of its SHA-256, in hex.
func Fingerprint(publicKey string) string {
	if publicKey == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(publicKey))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// Hello records bastionID's WireGuard public key (refreshing a changed
// one) and allocates its tunnel address at its first hello, once: the same
// address at every later hello. It refuses (ACCESS_DENIED) a node that is
// not a bastion, an unpaired bastion, and a key another bastion or the
// control plane holds; a malformed key is INVALID_INPUT. A new key or
// address is audited in the bastion's tenant.
func (s *Service) Hello(ctx context.Context, bastionID, wgPublicKey string) (Tunnel, error) {
	key, err := parsePublicKey(wgPublicKey)
	if err != nil {
		return Tunnel{}, err
	}
	hostPub, err := s.publicKey(ctx, keyLanes)
	if err != nil {
		return Tunnel{}, err
	}
	if key.String() == hostPub {
		return Tunnel{}, refuse(errs.AccessDenied, ReasonWGKeyInUse, "")
	}
	verify, err := s.publicKey(ctx, keyGrant)
	if err != nil {
		return Tunnel{}, err
	}
	if _, err := s.adopt(ctx, bastionID, errs.AccessDenied); err != nil {
		return Tunnel{}, err
	}
	var addr netip.Addr
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		addr, err = s.recordHello(ctx, tx, bastionID, key.String())
		return err
	})
	if store.IsUniqueViolation(err) {
		// Another bastion's key (the addresses are allocated serially).
		return Tunnel{}, refuse(errs.AccessDenied, ReasonWGKeyInUse, "")
	}
	if err != nil {
		return Tunnel{}, err
	}
	return Tunnel{BastionAddr: addr.String(), HostAddr: HostAddr.String(), GrantVerifyKey: verify, HostPublicKey: hostPub}, nil
}

// recordHello is Hello's transaction: it checks the row, allocates the
// address when it has none and records the key, with an audit row when
// either changed.
func (s *Service) recordHello(ctx context.Context, tx *sql.Tx, id, key string) (netip.Addr, error) {
	if err := s.lockAddrs(ctx, tx); err != nil {
		return netip.Addr{}, err
	}
	r, err := s.readRow(ctx, tx, id)
	if err != nil {
		return netip.Addr{}, err
	}
	if r.state != StatePaired {
		return netip.Addr{}, refuse(errs.AccessDenied, ReasonUnpaired, "")
	}
	addr, fresh, err := s.address(ctx, tx, r)
	if err != nil {
		return netip.Addr{}, err
	}
	if !fresh && r.wgKey.String == key {
		return addr, nil
	}
	if _, err := tx.ExecContext(ctx, sqlSetTunnel, key, addr.String(), id); err != nil {
		return netip.Addr{}, fmt.Errorf("bastions: record hello: %w", err)
	}
	now := s.clk.Now()
	return addr, audit.Record(ctx, tx, now, audit.Entry{TenantID: r.tenant, Actor: "node/" + id, Action: "compute:bastions:hello",
		Resource: "bastion/" + id, Outcome: "allowed",
		Details: map[string]any{"tunnel_addr": addr.String(), "wg_key": Fingerprint(key), "key_changed": r.wgKey.Valid && r.wgKey.String != key}})
}

// addrLockClass is the first key of the PostgreSQL advisory lock that
// serialises address allocation (the second is 0).
const addrLockClass = 0xba57

// lockAddrs serialises allocations until tx ends: on PostgreSQL with a
// transaction-scoped advisory lock; SQLite's one writer is already serial.
func (s *Service) lockAddrs(ctx context.Context, tx *sql.Tx) error {
	if s.db.Dialect != store.Postgres {
		return nil
	}
	if _, err := tx.ExecContext(ctx, sqlLockAddrs, addrLockClass); err != nil {
		return fmt.Errorf("bastions: lock addresses: %w", err)
	}
	return nil
}

// address returns r's tunnel address, allocating the lowest free one when
// it has none (fresh true).
func (s *Service) address(ctx context.Context, tx *sql.Tx, r row) (netip.Addr, bool, error) {
	if r.addr.Valid {
		a, err := netip.ParseAddr(r.addr.String)
		if err != nil || !Allocatable(a) {
			return netip.Addr{}, false, fmt.Errorf("bastions: stored tunnel address of %s is not one this module allocates", r.id)
		}
		return a, false, nil
	}
	rows, err := tx.QueryContext(ctx, sqlUsedAddrs)
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("bastions: read addresses: %w", err)
	}
	defer rows.Close()
	used := map[netip.Addr]bool{}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return netip.Addr{}, false, fmt.Errorf("bastions: read addresses: %w", err)
		}
		if a, err := netip.ParseAddr(s); err == nil {
			used[a] = true
		}
	}
	if err := rows.Err(); err != nil {
		return netip.Addr{}, false, fmt.Errorf("bastions: read addresses: %w", err)
	}
	a, ok := Allocate(used)
	if !ok {
		return netip.Addr{}, false, refuse(errs.Unavailable, ReasonNoAddress, "")
	}
	return a, true, nil
}

// Allocatable reports whether a is an address a bastion may hold: in
// TunnelRange, neither its first address nor HostAddr nor its last.
func Allocatable(a netip.Addr) bool {
	if !a.Is4() || !TunnelRange.Contains(a) {
		return false
	}
	b := a.As4()
	return a != HostAddr && a != TunnelRange.Addr() && !(b[2] == 255 && b[3] == 255)
}

// Allocate returns the lowest allocatable address not in used (false when
// every one is). It is pure: the caller holds the allocation lock.
func Allocate(used map[netip.Addr]bool) (netip.Addr, bool) {
	for a := HostAddr.Next(); TunnelRange.Contains(a); a = a.Next() {
		if Allocatable(a) && !used[a] {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// Peers returns the paired bastions that said hello and are still live
// nodes, with their keys and addresses, for the control plane's WireGuard
// end. A row whose key or address does not parse is left out and logged.
func (s *Service) Peers(ctx context.Context) ([]Peer, error) {
	rows, err := s.db.QueryContext(ctx, sqlPeers)
	if err != nil {
		return nil, fmt.Errorf("bastions: read peers: %w", err)
	}
	defer rows.Close()
	var out []Peer
	var ids []string
	for rows.Next() {
		var id, key, addr string
		if err := rows.Scan(&id, &key, &addr); err != nil {
			return nil, fmt.Errorf("bastions: read peers: %w", err)
		}
		k, kerr := parsePublicKey(key)
		a, aerr := netip.ParseAddr(addr)
		if kerr != nil || aerr != nil || !Allocatable(a) {
			s.log.Warn("bastion peer row does not parse; left out", "bastion", id)
			continue
		}
		out = append(out, Peer{BastionID: id, PublicKey: k, Addr: a})
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("bastions: read peers: %w", err)
	}
	return s.liveOnly(ctx, out, ids)
}

// liveOnly keeps the peers that are still live bastion nodes (a deleted
// node's bastion has no tunnel).
func (s *Service) liveOnly(ctx context.Context, ps []Peer, ids []string) ([]Peer, error) {
	tr, err := s.nodes.TenantRoles(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("bastions: read nodes: %w", err)
	}
	out := ps[:0]
	for _, p := range ps {
		if n, ok := tr[p.BastionID]; ok && n.Role == pki.RoleBastion {
			out = append(out, p)
		}
	}
	return out, nil
}
