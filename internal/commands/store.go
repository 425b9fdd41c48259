package commands

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/store"
)

// The commands table's SQL. It is the only SQL in the codebase that names
// the commands table; other modules read and write it through Store.
// States are never spelled in the text: they are arguments (wire.State).
const (
	// commandColumns are the columns of a Command, in scanCommand's order.
	commandColumns = `id, node_id, tenant_id, kind, payload, state, attested, result, reason, created_by, created_at, updated_at, expires_at, batch_id, fanout_id, late`

	sqlInsert = `INSERT INTO commands (id, tenant_id, node_id, kind, payload, state, created_by, created_at, updated_at, expires_at, batch_id, subject_tenant)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`
	// sqlInsertMany is followed by one parenthesised row per command.
	sqlInsertMany = `INSERT INTO commands (id, tenant_id, node_id, kind, payload, state, created_by, created_at, updated_at, expires_at, fanout_id) VALUES `
	// sqlFanoutStates is preceded by the caller's scope condition and
	// followed by the fan-out id: a fan-out's visible commands counted by
	// state.
	sqlFanoutStatesHead = `SELECT state, COUNT(*) FROM commands WHERE `
	sqlFanoutStatesMid  = ` AND fanout_id = `
	sqlFanoutStatesTail = ` GROUP BY state`
	// sqlCountInFlight counts the live commands of a top-level tenant ($1)
	// and every tenant under it; $2..$4 are the live states.
	sqlCountInFlight = `SELECT COUNT(*) FROM commands WHERE ` + quota.InSubtree + ` AND state IN ($2, $3, $4)`

	sqlSelect      = `SELECT ` + commandColumns + ` FROM commands `
	sqlByID        = sqlSelect + `WHERE id = $1`
	sqlTenantOf    = `SELECT tenant_id FROM commands WHERE id = $1`
	sqlPendingNode = `SELECT DISTINCT node_id FROM commands WHERE state = $1 AND body IS NOT NULL`
	// sqlPendingFor is built as: head, state, mid, node ids, rn, tail.
	sqlPendingForHead = `SELECT node_id, id, body, signature, signer_cert, kind, payload, batch_id FROM (
			SELECT node_id, id, body, signature, signer_cert, kind, payload, batch_id,
				ROW_NUMBER() OVER (PARTITION BY node_id ORDER BY created_at, id) AS rn
			FROM commands WHERE state = `
	sqlPendingForMid = ` AND body IS NOT NULL AND node_id IN (`
	sqlPendingForRn  = `)) q
			WHERE rn <= `
	sqlPendingForTail = ` ORDER BY node_id, rn`
	// sqlMarkSent is built as: set, sent, at, now, session, one "WHEN id
	// THEN session" per command, where, queued, ids, ")".
	sqlMarkSentSet     = `UPDATE commands SET state = `
	sqlMarkSentAt      = `, updated_at = `
	sqlMarkSentSession = `, sent_session = CASE id`
	sqlMarkSentWhere   = ` END WHERE state = `
	sqlMarkSentIDs     = ` AND id IN (`
	// sqlRequeue is built as: set, queued, at, now, where, sent, expiry,
	// now, then one of the two tails: the sent commands of ended sessions
	// (followed by their ids and ")"), or a node's sent commands not sent
	// on its current session ($ node, $ session). Only a command still sent
	// (no update from its node) and not expired moves: a cancelled,
	// expired, running or finished one never does. It keeps sent_session:
	// a queued command with a session was delivered once and its node may
	// have it, so the sweep gives it a sent command's grace and Cancel
	// refuses it.
	sqlRequeueSet      = `UPDATE commands SET state = `
	sqlRequeueAt       = `, updated_at = `
	sqlRequeueWhere    = ` WHERE state = `
	sqlRequeueExpiry   = ` AND expires_at > `
	sqlRequeueSessions = ` AND sent_session IN (`
	sqlRequeueNode     = ` AND node_id = `
	sqlRequeueOther    = ` AND (sent_session IS NULL OR sent_session <> `

	sqlStateOf = `SELECT state FROM commands WHERE id = $1 AND node_id = $2`
	// sqlLockIDs is followed by ids, ")", sqlLockOrder and the dialect's
	// lock clause: it locks the named rows in id order.
	sqlLockIDs   = `SELECT id FROM commands WHERE id IN (`
	sqlLockOrder = ` ORDER BY id`
	// sqlExpiring is sqlSweep's condition as a SELECT, followed by
	// sqlLockOrder and the lock clause.
	sqlExpiring   = `SELECT id FROM commands WHERE (state = $1 AND sent_session IS NULL AND expires_at < $2) OR (state IN ($3, $4) AND expires_at < $5)`
	sqlBindings   = `SELECT id, node_id, kind, payload FROM commands WHERE id IN (`
	sqlUnfinished = `SELECT id, kind FROM commands WHERE node_id = $1 AND state IN ($2, $3, $4)`
	sqlCancel     = `UPDATE commands SET state = $1, reason = $2, updated_at = $3 WHERE id = $4 AND state IN ($5, $6, $7)`
	// sqlSweepHead is followed by sqlSweep's arguments' placeholders in
	// its order, then the ids and ")": queued commands never sent expired
	// before now, and sent ones, or queued again after a delivery, expired
	// before the sent grace.
	sqlSweepHead   = `UPDATE commands SET state = `
	sqlSweepSet    = `, reason = `
	sqlSweepAt     = `, updated_at = `
	sqlSweepCond   = ` WHERE ((state = `
	sqlSweepNever  = ` AND sent_session IS NULL AND expires_at < `
	sqlSweepOr     = `) OR (state IN (`
	sqlSweepComma  = `, `
	sqlSweepExp    = `) AND expires_at < `
	sqlSweepIDs    = `)) AND id IN (`
	sqlAttestation = `SELECT tenant_id, attested, update_body, node_sig, update_cert_serial FROM commands WHERE id = $1`
	sqlLivePayload = `SELECT payload, tenant_id, subject_tenant, kind FROM commands WHERE id = $1 AND node_id = $2 AND state IN ($3, $4, $5) AND expires_at > $6`
	// sqlUnsigned is followed by its limit, a number (not a parameter,
	// so PostgreSQL plans it as it always did).
	sqlUnsigned = `SELECT id, node_id, kind, payload, expires_at, batch_id FROM commands WHERE state = $1 AND body IS NULL ORDER BY created_at LIMIT `

	// sqlApplyHead is followed by one row of typed values per update,
	// then sqlApplySet, the cancelled state, sqlApplyAt, now,
	// sqlApplyWhere, the terminal states, sqlApplyLate, the cancelled
	// state, sqlApplyLateReason, ReasonExpired and sqlApplyTail. A row
	// changes when the command is not final, or when it was cancelled as
	// expired with no update recorded and the update may be late (an
	// attested result: succeeded or failed); late is then set.
	sqlApplyHead = `WITH v(id, node_id, state, reason, result, attested, update_body, node_sig, serial, may_be_late) AS (VALUES `
	sqlApplySet  = `) UPDATE commands SET state = v.state, reason = v.reason, result = v.result, attested = v.attested, update_body = v.update_body,
		node_sig = v.node_sig, update_cert_serial = v.serial, late = CASE WHEN commands.state = `
	sqlApplyAt    = ` THEN 1 ELSE 0 END, updated_at = `
	sqlApplyWhere = `
		FROM v WHERE commands.id = v.id AND commands.node_id = v.node_id AND (commands.state NOT IN (`
	sqlApplyLate       = `) OR (v.may_be_late = 1 AND commands.update_body IS NULL AND commands.state = `
	sqlApplyLateReason = ` AND commands.reason = `
	sqlApplyTail       = `))
		RETURNING commands.id`

	// sqlSignHead is followed by one (id, body, sig) row per command, then
	// sqlSignSet, the signer certificate, sqlSignAt, now, sqlSignWhere,
	// the queued state and sqlSignTail.
	sqlSignHead  = `WITH v(id, body, sig) AS (VALUES `
	sqlSignSet   = `) UPDATE commands SET body = v.body, signature = v.sig, signer_cert = `
	sqlSignAt    = `, updated_at = `
	sqlSignWhere = ` FROM v WHERE commands.id = v.id AND commands.body IS NULL AND commands.state = `
	sqlSignTail  = ` RETURNING commands.node_id`
)

