package sandboxes

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/quota"
)

// The module's SQL. It names only the module's own tables: sandboxes,
// sandbox_images, sandbox_templates and sandbox_uploads (the quota
// counts select rows with quota.InSubtree, the quota module's condition).

// Templates.
const (
	sqlImageDigest    = `SELECT digest FROM sandbox_images WHERE tenant_id = $1 AND name = $2`
	sqlInsertTemplate = `INSERT INTO sandbox_templates (id, tenant_id, name, image_name, image_digest, runtime, cpu_millis, memory_mb, pids, disk_mb,
			lifetime_ms, max_lifetime_ms, network, run_as_root, env, labels, warm, created_by, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`
	sqlSelectTemplates = `SELECT id, tenant_id, name, image_name, image_digest, runtime, cpu_millis, memory_mb, pids, disk_mb, lifetime_ms, max_lifetime_ms,
	network, run_as_root, env, labels, warm, created_by, created_at FROM sandbox_templates`
	sqlTemplateTenant = `SELECT tenant_id FROM sandbox_templates WHERE id = $1`
	sqlDeleteTemplate = `DELETE FROM sandbox_templates WHERE id = $1 AND tenant_id = $2`

	// Conditions after sqlSelectTemplates.
	whereTemplatesOf = `WHERE tenant_id = $1 ORDER BY name`
	whereTemplateRef = `WHERE tenant_id = $1 AND (id = $2 OR name = $2)`
	whereWarmPools   = `WHERE warm > 0 ORDER BY id`
)

// Sandboxes.
const (
	sandboxColumns = `id, tenant_id, template_id, node_id, runtime, memory_mb, state, reason, claimed, created_by, created_at, expires_at, max_expires_at,
	image_digest, network, run_as_root, from_checkpoint, claim_command`
	sqlSelectSandboxes = `SELECT ` + sandboxColumns + ` FROM sandboxes`
	sqlInsertSandbox   = `INSERT INTO sandboxes (id, tenant_id, template_id, node_id, runtime, memory_mb, state, claimed, created_by, created_at, updated_at, expires_at, max_expires_at,
			image_digest, network, run_as_root, from_checkpoint)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11, $12, $13, $14, $15, $16)`
	// sqlClaimed takes a warm sandbox and returns its row as claimed
	// (sqlSelectSandboxes' columns), so a claim reads the full row once.
	sqlClaimed = `UPDATE sandboxes SET state = $1, claimed = 2, created_by = $2, created_at = $3, updated_at = $3, expires_at = $4,
				max_expires_at = $5, claim_command = $8 WHERE id = $6 AND state = $7
				RETURNING ` + sandboxColumns
	// sqlWarmOf lists what a claim needs of a template's oldest warm
	// sandboxes (the full row comes back from sqlClaimed).
	sqlWarmOf = `SELECT id, node_id, max_expires_at FROM sandboxes WHERE template_id = $1 AND state = $2 ORDER BY created_at, id LIMIT 8`
	// sqlClaimConfirmed clears a claim's pending update once its host
	// answered it.
	sqlClaimConfirmed = `UPDATE sandboxes SET claim_command = '' WHERE id = $1 AND claim_command = $2`
	// sqlClaimRefused fails a sandbox whose host refused its claim.
	sqlClaimRefused = `UPDATE sandboxes SET state = $1, reason = $2, updated_at = $3, claim_command = '' WHERE id = $4 AND claim_command = $5 AND state = $6`
	// sqlPendingClaims lists claims whose host has not yet been heard.
	sqlPendingClaims = `SELECT id, tenant_id, node_id, claim_command FROM sandboxes WHERE claim_command <> ''`
	sqlSetState      = `UPDATE sandboxes SET state = $1, reason = $2, updated_at = $3 WHERE id = $4 AND state = $5`
	sqlExtend        = `UPDATE sandboxes SET expires_at = $1, updated_at = $2 WHERE id = $3 AND state = $4`
	sqlMarkDelete    = `UPDATE sandboxes SET state = $1, updated_at = $2 WHERE id = $3`
	sqlCountPool     = `SELECT COUNT(*) FROM sandboxes WHERE template_id = $1 AND state IN ($2, $3)`
	sqlCountWarm     = `SELECT COUNT(*) FROM sandboxes WHERE template_id = $1 AND state = $2`
	sqlHostLoad      = `SELECT node_id, COUNT(*), SUM(memory_mb) FROM sandboxes WHERE state IN ($1, $2, $3, $4) GROUP BY node_id`
	sqlReportRow     = `SELECT tenant_id, node_id, state FROM sandboxes WHERE id = $1`
	sqlReportFail    = `UPDATE sandboxes SET state = $1, reason = $2, updated_at = $3 WHERE id = $4 AND node_id = $5 AND state IN ($6, $7)`

	// sqlWarmPool and sqlDrainWarm take a pool condition (its one
	// argument is $1): poolOfTemplate or poolOrphans.
	sqlWarmPool    = `SELECT id, node_id FROM sandboxes WHERE %s AND claimed = 0 AND state IN ($2, $3)`
	sqlDrainWarm   = `UPDATE sandboxes SET state = $1, reason = $2 WHERE id = $3 AND claimed = 0 AND state IN ($4, $5)`
	poolOfTemplate = `template_id = $1`
	poolOrphans    = `template_id NOT IN (SELECT id FROM sandbox_templates WHERE id <> $1)`

	// Conditions after sqlSelectSandboxes.
	whereClaimedID  = `WHERE id = $1 AND claimed <> 0 AND state NOT IN ($2, $3)`
	whereListed     = `WHERE tenant_id = $1 AND claimed <> 0 AND state IN ($2, $3) ORDER BY created_at DESC, id`
	whereExpiredNow = `WHERE state IN ($1, $2, $3, $4) AND expires_at <= $5`
)

