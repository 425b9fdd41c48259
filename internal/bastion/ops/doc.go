// Package ops is the bastion's op server: the one place where the control
// plane acts on the person's machine, and only in the shapes the person
// allowed (issue 19; the wire is b19-wire.md).
//
// An op arrives as POST /v1/op on PortOps inside the tunnel. Decode reads
// it strictly (one JSON object of at most 256 KiB, exactly the listed keys
// at every level, a known kind, args matching the kind's schema by shape);
// a malformed op is refused INVALID_INPUT and never audited. Server.Do
// then decides whether the op may run, runs it through its handler (a
// dedicated Go handler per kind, never a shell) and audits the outcome.
// GET /v1/terminal is decided the same way as the kind "terminal" bound
// to {"session", "root"}, then switches protocols to bc-term-v1 and hands
// the connection to Terminals.
//
// # The decision
//
// Checked in this order (decide); the first that refuses answers:
//
//	kind                         check                              refusal
//	root:run, terminal root=1    the bastion runs as root           ACCESS_DENIED not-root
//	terminal root=0              the bastion does not run as root   ACCESS_DENIED terminal-would-be-root
//	root:run                     write lanes open                   ACCESS_DENIED writes-locked
//	root:run                     Root.Run holds the root grant      (Root's reason)
//	observe:*, files:list|stat|read  none: reads run at once        (the handler's reason)
//	writes (below)               write lanes open                   ACCESS_DENIED writes-locked
//	                             a second factor enrolled           ACCESS_DENIED factor-not-enrolled
//	                             the kind's own pre-check           (CheckMoves / Check / PlanSummary reason)
//	                             with "approval": Spend it once     ACCESS_DENIED (the approval store's reason),
//	                               bound to kind and Digest           and the refused write is counted
//	                             else (not terminal) a standing     -
//	                               grant for the kind (UseStanding)
//	                             else Ask the person                APPROVAL_REQUIRED approval-required,
//	                                                                  with the request id, expiry and Summary
//
// Writes are files:move-plan, action:dry-run, action:apply and terminal.
// The pre-check runs before any approval is asked or spent, so a request
// that cannot run never reaches the person. A terminal never runs on a
// standing grant: each session needs its own approval.
//
// # Audit
//
// Every well-formed op's outcome is one Config.Audit call: AuditOp ("op")
// with the kind, op id and how it was allowed, or AuditRefuse
// ("op-refuse") with the reason (also approval-required, and "internal"
// for a failure that is not a refusal). Malformed ops and terminal
// requests with bad upgrade headers or query are refused with no audit.
//
// # Refusals
//
// A refusal is a *RefusedError with a wire Code and a kebab-case Reason.
// Other packages' refusals (share, action, terminal, approval) are
// recognised through interface{ RefusalReason() string } and passed on
// with their reason: NOT_FOUND for "not-found" and "unknown-..." reasons,
// ACCESS_DENIED otherwise. netguard's refusals of an observe:net host are
// passed on with netguard's reason, as the egress lane does. An error that
// is not a refusal is answered 500 INTERNAL_ERROR, its detail only logged.
//
// Observe ops change nothing: observe:disk reads statfs of "/" and each
// shared folder, observe:procs the names in /proc/<pid>/comm (at most
// 500), observe:net opens one TCP connection through the egress guard
// (5 s) and closes it.
package ops
