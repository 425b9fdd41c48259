package terminal

// The reasons a terminal or a root command is refused (RefusedError.Reason).
const (
	// ReasonNotRoot: a root terminal or a root command while the bastion
	// does not run as root.
	ReasonNotRoot = "not-root"
	// ReasonNoRootGrant: a root command with no root command grant, or one
	// whose end has passed.
	ReasonNoRootGrant = "no-root-grant"
	// ReasonBadArgv: a root command whose argv is empty, longer than
	// MaxArgs, has a relative argv[0], or holds a NUL byte.
	ReasonBadArgv = "bad-argv"
	// ReasonBadSession: a terminal session id that is not 1 to 64 letters,
	// digits, '_' or '-'. It is malformed, so it is not audited.
	ReasonBadSession = "bad-session"
)

// Audit kinds passed to Config.Audit.
const (
	// KindTerminal is a terminal's open and close.
	KindTerminal = "terminal"
	// KindTerminalRefuse is a refused terminal, or one that could not be
	// set up (reason EventSetupFailed).
	KindTerminalRefuse = "terminal-refuse"
	// KindRootRun is a root command's start and end.
	KindRootRun = "root-run"
	// KindRootRefuse is a refused root command, or one that could not be
	// set up (reason EventSetupFailed).
	KindRootRefuse = "root-refuse"
)

// Audit reasons for what is not a refusal.
const (
	// EventOpen is a terminal opened.
	EventOpen = "open"
	// EventClose is a terminal closed.
	EventClose = "close"
	// EventStart is a root command started.
	EventStart = "start"
	// EventEnd is a root command that ended by itself; one that was
	// stopped is audited with its Result.Stopped as the reason.
	EventEnd = "end"
	// EventSetupFailed is a terminal or command that could not start (no
	// transcript, no PTY, no such program).
	EventSetupFailed = "setup-failed"
)

// RefusedError is a refusal with a stable Reason; Detail is safe to show
// (it holds no argument of the request).
type RefusedError struct {
	Reason string
	Detail string
}

// Error returns the reason and the detail.
func (e *RefusedError) Error() string { return e.Reason + ": " + e.Detail }

// RefusalReason returns Reason, so that other packages recognise a refusal
// through interface{ RefusalReason() string }.
func (e *RefusedError) RefusalReason() string { return e.Reason }

// refuse audits a refusal of a well-formed request and returns it.
func (t *Terminals) refuse(kind, reason, detail, auditDetail string) error {
	t.audit(kind, reason, auditDetail)
	t.log.Info("terminal: refused", "kind", kind, "reason", reason)
	return &RefusedError{Reason: reason, Detail: detail}
}
