package server

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/store"
)

// liveCommands answers the secrets broker's secrets.LiveCommands from the
// commands table until the commands module exports it.
// TODO(merge): replace with commands.NewStore(db)
type liveCommands struct{ db *store.DB }

// LivePayload returns the tenant and payload of command commandID when it
// is addressed to nodeID, live and unexpired at now.
func (l liveCommands) LivePayload(ctx context.Context, nodeID, commandID string, now time.Time) (string, []byte, bool, error) {
	var payload []byte
	var tenant string
	err := l.db.QueryRowContext(ctx, `SELECT payload, tenant_id FROM commands WHERE id = $1 AND node_id = $2 AND state IN ($3, $4, $5) AND expires_at > $6`,
		commandID, nodeID, string(wire.LiveStates[0]), string(wire.LiveStates[1]), string(wire.LiveStates[2]), now.UnixMilli()).Scan(&payload, &tenant)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil, false, nil
	}
	if err != nil {
		return "", nil, false, fmt.Errorf("server: read live command: %w", err)
	}
	return tenant, payload, true, nil
}
