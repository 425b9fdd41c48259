package auditlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/transparency-dev/merkle/compact"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/store"
)

// The auditlog module owns the audit_checkpoints, audit_log_nodes,
// audit_log_state and audit_sink_cursors tables; this file holds every
// statement it runs on them and their row codecs. The audit rows
// themselves (audit_events) are package audit's: the log reads and
// numbers them through audit's API.

const (
	qInitState = `INSERT INTO audit_log_state (tenant_id, size, compact, updated_at) VALUES ($1, 0, $2, $3) ON CONFLICT (tenant_id) DO NOTHING`
	// qState is the read that, with qLockSuffix on PostgreSQL, serialises
	// the sealers of a tenant.
	qState       = `SELECT size, compact FROM audit_log_state WHERE tenant_id = $1`
	qLockSuffix  = ` FOR UPDATE`
	qStateSize   = `SELECT size FROM audit_log_state WHERE tenant_id = $1`
	qStateSizes  = `SELECT tenant_id, size FROM audit_log_state ORDER BY tenant_id`
	qUpdateState = `UPDATE audit_log_state SET size = $1, compact = $2, updated_at = $3 WHERE tenant_id = $4`

	qInsertCheckpoint  = `INSERT INTO audit_checkpoints (tenant_id, size, prev_size, note, consistency, created_at) VALUES ($1, $2, $3, $4, $5, $6)`
	qCheckpointAt      = `SELECT note FROM audit_checkpoints WHERE tenant_id = $1 AND size = $2`
	qCheckpointCovers  = `SELECT size, note FROM audit_checkpoints WHERE tenant_id = $1 AND size > $2 ORDER BY size DESC LIMIT 1`
	qCheckpointMaxSize = `SELECT MAX(size) FROM audit_checkpoints WHERE tenant_id = $1`
	qCheckpoints       = `SELECT size, prev_size, note, consistency FROM audit_checkpoints WHERE tenant_id = $1 ORDER BY size`

	qInsertNode  = `INSERT INTO audit_log_nodes (tenant_id, level, idx, hash, event_id) VALUES ($1, $2, $3, $4, $5)`
	qInsertNodes = `INSERT INTO audit_log_nodes (tenant_id, level, idx, hash, event_id) VALUES `
	// qNodeArm is one arm of fetchNodes' UNION ALL, completed with the
	// level's and index's placeholders.
	qNodeArm = "SELECT level, idx, hash FROM audit_log_nodes WHERE tenant_id = $1 AND level = $"
	qLeaves  = `SELECT idx, hash, event_id FROM audit_log_nodes WHERE tenant_id = $1 AND level = 0 AND idx >= $2 AND idx < $3`

	qSinkCursor    = `SELECT next_seq FROM audit_sink_cursors WHERE sink = $1 AND tenant_id = $2`
	qAdvanceCursor = `INSERT INTO audit_sink_cursors (sink, tenant_id, next_seq, updated_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (sink, tenant_id) DO UPDATE SET next_seq = excluded.next_seq, updated_at = excluded.updated_at`
	qCursorOnlyForward = ` WHERE audit_sink_cursors.next_seq < excluded.next_seq`
)

// Row is one audit row as it enters the log (package audit's row type).
// Every field is covered by the leaf hash: an edit to any of them changes
// the leaf.
type Row = audit.Row

