package nodes

import (
	"context"
	"fmt"
	"slices"

	"github.com/bettercompute/bettercompute/internal/store"
)

// sqlConnectedOf lists which of some nodes hold an open session (the IN
// list follows).
const sqlConnectedOf = `SELECT DISTINCT node_id FROM node_sessions WHERE closed_at IS NULL AND node_id IN (`

// Connected returns which of ids hold a session now (true), for the
// sandboxes module's warm claims: it reads only those nodes' sessions,
// where List would read every node of the fleet.
func (s *Service) Connected(ctx context.Context, ids []string) (map[string]bool, error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	out := make(map[string]bool, len(ids))
	for chunk := range slices.Chunk(ids, store.InChunk) {
		a := s.db.NewArgs()
		rows, err := s.db.QueryContext(ctx, sqlConnectedOf+a.Strings(chunk)+`)`, a.Values()...)
		if err != nil {
			return nil, fmt.Errorf("nodes: read sessions: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("nodes: scan session: %w", err)
			}
			out[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("nodes: read sessions: %w", err)
		}
	}
	return out, nil
}
