package daemon

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
)

// ErrRevoked is what Run returns (wrapped in a *RevokedError) when the
// gateway refuses the node's session because the control plane revoked
// its certificate. Run does not reconnect then: nothing the node can do
// with that certificate will be accepted again, so retrying forever would
// only fill the log. bcd node exits 1 with the error's text, which says
// how to re-join.
var ErrRevoked = errors.New("certificate revoked")

// RevokedError says which node was revoked and how to bring the machine
// back.
type RevokedError struct {
	NodeID, DataDir, Gateway string
}

// Error names the node and the commands that re-join it.
func (e *RevokedError) Error() string {
	return fmt.Sprintf("node %s: the control plane revoked this node's certificate, so bcd stops instead of reconnecting. "+
		"To re-join this machine: have an operator create a new join token (better-compute join-tokens create --role node --out token.txt), "+
		"move %s aside, run BCD_JOIN_TOKEN=$(cat token.txt) bcd join --gateway %s --data %s, then start bcd node again",
		e.NodeID, e.DataDir, e.Gateway, e.DataDir)
}

// Is makes errors.Is(err, ErrRevoked) true.
func (e *RevokedError) Is(target error) bool { return target == ErrRevoked }

// isRevokedStatus reports whether err is the gateway's refusal of a
// revoked certificate (wire.RevokedMessage).
func isRevokedStatus(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unauthenticated && st.Message() == wire.RevokedMessage
}