// readCheckpoints reads the tenant's stored checkpoints in size order.
func (l *Log) readCheckpoints(ctx context.Context, q audit.Querier, tenant string) ([]storedCheckpoint, error) {
	rows, err := q.QueryContext(ctx, qCheckpoints, tenant)
	if err != nil {
		return nil, fmt.Errorf("auditlog: read checkpoints: %w", err)
	}
	defer rows.Close()
	var out []storedCheckpoint
	for rows.Next() {
		var c storedCheckpoint
		if err := rows.Scan(&c.size, &c.prev, &c.note, &c.cons); err != nil {
			return nil, fmt.Errorf("auditlog: read checkpoints: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// readLeaves reads the stored leaves with lo <= idx < hi, by event id.
func (l *Log) readLeaves(ctx context.Context, q audit.Querier, tenant string, lo, hi int64) (map[string]leaf, error) {
	rows, err := q.QueryContext(ctx, qLeaves, tenant, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("auditlog: read leaves: %w", err)
	}
	defer rows.Close()
	stored := map[string]leaf{}
	for rows.Next() {
		var lf leaf
		var ev string
		if err := rows.Scan(&lf.idx, &lf.hash, &ev); err != nil {
			return nil, fmt.Errorf("auditlog: read leaves: %w", err)
		}
		stored[ev] = lf
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("auditlog: read leaves: %w", err)
	}
	return stored, nil
}

// stateSize reads the tenant's log size per its state (0 when it has
// none).
func (l *Log) stateSize(ctx context.Context, q audit.Querier, tenant string) (int64, error) {
	var size int64
	err := q.QueryRowContext(ctx, qStateSize, tenant).Scan(&size)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("auditlog: read log state: %w", err)
	}
	return size, nil
}

const nodeChunk = 1000

func insertNodes(ctx context.Context, tx *sql.Tx, dialect store.Dialect, tenant string, nodes []nodeRec) error {
	if dialect == store.SQLite {
		// In-process SQLite: a prepared one-row insert is fastest (binding
		// $N names costs it time quadratic in a statement's parameters).
		st, err := tx.PrepareContext(ctx, qInsertNode)
		if err != nil {
			return fmt.Errorf("auditlog: store tree nodes: %w", err)
		}
		defer st.Close()
		for _, n := range nodes {
			if _, err := st.ExecContext(ctx, tenant, int64(n.level), int64(n.idx), n.hash, n.event); err != nil {
				return fmt.Errorf("auditlog: store tree nodes: %w", err)
			}
		}
		return nil
	}
	for start := 0; start < len(nodes); start += nodeChunk {
		part := nodes[start:min(start+nodeChunk, len(nodes))]
		var sb strings.Builder
		sb.WriteString(qInsertNodes)
		args := make([]any, 0, 1+4*len(part))
		args = append(args, tenant)
		for i, n := range part {
			if i > 0 {
				sb.WriteByte(',')
			}
			b := 4*i + 2
			sb.WriteString("($1,$" + strconv.Itoa(b) + ",$" + strconv.Itoa(b+1) + ",$" + strconv.Itoa(b+2) + ",$" + strconv.Itoa(b+3) + ")")
			args = append(args, int64(n.level), int64(n.idx), n.hash, n.event)
		}
		if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
			return fmt.Errorf("auditlog: store tree nodes: %w", err)
		}
	}
	return nil
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// fetchNodes reads the stored hashes of ids in one query, in the order of ids.
func fetchNodes(ctx context.Context, q queryer, tenant string, ids []compact.NodeID) ([][]byte, error) {
	if len(ids) == 0 {
		return [][]byte{}, nil
	}
	// One statement of primary-key point lookups: both planners use the
	// index for each arm, which they may not do for an OR of pairs.
	var sb strings.Builder
	args := []any{tenant}
	for i, id := range ids {
		if i > 0 {
			sb.WriteString(" UNION ALL ")
		}
		sb.WriteString(qNodeArm + strconv.Itoa(2*i+2) + " AND idx = $" + strconv.Itoa(2*i+3))
		args = append(args, int64(id.Level), int64(id.Index))
	}
	rows, err := q.QueryContext(ctx, sb.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("auditlog: read tree nodes: %w", err)
	}
	defer rows.Close()
	got := make(map[compact.NodeID][]byte, len(ids))
	for rows.Next() {
		var level, idx int64
		var h []byte
		if err := rows.Scan(&level, &idx, &h); err != nil {
			return nil, fmt.Errorf("auditlog: read tree nodes: %w", err)
		}
		got[compact.NewNodeID(uint(level), uint64(idx))] = h
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("auditlog: read tree nodes: %w", err)
	}
	out := make([][]byte, len(ids))
	for i, id := range ids {
		h, ok := got[id]
		if !ok || len(h) != HashSize {
			return nil, fmt.Errorf("%w: tree node (%d, %d) missing", ErrTampered, id.Level, id.Index)
		}
		out[i] = h
	}
	return out, nil
}
