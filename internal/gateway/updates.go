package gateway

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
)

// pendingUpdate is one update waiting for the batcher, and where its
// result goes.
type pendingUpdate struct {
	item wire.UpdateItem
	done chan wire.UpdateResult
}

// maxUpdateBatch bounds how many updates go into one transaction.
const maxUpdateBatch = 1024

// batchUpdates writes updates from every session in shared transactions:
// it takes what is waiting (up to maxUpdateBatch) as soon as one arrives,
// so a quiet gateway adds no delay and a busy one amortises each commit.
func (g *Gateway) batchUpdates(ctx context.Context) {
	for {
		var batch []*pendingUpdate
		select {
		case <-ctx.Done():
			return
		case p := <-g.updates:
			batch = append(batch, p)
		}
	fill:
		for len(batch) < maxUpdateBatch {
			select {
			case p := <-g.updates:
				batch = append(batch, p)
			default:
				break fill
			}
		}
		items := make([]wire.UpdateItem, len(batch))
		for i, p := range batch {
			items[i] = p.item
		}
		res := g.cmds.ApplyUpdates(ctx, items)
		for i, p := range batch {
			p.done <- res[i]
		}
	}
}

// applyUpdate hands one update to the batcher and waits for its result.
func (g *Gateway) applyUpdate(ctx context.Context, item wire.UpdateItem) (wire.UpdateResult, error) {
	p := &pendingUpdate{item: item, done: make(chan wire.UpdateResult, 1)}
	select {
	case g.updates <- p:
	case <-ctx.Done():
		return wire.UpdateResult{}, ctx.Err()
	}
	select {
	case r := <-p.done:
		return r, nil
	case <-ctx.Done():
		return wire.UpdateResult{}, ctx.Err()
	}
}
