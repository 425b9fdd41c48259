package driver

import (
	"context"
	"errors"
	"net"
)

// SandboxDialer is a driver that connects to a port on a sandbox's own
// loopback (the sandbox host's driver), for a preview tunnel the node
// verified: the connection is made inside the sandbox's network
// namespace, so it reaches what the sandbox listens on and nothing of
// the host's.
type SandboxDialer interface {
	// DialSandbox connects to 127.0.0.1:port inside sandboxID.
	DialSandbox(ctx context.Context, sandboxID string, port uint16) (net.Conn, error)
}

// Errors of DialSandbox, each a reason the node gives.
var (
	// ErrPreviewSandboxGone: the sandbox is not running on this host,
	// failed, or its deadline passed.
	ErrPreviewSandboxGone = errors.New("preview-sandbox-gone")
	// ErrPreviewUnsupported: the sandbox's runtime cannot be reached from
	// the host (gVisor's netstack, the sim runtime, an unprivileged node).
	ErrPreviewUnsupported = errors.New("preview-unsupported")
)