// Rows per multi-row statement.
const (
	insertPerStmt = 500 // rows per INSERT: 5,000 bound values
	applyPerStmt  = 200 // updates per UPDATE … FROM (VALUES …)
	signPerStmt   = 200 // signatures per UPDATE … FROM (VALUES …)
)

// Store owns the commands table: every statement on it is a method here.
// Modules that need the table (the signer, the secrets broker) are handed
// the Store at construction, so they need not import the Service (which
// takes them as dependencies).
type Store struct {
	db *store.DB
}

// NewStore returns the commands table's owner on db.
func NewStore(db *store.DB) *Store {
	if db == nil {
		panic("commands: NewStore needs a database")
	}
	return &Store{db: db}
}

// stateArgs returns states as query arguments (plain strings, which every
// driver binds).
func stateArgs(states ...wire.State) []any {
	out := make([]any, len(states))
	for i, s := range states {
		out[i] = string(s)
	}
	return out
}

// terminalStates are the states a command never leaves.
func terminalStates() []wire.State {
	return []wire.State{wire.StateSucceeded, wire.StateFailed, wire.StateCancelled}
}

// rowScanner is a *sql.Row or *sql.Rows.
type rowScanner interface{ Scan(...any) error }

// scanCommand decodes one row of commandColumns.
func scanCommand(row rowScanner) (Command, error) {
	var c Command
	var payload, result []byte
	var state string
	var attested int
	var created, updated, expires int64
	var late int
	var batch, fanout sql.NullString
	if err := row.Scan(&c.ID, &c.NodeID, &c.TenantID, &c.Kind, &payload, &state, &attested, &result, &c.Reason,
		&c.CreatedBy, &created, &updated, &expires, &batch, &fanout, &late); err != nil {
		return Command{}, err
	}
	c.Late = late == 1
	c.State = wire.State(state)
	c.BatchID, c.FanoutID = batch.String, fanout.String
	c.Payload = json.RawMessage(payload)
	c.Attested = attested == 1
	c.Result = asJSON(result)
	c.CreatedAt, c.UpdatedAt, c.ExpiresAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC(), time.UnixMilli(expires).UTC()
	return c, nil
}

