package daemon

import (
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// SetReconnectPacing makes n's reconnect back-off wait on clk and draw its
// delay with jitter (tests pass a fake clock and a jitter that returns the
// ceiling, to see the back-off itself). Call it before Run.
func SetReconnectPacing(n *Node, clk clock.Clock, jitter func(ceiling time.Duration) time.Duration) {
	n.pacing = pacing{clock: clk, jitter: jitter}
}
