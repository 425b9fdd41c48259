package quota

import (
	"database/sql"
	"fmt"
)

// The quota module owns the quota_usage and tenant_quotas tables; this file
// holds every statement it runs on them and their row codecs. The tenant
// tree is read through package iam.

const (
	qUsage       = `SELECT used, counted_at FROM quota_usage WHERE tenant_id = $1 AND kind = $2`
	qUpsertUsage = `INSERT INTO quota_usage (tenant_id, kind, used, counted_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (tenant_id, kind) DO UPDATE SET used = $3, counted_at = $4`
	qLimits = `SELECT join_tokens, sandboxes, warm_memory_mb, commands_in_flight FROM tenant_quotas WHERE tenant_id = $1`
	// qUpsertLimits is completed by upsertLimits with one assignment per
	// column.
	qUpsertLimits = `INSERT INTO tenant_quotas (tenant_id, updated_at, join_tokens, sandboxes, warm_memory_mb, commands_in_flight)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant_id) DO UPDATE SET updated_at = $2, `
	qLock = `SELECT pg_advisory_xact_lock($1)`
)

// limitColumns are tenant_quotas' limit columns, in Kinds' order and as
// the $3.. arguments of qUpsertLimits.
var limitColumns = [...]string{"join_tokens", "sandboxes", "warm_memory_mb", "commands_in_flight"}

// upsertLimits returns the statement that stores overrides: each column
// set to its argument when reset, else to its argument or the stored
// value.
func upsertLimits(reset bool) string {
	q := qUpsertLimits
	for i, col := range limitColumns {
		if i > 0 {
			q += ", "
		}
		if reset {
			q += fmt.Sprintf("%s = $%d", col, i+3)
		} else {
			q += fmt.Sprintf("%s = COALESCE($%d, tenant_quotas.%s)", col, i+3, col)
		}
	}
	return q
}

type scanner interface{ Scan(dest ...any) error }

// scanLimits decodes a row of qLimits over the defaults: a NULL column
// keeps the default.
func scanLimits(s scanner, defaults Limits) (Limits, error) {
	l := defaults
	var jt, sb, wm, cf sql.NullInt64
	if err := s.Scan(&jt, &sb, &wm, &cf); err != nil {
		return Limits{}, err
	}
	for _, o := range []struct {
		v   sql.NullInt64
		dst *int64
	}{{jt, &l.JoinTokens}, {sb, &l.Sandboxes}, {wm, &l.WarmMemoryMB}, {cf, &l.CommandsInFlight}} {
		if o.v.Valid {
			*o.dst = o.v.Int64
		}
	}
	return l, nil
}