// asJSON shows a result as JSON: itself when it is valid JSON, else a JSON
// string of its bytes; null when empty.
func asJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	if json.Valid(b) {
		return json.RawMessage(b)
	}
	q, _ := json.Marshal(string(b))
	return q
}

// tx runs fn in a transaction.
func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error { return s.db.Tx(ctx, fn) }

// insert writes one new command (queued, unsigned) inside tx.
func (s *Store) insert(ctx context.Context, tx *sql.Tx, c Command) error {
	var batch any
	if c.BatchID != "" {
		batch = c.BatchID
	}
	if _, err := tx.ExecContext(ctx, sqlInsert, c.ID, c.TenantID, c.NodeID, c.Kind, []byte(c.Payload), string(c.State), c.CreatedBy,
		c.CreatedAt.UnixMilli(), c.UpdatedAt.UnixMilli(), c.ExpiresAt.UnixMilli(), batch, c.subject); err != nil {
		return fmt.Errorf("commands: insert: %w", err)
	}
	return nil
}

// insertMany writes cs (at most insertPerStmt, none batched) in one
// statement inside tx.
func (s *Store) insertMany(ctx context.Context, tx *sql.Tx, cs []Command) error {
	var q strings.Builder
	q.WriteString(sqlInsertMany)
	a := s.db.NewArgs()
	for i, c := range cs {
		if i > 0 {
			q.WriteString(", ")
		}
		var fanout any
		if c.FanoutID != "" {
			fanout = c.FanoutID
		}
		q.WriteString("(" + a.List(c.ID, c.TenantID, c.NodeID, c.Kind, []byte(c.Payload), string(c.State), c.CreatedBy,
			c.CreatedAt.UnixMilli(), c.UpdatedAt.UnixMilli(), c.ExpiresAt.UnixMilli(), fanout) + ")")
	}
	if _, err := tx.ExecContext(ctx, q.String(), a.Values()...); err != nil {
		return fmt.Errorf("commands: insert: %w", err)
	}
	return nil
}

// countInFlight counts, inside tx, the live commands of top and every
// tenant under it (a quota.Counter).
func (s *Store) countInFlight(ctx context.Context, tx *sql.Tx, top string) (int64, error) {
	var n int64
	err := tx.QueryRowContext(ctx, sqlCountInFlight, append([]any{top}, stateArgs(wire.LiveStates...)...)...).Scan(&n)
	return n, err
}