// The quota counts, each over the rows of a top-level tenant ($1) and
// every tenant under it.
const (
	// countLive: sandboxes the tenants hold outside their warm pools (a
	// warm one being claimed counts). The states are one IN list so that
	// the (tenant_id, state) index bounds the count to live rows, not
	// every sandbox the tenants ever had.
	countLive = `SELECT COUNT(*) FROM sandboxes WHERE ` + quota.InSubtree + ` AND state IN ($2, $3, $4) AND (state <> $4 OR claimed <> 0)`
	// sumWarmHeld: memory of the tenants' unclaimed warm sandboxes.
	sumWarmHeld = `SELECT COALESCE(SUM(memory_mb), 0) FROM sandboxes WHERE ` + quota.InSubtree + ` AND claimed = 0 AND state IN ($2, $3)`
	// sumWarmConfigured: warm × memory over the tenants' templates.
	sumWarmConfigured = `SELECT COALESCE(SUM(warm * memory_mb), 0) FROM sandbox_templates WHERE ` + quota.InSubtree
)

// Images and uploads.
const (
	sqlBeginUpload   = `INSERT INTO sandbox_uploads (id, tenant_id, identity_id, next_offset, created_at) VALUES ($1, $2, $3, 0, $4)`
	sqlUploadTenant  = `SELECT tenant_id FROM sandbox_uploads WHERE id = $1`
	sqlUploadOffset  = `SELECT next_offset, done_at FROM sandbox_uploads WHERE id = $1`
	sqlAdvanceUpload = `UPDATE sandbox_uploads SET next_offset = $1 WHERE id = $2 AND next_offset = $3 AND done_at IS NULL`
	sqlFinishUpload  = `UPDATE sandbox_uploads SET done_at = $1 WHERE id = $2 AND done_at IS NULL`
	sqlDeleteImageAt = `DELETE FROM sandbox_images WHERE tenant_id = $1 AND name = $2`
	sqlInsertImage   = `INSERT INTO sandbox_images (id, tenant_id, name, digest, size_bytes, created_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)`
	sqlListImages    = `SELECT id, tenant_id, name, digest, size_bytes, created_by, created_at FROM sandbox_images WHERE tenant_id = $1 ORDER BY name`
)

// scanner is a *sql.Rows or *sql.Row.
type scanner interface{ Scan(dest ...any) error }

