package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// The environment the audit commands read for their defaults; dev's
// DATA/env exports all three (devenv writes it).
const (
	envDB      = "BC_DB"       // --db
	envPKI     = "BC_PKI"      // --pki
	envKEKFile = "BC_KEK_FILE" // --kek-file
)

// envOr returns the environment variable name, or def when it is unset or
// empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// dbTenant is the tenant an audit command reads on the database directly
// when --tenant is not given: the root tenant, the operator's own.
func dbTenant(tenant string) string {
	if tenant == "" {
		return iam.RootTenant
	}
	return tenant
}

// auditListAPI lists a tenant's events through the API (audit.list): the
// caller's own tenant when tenant is "".
func auditListAPI(ctx context.Context, tenant string, since int64, limit int) ([]client.AuditEvent, error) {
	cl, err := apiClient()
	if err != nil {
		return nil, err
	}
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	l, err := cl.AuditList(ctx, tenant, since, limit)
	if err != nil {
		return nil, apiErr(err)
	}
	return l.Events, nil
}

// auditListDB lists a tenant's events on the database directly.
func auditListDB(ctx context.Context, dsn, tenant string, since int64, limit int) ([]client.AuditEvent, error) {
	db, l, err := openAuditLog(ctx, dsn, "", false)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	evs, err := l.List(ctx, dbTenant(tenant), since, limit)
	if err != nil {
		return nil, err
	}
	out := make([]client.AuditEvent, len(evs))
	for i, e := range evs {
		out[i] = client.AuditEvent(e)
	}
	return out, nil
}

// printAuditEvents prints events as a table.
func printAuditEvents(w io.Writer, evs []client.AuditEvent) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tID\tAT\tACTOR\tACTION\tRESOURCE\tOUTCOME\tSEALED")
	for _, e := range evs {
		seq := "-"
		if e.Seq != nil {
			seq = fmt.Sprint(*e.Seq)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%v\n", seq, e.ID, timeText(e.At), e.Actor, e.Action, e.Resource, e.Outcome, e.Sealed)
	}
	return tw.Flush()
}

// auditProveFile returns an event's proof file: on the database directly
// when dsn is set, else through the API (audit.prove).
func auditProveFile(ctx context.Context, dsn, tenant, event string) ([]byte, uint64, error) {
	if dsn == "" {
		cl, err := apiClient()
		if err != nil {
			return nil, 0, err
		}
		p, err := cl.AuditProve(ctx, tenant, event)
		if err != nil {
			return nil, 0, apiErr(err)
		}
		return []byte(p.Proof), p.Index, nil
	}
	db, l, err := openAuditLog(ctx, dsn, "", false)
	if err != nil {
		return nil, 0, err
	}
	defer db.Close()
	p, err := l.Prove(ctx, dbTenant(tenant), event)
	if err != nil {
		return nil, 0, err
	}
	return p.Marshal(), p.Index, nil
}