// get reads one command; ok is false when it does not exist.
func (s *Store) get(ctx context.Context, id string) (Command, bool, error) {
	c, err := scanCommand(s.db.QueryRowContext(ctx, sqlByID, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Command{}, false, nil
	}
	if err != nil {
		return Command{}, false, fmt.Errorf("commands: read: %w", err)
	}
	return c, true, nil
}

// list reads the commands visible in scope that match f, newest first.
func (s *Store) list(ctx context.Context, scope iam.Scope, f Filter) ([]Command, error) {
	a := s.db.NewArgs()
	where := []string{scope.Filter(a, "tenant_id")}
	if f.NodeID != "" {
		where = append(where, "node_id = "+a.Add(f.NodeID))
	}
	if f.State != "" {
		where = append(where, "state = "+a.Add(f.State))
	}
	if f.FanoutID != "" {
		where = append(where, "fanout_id = "+a.Add(f.FanoutID))
	}
	q := sqlSelect + "WHERE " + strings.Join(where, " AND ") + " ORDER BY created_at DESC, id LIMIT " + strconv.Itoa(f.Limit)
	rows, err := s.db.QueryContext(ctx, q, a.Values()...)
	if err != nil {
		return nil, fmt.Errorf("commands: read: %w", err)
	}
	defer rows.Close()
	out := []Command{}
	for rows.Next() {
		c, err := scanCommand(rows)
		if err != nil {
			return nil, fmt.Errorf("commands: scan: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// fanoutStates counts the commands of fan-out id visible in scope by
// state.
func (s *Store) fanoutStates(ctx context.Context, scope iam.Scope, id string) (map[wire.State]int, error) {
	a := s.db.NewArgs()
	q := sqlFanoutStatesHead + scope.Filter(a, "tenant_id") + sqlFanoutStatesMid + a.Add(id) + sqlFanoutStatesTail
	rows, err := s.db.QueryContext(ctx, q, a.Values()...)
	if err != nil {
		return nil, fmt.Errorf("commands: count fan-out: %w", err)
	}
	defer rows.Close()
	out := map[wire.State]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("commands: count fan-out: %w", err)
		}
		out[wire.State(st)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("commands: count fan-out: %w", err)
	}
	return out, nil
}

// tenantOf reads a command's tenant; ok is false when it does not exist.
func (s *Store) tenantOf(ctx context.Context, id string) (string, bool, error) {
	var t string
	err := s.db.QueryRowContext(ctx, sqlTenantOf, id).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("commands: tenant of: %w", err)
	}
	return t, true, nil
}

// pendingNodes reads the nodes that have signed, queued commands.
func (s *Store) pendingNodes(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, sqlPendingNode, string(wire.StateQueued))
	if err != nil {
		return nil, fmt.Errorf("commands: pending nodes: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("commands: scan pending node: %w", err)
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// pendingRow is a signed, queued command as the gateway sends it, with
// what its batch's delivery needs.
type pendingRow struct {
	nodeID, id, kind, batchID string
	body, sig, signerCert     []byte
	payload                   []byte
}

// pending reads the signed, queued commands of nodeIDs (at most
// store.InChunk), at most perNode of each node's oldest, ordered by node
// then age.
func (s *Store) pending(ctx context.Context, nodeIDs []string, perNode int) ([]pendingRow, error) {
	a := s.db.NewArgs()
	q := sqlPendingForHead + a.Add(string(wire.StateQueued)) + sqlPendingForMid + a.Strings(nodeIDs) + sqlPendingForRn + a.Add(perNode) + sqlPendingForTail
	rows, err := s.db.QueryContext(ctx, q, a.Values()...)
	if err != nil {
		return nil, fmt.Errorf("commands: pending: %w", err)
	}
	defer rows.Close()
	var out []pendingRow
	for rows.Next() {
		var r pendingRow
		var batch sql.NullString
		if err := rows.Scan(&r.nodeID, &r.id, &r.body, &r.sig, &r.signerCert, &r.kind, &r.payload, &batch); err != nil {
			return nil, fmt.Errorf("commands: scan pending: %w", err)
		}
		r.batchID = batch.String
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("commands: pending: %w", err)
	}
	return out, nil
}

// markSent moves the queued commands of sent to sent, each with the
// session it was written to, in one transaction, one statement per
// store.InChunk commands, after locking their rows in id order (lockRows),
// the order every write to many commands takes: two writers that lock the
// same rows in one order cannot deadlock.
func (s *Store) markSent(ctx context.Context, sent []wire.Sent, now time.Time) error {
	sent = slices.SortedFunc(slices.Values(sent), func(a, b wire.Sent) int { return strings.Compare(a.CommandID, b.CommandID) })
	all := make([]string, len(sent))
	for i, c := range sent {
		all[i] = c.CommandID
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		if err := s.lockRows(ctx, tx, all); err != nil {
			return err
		}
		for chunk := range slices.Chunk(sent, store.InChunk) {
			a := s.db.NewArgs()
			var q strings.Builder
			q.WriteString(sqlMarkSentSet + a.Add(string(wire.StateSent)) + sqlMarkSentAt + a.Add(now.UnixMilli()) + sqlMarkSentSession)
			ids := make([]string, len(chunk))
			for i, c := range chunk {
				q.WriteString(" WHEN " + a.Typed(c.CommandID, "text") + " THEN " + a.Typed(c.SessionID, "text"))
				ids[i] = c.CommandID
			}
			q.WriteString(sqlMarkSentWhere + a.Add(string(wire.StateQueued)) + sqlMarkSentIDs + a.Strings(ids) + `)`)
			if _, err := tx.ExecContext(ctx, q.String(), a.Values()...); err != nil {
				return fmt.Errorf("commands: mark sent: %w", err)
			}
		}
		return nil
	})
}

// lockRows locks, inside tx, the commands rows of ids in id order, one
// statement per store.InChunk ids (on SQLite, whose one writer already
// serialises write transactions, it does nothing). A write that names
// rows in another order (UPDATE … FROM (VALUES …) locks them in the order
// of its join, an IN list in the order of its scan) would otherwise
// deadlock with a concurrent write naming the same rows in the opposite
// order, and PostgreSQL would cancel one of them.
func (s *Store) lockRows(ctx context.Context, tx *sql.Tx, ids []string) error {
	if s.db.LockClause() == "" || len(ids) == 0 {
		return nil
	}
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	for chunk := range slices.Chunk(ids, store.InChunk) {
		a := s.db.NewArgs()
		rows, err := tx.QueryContext(ctx, sqlLockIDs+a.Strings(chunk)+`)`+sqlLockOrder+s.db.LockClause(), a.Values()...)
		if err != nil {
			return fmt.Errorf("commands: lock rows: %w", err)
		}
		for rows.Next() {
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("commands: lock rows: %w", err)
		}
	}
	return nil
}

// requeueHead starts a requeue statement on a: sent, unexpired commands
// back to queued, their session cleared.
func requeueHead(a *store.Args, now time.Time) string {
	return sqlRequeueSet + a.Add(string(wire.StateQueued)) + sqlRequeueAt + a.Add(now.UnixMilli()) +
		sqlRequeueWhere + a.Add(string(wire.StateSent)) + sqlRequeueExpiry + a.Add(now.UnixMilli())
}

// requeueEnded moves the commands still sent on sessionIDs (sessions that
// ended) and not expired back to queued, one statement per store.InChunk
// sessions, and returns how many moved.
func (s *Store) requeueEnded(ctx context.Context, sessionIDs []string, now time.Time) (int64, error) {
	var n int64
	for chunk := range slices.Chunk(sessionIDs, store.InChunk) {
		a := s.db.NewArgs()
		q := requeueHead(a, now) + sqlRequeueSessions + a.Strings(chunk) + `)`
		res, err := s.db.ExecContext(ctx, q, a.Values()...)
		if err != nil {
			return n, fmt.Errorf("commands: requeue sent: %w", err)
		}
		k, err := res.RowsAffected()
		if err != nil {
			return n, fmt.Errorf("commands: requeue sent: %w", err)
		}
		n += k
	}
	return n, nil
}

// requeueNode moves nodeID's commands still sent on any session but
// sessionID (its current one) and not expired back to queued, and returns
// how many moved.
func (s *Store) requeueNode(ctx context.Context, nodeID, sessionID string, now time.Time) (int64, error) {
	a := s.db.NewArgs()
	q := requeueHead(a, now) + sqlRequeueNode + a.Add(nodeID) + sqlRequeueOther + a.Add(sessionID) + `)`
	res, err := s.db.ExecContext(ctx, q, a.Values()...)
	if err != nil {
		return 0, fmt.Errorf("commands: requeue node: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("commands: requeue node: %w", err)
	}
	return n, nil
}

// updateRow is one node update to record: the values of the command's
// row after it.
type updateRow struct {
	commandID, nodeID string
	state             wire.State
	reason            string
	result            []byte
	attested          int
	body, sig         []byte
	serial            string
	// mayBeLate is 1 for an attested result (succeeded or failed): it
	// is recorded, marked late, on a command the sweep cancelled as
	// expired before any update of it arrived.
	mayBeLate int
}

// applyUpdates writes rows (no command twice, at most applyPerStmt) in one
// statement inside tx and returns the ids of the commands it changed:
// those of the named node not already in a terminal state, and those
// cancelled as expired, with no update yet, whose row is a late attested
// result. The caller locked the rows first (lockRows).
func (s *Store) applyUpdates(ctx context.Context, tx *sql.Tx, rows []updateRow, now time.Time) (map[string]bool, error) {
	a := s.db.NewArgs()
	var q strings.Builder
	q.WriteString(sqlApplyHead)
	for k, r := range rows {
		if k > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(" + a.Typed(r.commandID, "text") + ", " + a.Typed(r.nodeID, "text") + ", " + a.Typed(string(r.state), "text") + ", " +
			a.Typed(r.reason, "text") + ", " + a.Typed(r.result, "bytea") + ", " + a.Typed(r.attested, "integer") + ", " +
			a.Typed(r.body, "bytea") + ", " + a.Typed(r.sig, "bytea") + ", " + a.Typed(r.serial, "text") + ", " + a.Typed(r.mayBeLate, "integer") + ")")
	}
	cancelled := string(wire.StateCancelled)
	q.WriteString(sqlApplySet + a.Add(cancelled) + sqlApplyAt + a.Add(now.UnixMilli()) + sqlApplyWhere + a.List(stateArgs(terminalStates()...)...) +
		sqlApplyLate + a.Add(cancelled) + sqlApplyLateReason + a.Add(ReasonExpired) + sqlApplyTail)
	res, err := tx.QueryContext(ctx, q.String(), a.Values()...)
	if err != nil {
		return nil, fmt.Errorf("commands: apply updates: %w", err)
	}
	defer res.Close()
	applied := map[string]bool{}
	for res.Next() {
		var id string
		if err := res.Scan(&id); err != nil {
			return nil, fmt.Errorf("commands: apply updates: %w", err)
		}
		applied[id] = true
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("commands: apply updates: %w", err)
	}
	return applied, nil
}

// stateOf reads, inside tx, the state of nodeID's command id; ok is false
// when there is none.
func (s *Store) stateOf(ctx context.Context, tx *sql.Tx, id, nodeID string) (wire.State, bool, error) {
	var st string
	err := tx.QueryRowContext(ctx, sqlStateOf, id, nodeID).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("commands: read state: %w", err)
	}
	return wire.State(st), true, nil
}

// binding is what a signed update must name of its command: the node it
// is addressed to, its kind and the SHA-256 of its payload.
type binding struct {
	nodeID, kind string
	payloadSHA   [32]byte
}

// bindings reads the binding of each command of ids that exists, one query
// per store.InChunk ids.
func (s *Store) bindings(ctx context.Context, ids []string) (map[string]binding, error) {
	out := make(map[string]binding, len(ids))
	for chunk := range slices.Chunk(ids, store.InChunk) {
		a := s.db.NewArgs()
		rows, err := s.db.QueryContext(ctx, sqlBindings+a.Strings(chunk)+`)`, a.Values()...)
		if err != nil {
			return nil, fmt.Errorf("commands: read update bindings: %w", err)
		}
		for rows.Next() {
			var id string
			var b binding
			var payload []byte
			if err := rows.Scan(&id, &b.nodeID, &b.kind, &payload); err != nil {
				rows.Close()
				return nil, fmt.Errorf("commands: scan update binding: %w", err)
			}
			b.payloadSHA = sha256.Sum256(payload)
			out[id] = b
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("commands: read update bindings: %w", err)
		}
	}
	return out, nil
}

// idKind is a command's id and kind.
type idKind struct{ id, kind string }

// unfinished reads nodeID's live commands.
func (s *Store) unfinished(ctx context.Context, nodeID string) ([]idKind, error) {
	rows, err := s.db.QueryContext(ctx, sqlUnfinished, append([]any{nodeID}, stateArgs(wire.LiveStates...)...)...)
	if err != nil {
		return nil, fmt.Errorf("commands: list unfinished: %w", err)
	}
	defer rows.Close()
	var out []idKind
	for rows.Next() {
		var r idKind
		if err := rows.Scan(&r.id, &r.kind); err != nil {
			return nil, fmt.Errorf("commands: scan unfinished: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("commands: list unfinished: %w", err)
	}
	return out, nil
}

// cancel cancels command id with reason, if it is still live.
func (s *Store) cancel(ctx context.Context, id, reason string, now time.Time) error {
	args := append([]any{string(wire.StateCancelled), reason, now.UnixMilli(), id}, stateArgs(wire.LiveStates...)...)
	if _, err := s.db.ExecContext(ctx, sqlCancel, args...); err != nil {
		return fmt.Errorf("commands: cancel: %w", err)
	}
	return nil
}

// sweep cancels (reason expired) the queued commands never sent that
// expired before now, and the sent ones (queued again after a delivery
// too) that expired before sentBefore, in one transaction that first
// locks them in id order (as lockRows does).
func (s *Store) sweep(ctx context.Context, now, sentBefore time.Time) (int64, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		n = 0
		ids, err := s.expiring(ctx, tx, now, sentBefore)
		if err != nil {
			return err
		}
		for chunk := range slices.Chunk(ids, store.InChunk) {
			a := s.db.NewArgs()
			q := sqlSweepHead + a.Add(string(wire.StateCancelled)) + sqlSweepSet + a.Add(ReasonExpired) + sqlSweepAt + a.Add(now.UnixMilli()) +
				sqlSweepCond + a.Add(string(wire.StateQueued)) + sqlSweepNever + a.Add(now.UnixMilli()) +
				sqlSweepOr + a.Add(string(wire.StateSent)) + sqlSweepComma + a.Add(string(wire.StateQueued)) + sqlSweepExp + a.Add(sentBefore.UnixMilli()) +
				sqlSweepIDs + a.Strings(chunk) + `)`
			res, err := tx.ExecContext(ctx, q, a.Values()...)
			if err != nil {
				return fmt.Errorf("commands: sweep: %w", err)
			}
			k, err := res.RowsAffected()
			if err != nil {
				return fmt.Errorf("commands: sweep: %w", err)
			}
			n += k
		}
		return nil
	})
	return n, err
}

// expiring reads, inside tx, the ids of the commands sweep cancels,
// locking them in id order on PostgreSQL.
func (s *Store) expiring(ctx context.Context, tx *sql.Tx, now, sentBefore time.Time) ([]string, error) {
	rows, err := tx.QueryContext(ctx, sqlExpiring+sqlLockOrder+s.db.LockClause(),
		string(wire.StateQueued), now.UnixMilli(), string(wire.StateSent), string(wire.StateQueued), sentBefore.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("commands: sweep: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("commands: sweep: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("commands: sweep: %w", err)
	}
	return ids, nil
}

// attestationRow is what a command's attestation is made from.
type attestationRow struct {
	tenant    string
	attested  bool
	body, sig []byte
	serial    sql.NullString
}

// attestation reads command id's last update; ok is false when the
// command does not exist.
func (s *Store) attestation(ctx context.Context, id string) (attestationRow, bool, error) {
	var r attestationRow
	var attested int
	err := s.db.QueryRowContext(ctx, sqlAttestation, id).Scan(&r.tenant, &attested, &r.body, &r.sig, &r.serial)
	if errors.Is(err, sql.ErrNoRows) {
		return attestationRow{}, false, nil
	}
	if err != nil {
		return attestationRow{}, false, fmt.Errorf("commands: read attestation: %w", err)
	}
	r.attested = attested == 1
	return r, true, nil
}

// LivePayload returns the payload and tenant of nodeID's command
// commandID when it is live (queued, sent or running) and has not expired
// at now; ok is false when there is no such command.
func (s *Store) LivePayload(ctx context.Context, nodeID, commandID string, now time.Time) (tenant string, payload []byte, ok bool, err error) {
	l, ok, err := s.LiveCommand(ctx, nodeID, commandID, now)
	return l.Tenant, l.Payload, ok, err
}

// Live is what LiveCommand reads of a live command.
type Live struct {
	Tenant  string // the command's tenant (its node's)
	Subject string // the tenant a module's command works for ("" if none)
	Kind    string
	Payload []byte
}

// LiveCommand returns nodeID's command commandID when it is live (queued,
// sent or running) and has not expired at now; ok is false when there is
// no such command. The secrets broker reads it to bind a release to the
// command that asked for it.
func (s *Store) LiveCommand(ctx context.Context, nodeID, commandID string, now time.Time) (Live, bool, error) {
	args := append([]any{commandID, nodeID}, stateArgs(wire.LiveStates...)...)
	var l Live
	err := s.db.QueryRowContext(ctx, sqlLivePayload, append(args, now.UnixMilli())...).Scan(&l.Payload, &l.Tenant, &l.Subject, &l.Kind)
	if errors.Is(err, sql.ErrNoRows) {
		return Live{}, false, nil
	}
	if err != nil {
		return Live{}, false, fmt.Errorf("commands: read live payload: %w", err)
	}
	return l, true, nil
}

// Unsigned is a queued command the signer has not signed yet: what its
// signed body will name.
type Unsigned struct {
	ID          string
	NodeID      string
	Kind        string
	Payload     []byte
	ExpiresAtMs int64
	// BatchID is the destructive batch the command belongs to, or "".
	BatchID string
}

// Unsigned returns up to limit queued, unsigned commands, oldest first.
func (s *Store) Unsigned(ctx context.Context, limit int) ([]Unsigned, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, sqlUnsigned+strconv.Itoa(limit), string(wire.StateQueued))
	if err != nil {
		return nil, fmt.Errorf("commands: list unsigned: %w", err)
	}
	defer rows.Close()
	var out []Unsigned
	for rows.Next() {
		var u Unsigned
		var batch sql.NullString
		if err := rows.Scan(&u.ID, &u.NodeID, &u.Kind, &u.Payload, &u.ExpiresAtMs, &batch); err != nil {
			return nil, fmt.Errorf("commands: scan unsigned: %w", err)
		}
		u.BatchID = batch.String
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("commands: list unsigned: %w", err)
	}
	return out, nil
}

// Signature is a command's signed body and the worker key's signature
// over it.
type Signature struct {
	CommandID string
	Body      []byte
	Sig       []byte
}

// StoreSignatures stores sigs, made by the worker key certified by
// signerCert, in one transaction (one statement per signPerStmt
// commands: a round trip per command costs PostgreSQL far more than the
// write). A command is signed only while it is queued and unsigned, so a
// command cancelled meanwhile or signed by another worker keeps its state.
// It returns the node of each command signed, one entry per command.
func (s *Store) StoreSignatures(ctx context.Context, sigs []Signature, signerCert []byte, now time.Time) ([]string, error) {
	var nodes []string
	ids := make([]string, len(sigs))
	for i, sg := range sigs {
		ids[i] = sg.CommandID
	}
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		nodes = nodes[:0]
		if err := s.lockRows(ctx, tx, ids); err != nil {
			return err
		}
		for chunk := range slices.Chunk(sigs, signPerStmt) {
			got, err := s.storeSignatures(ctx, tx, chunk, signerCert, now)
			if err != nil {
				return err
			}
			nodes = append(nodes, got...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return nodes, nil
}

// storeSignatures writes one statement's worth of signatures inside tx.
func (s *Store) storeSignatures(ctx context.Context, tx *sql.Tx, sigs []Signature, signerCert []byte, now time.Time) ([]string, error) {
	a := s.db.NewArgs()
	var q strings.Builder
	q.WriteString(sqlSignHead)
	for i, sg := range sigs {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(" + a.Typed(sg.CommandID, "text") + ", " + a.Typed(sg.Body, "bytea") + ", " + a.Typed(sg.Sig, "bytea") + ")")
	}
	q.WriteString(sqlSignSet + a.Typed(signerCert, "bytea") + sqlSignAt + a.Add(now.UnixMilli()) + sqlSignWhere + a.Add(string(wire.StateQueued)) + sqlSignTail)
	rows, err := tx.QueryContext(ctx, q.String(), a.Values()...)
	if err != nil {
		return nil, fmt.Errorf("commands: store signatures: %w", err)
	}
	defer rows.Close()
	var nodes []string
	for rows.Next() {
		var node string
		if err := rows.Scan(&node); err != nil {
			return nil, fmt.Errorf("commands: store signatures: %w", err)
		}
		nodes = append(nodes, node)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("commands: store signatures: %w", err)
	}
	return nodes, nil
}