// templateArgs are sqlInsertTemplate's arguments for t (env sealed,
// labels encoded), created at now.
func templateArgs(t Template, envCol string, labelsJSON []byte, now time.Time) []any {
	root := 0
	if t.Root {
		root = 1
	}
	return []any{t.ID, t.TenantID, t.Name, t.Image, t.ImageDigest, t.Runtime, t.Limits.CPUMillis, t.Limits.MemoryMB, t.Limits.Pids, t.Limits.DiskMB,
		t.Lifetime * 1000, t.MaxLifetime * 1000, t.Network, root, envCol, string(labelsJSON), t.Warm, t.CreatedBy, now.UnixMilli()}
}

// scanTemplate reads one row of sqlSelectTemplates (its env column into
// envCol, for the caller to open).
func scanTemplate(r scanner) (Template, error) {
	var t Template
	var root int
	var labels string
	var life, maxLife, at int64
	if err := r.Scan(&t.ID, &t.TenantID, &t.Name, &t.Image, &t.ImageDigest, &t.Runtime, &t.Limits.CPUMillis, &t.Limits.MemoryMB, &t.Limits.Pids,
		&t.Limits.DiskMB, &life, &maxLife, &t.Network, &root, &t.envCol, &labels, &t.Warm, &t.CreatedBy, &at); err != nil {
		return Template{}, fmt.Errorf("sandboxes: scan template: %w", err)
	}
	t.Root, t.Lifetime, t.MaxLifetime, t.CreatedAt = root == 1, life/1000, maxLife/1000, time.UnixMilli(at).UTC()
	if err := json.Unmarshal([]byte(labels), &t.Labels); err != nil {
		return Template{}, fmt.Errorf("sandboxes: template labels: %w", err)
	}
	return t, nil
}

// sandboxArgs are sqlInsertSandbox's arguments for x (in StateStarting),
// made at now; claimed is 0 for a warm sandbox, 1 otherwise.
func sandboxArgs(x Sandbox, claimed int, now time.Time) []any {
	return []any{x.ID, x.TenantID, x.TemplateID, x.NodeID, x.Runtime, x.memoryMB, string(StateStarting), claimed, x.CreatedBy,
		now.UnixMilli(), x.ExpiresAt.UnixMilli(), x.MaxExpires.UnixMilli(), x.run.image, x.run.network, boolInt(x.run.root), x.FromCheckpoint}
}

// boolInt is a boolean column's value.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// scanSandbox reads one row of sqlSelectSandboxes.
func scanSandbox(r scanner) (Sandbox, error) {
	var x Sandbox
	var state string
	var claimed int
	var created, exp, maxExp int64
	var root int
	if err := r.Scan(&x.ID, &x.TenantID, &x.TemplateID, &x.NodeID, &x.Runtime, &x.memoryMB, &state, &x.Reason, &claimed, &x.CreatedBy,
		&created, &exp, &maxExp, &x.run.image, &x.run.network, &root, &x.FromCheckpoint, &x.claimCommand); err != nil {
		return Sandbox{}, fmt.Errorf("sandboxes: scan: %w", err)
	}
	x.State, x.FromWarm, x.run.root = State(state), claimed == 2, root == 1
	x.CreatedAt, x.ExpiresAt, x.MaxExpires = time.UnixMilli(created).UTC(), time.UnixMilli(exp).UTC(), time.UnixMilli(maxExp).UTC()
	return x, nil
}

// scanImage reads one row of sqlListImages.
func scanImage(r scanner) (Image, error) {
	var i Image
	var at int64
	if err := r.Scan(&i.ID, &i.TenantID, &i.Name, &i.Digest, &i.SizeBytes, &i.CreatedBy, &at); err != nil {
		return Image{}, fmt.Errorf("sandboxes: scan image: %w", err)
	}
	i.CreatedAt = time.UnixMilli(at).UTC()
	return i, nil
}

// imageArgs are sqlInsertImage's arguments for i.
func imageArgs(i Image) []any {
	return []any{i.ID, i.TenantID, i.Name, i.Digest, i.SizeBytes, i.CreatedBy, i.CreatedAt.UnixMilli()}
}

// uploadRow is what a chunk or a commit reads of an upload.
type uploadRow struct {
	next int64
	done bool
}

// scanUpload reads one row of sqlUploadOffset.
func scanUpload(r scanner) (uploadRow, error) {
	var u uploadRow
	var done sql.NullInt64
	if err := r.Scan(&u.next, &done); err != nil {
		return uploadRow{}, err
	}
	u.done = done.Valid
	return u, nil
}
