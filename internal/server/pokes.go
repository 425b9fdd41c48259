package server

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/store"
)

// pokeChannel is the PostgreSQL notification channel that carries pokes
// between control plane processes.
const pokeChannel = "bc_poke"

// bridged are the topics one process's pokes are forwarded for: a signed
// command (so a gateway in another process sends it at once instead of at
// its next sweep), a revocation (so it closes the session at once instead
// of at its next poll) and a session that moved to another gateway (so the
// gateway that held it closes its copy at once), and revocation-feed
// entries the workers signed (so every gateway relays them at once), and a
// bastion's changed grants or unpairing (so the gateway and the lanes role
// act at once), and a change that narrows access (so every process's API
// drops what it cached about callers at once).
var bridged = []string{bus.TopicSigned, bus.TopicRevoked, bus.TopicSessions, bus.TopicRevocationsSigned, bus.TopicBastions, bus.TopicAccessChanged}

// bridgePokes forwards the bridged topics to other processes through
// PostgreSQL NOTIFY, and republishes what other processes send under
// bus.RemoteTopic, so a poke never loops back. On SQLite (one process) it
// does nothing: polling covers a second process. Its loops run in the
// roles' group.
func (cp *ControlPlane) bridgePokes(o Options) {
	if cp.DB.Dialect != store.Postgres {
		return
	}
	db, b, log := cp.DB, cp.Bus, o.Log
	cp.pokes = newPokeLiveness(o.Clock)
	cp.runLoop(func(ctx context.Context) { cp.pokes.beat(ctx, db) })
	for _, topic := range bridged {
		ch, stop := b.Subscribe(topic)
		cp.runLoop(func(ctx context.Context) {
			defer stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-ch:
					if err := db.Notify(ctx, pokeChannel, topic); err != nil && ctx.Err() == nil {
						log.Warn("forward poke", "topic", topic, "err", err)
					}
				}
			}
		})
	}
	cp.runLoop(func(ctx context.Context) {
		for ctx.Err() == nil {
			err := db.Listen(ctx, pokeChannel, func(payload string) {
				if cp.pokes.heard(payload) {
					return
				}
				for _, t := range bridged {
					if payload == t {
						b.Publish(bus.RemoteTopic(t))
					}
				}
			})
			cp.pokes.down()
			if ctx.Err() != nil {
				return
			}
			log.Warn("poke listener stopped; restarting", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	})
}
