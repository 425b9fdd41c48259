package integration

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestHelperEventsBecomeAuditRows: what a node's root helper did and
// refused (drained from its events.drain) reaches the control plane as
// audit rows of the node, with the caller's pid and the refusal code, and
// a node cannot flood the log: a message over nodes.MaxHelperEvents is
// refused whole and a control character never reaches a row.
func TestHelperEventsBecomeAuditRows(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		var mu sync.Mutex
		queue := [][]helperwire.Event{{
			{AtMs: 1, PID: 4242, UID: 999, Op: helperwire.OpFileWrite},
			{AtMs: 2, PID: 4343, UID: 1234, Code: helperwire.CodePeerUID, Reason: "uid 1234 is not the node account\x1b[31m"},
		}}
		src := func(context.Context) ([]helperwire.Event, int, error) {
			mu.Lock()
			defer mu.Unlock()
			if len(queue) == 0 {
				return nil, 0, nil
			}
			evs := queue[0]
			queue = queue[1:]
			return evs, 3, nil
		}
		n := e.Join(t, "node", "helped")
		n.Stop()
		n = e.OpenNodeWith(t, n.Dir, "", func(c *daemon.Config) { c.HelperEvents = src })
		n.Start(t)
		n.WaitConnected(t)
		ctx := context.Background()
		pollUntil(t, "the helper events acknowledged", func() bool {
			var rows int
			_ = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE actor = $1 AND action LIKE 'compute:nodes:helper.%'`, "node/"+n.NodeID()).Scan(&rows)
			return rows == 3 && n.PendingHelperEvents() == 0
		})
		type row struct{ action, outcome, details string }
		rs, err := db.QueryContext(ctx, `SELECT action, outcome, details FROM audit_events WHERE actor = $1 AND action LIKE 'compute:nodes:helper.%' ORDER BY action`, "node/"+n.NodeID())
		if err != nil {
			t.Fatal(err)
		}
		var got []row
		for rs.Next() {
			var r row
			if err := rs.Scan(&r.action, &r.outcome, &r.details); err != nil {
				t.Fatal(err)
			}
			got = append(got, r)
		}
		rs.Close()
		if len(got) != 3 || got[0].action != "compute:nodes:helper.dropped" || got[1].action != "compute:nodes:helper.file.write" || got[1].outcome != "allowed" ||
			!strings.Contains(got[1].details, `"pid":4242`) || got[2].action != "compute:nodes:helper.refused" || got[2].outcome != "refused" ||
			!strings.Contains(got[2].details, `"code":"peer-uid"`) || !strings.Contains(got[2].details, `"pid":4343`) || strings.Contains(got[2].details, "\x1b") ||
			strings.Contains(got[2].details, `\u001b`) {
			t.Fatalf("helper audit rows: %+v", got)
		}
		flood := &nodev1.HelperEvents{}
		for range 257 {
			flood.Events = append(flood.Events, &nodev1.HelperEvent{Op: "ping"})
		}
		if err := e.CP.Nodes.RecordHelperEvents(ctx, n.NodeID(), flood); err == nil {
			t.Fatal("257 helper events in one message were recorded, want refused")
		}
		var rows int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE tenant_id = $1 AND action = 'compute:nodes:helper.ping'`, iam.RootTenant).Scan(&rows); err != nil || rows != 0 {
			t.Fatalf("a refused flood wrote %d rows (%v)", rows, err)
		}
	})
}
