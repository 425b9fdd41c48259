package nodev1

// MaxMessageBytes bounds every message of the node protocol, in both
// directions, on the gateway and on bcd. The largest legitimate message is
// a CommandUpdate carrying a sandbox exec result: two streams of up to
// 8 MiB each, base64 inside the result's JSON (about 21.4 MiB), plus the
// signature and ids. 32 MiB holds that with room and still bounds what one
// authenticated node can make the gateway buffer.
const MaxMessageBytes = 32 << 20

// MaxTunnelData bounds the data of one TunnelFrame: a sender splits
// larger writes, and a receiver refuses a larger frame.
const MaxTunnelData = 32 << 10

// The node's reasons for refusing a tunnel (TunnelHello.refused), besides
// a ticket's own reason (internal/tickets): the gateway relays them to the
// client.
const (
	// TunnelPortNotAllowed: the ticket's port is not on the node's own
	// allow list (bcd node --tunnel-port).
	TunnelPortNotAllowed = "tunnel-port-not-allowed"
	// TunnelDialFailed: nothing answered on 127.0.0.1:<port> on the node.
	TunnelDialFailed = "tunnel-dial-failed"
	// ExecSandboxGone: an exec's sandbox is not running on the node (or
	// its deadline passed).
	ExecSandboxGone = "exec-sandbox-gone"
	// ExecUnsupported: the node's sandbox runtime has no interactive exec.
	ExecUnsupported = "exec-unsupported"
	// ExecFailed: the program could not be started.
	ExecFailed = "exec-failed"
	// PreviewSandboxGone: a preview's sandbox is not running on the node
	// (or its deadline passed).
	PreviewSandboxGone = "preview-sandbox-gone"
	// PreviewUnsupported: the sandbox's runtime cannot be reached from the
	// host (gVisor's netstack, the sim runtime, an unprivileged node).
	PreviewUnsupported = "preview-unsupported"
	// PreviewDialFailed: nothing answered on 127.0.0.1:<port> inside the
	// sandbox.
	PreviewDialFailed = "preview-dial-failed"
)
