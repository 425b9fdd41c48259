// Package terminal runs the bastion's terminals and root commands, and
// records each one: a terminal is the bastion user's shell on a PTY joined
// to a connection from the control plane, and a root command is one fixed
// argv run while the root command grant given on this machine holds.
//
// It does not decide whether the person approved a terminal or gave the
// grant: the caller checks approvals and passes the grant in. What it
// checks itself, on every call:
//
//   - A root terminal and a root command need the bastion to run as root
//     (Config.IsRoot), or they are refused (ReasonNotRoot) before anything
//     starts.
//   - A root command needs the grant to hold when it starts
//     (ReasonNoRootGrant), and a watcher re-reads the grant every 500 ms
//     and at its end: once it no longer holds, the command's process group
//     is killed, so a revoke or an expiry stops it within 2 seconds.
//   - A root command's argv[0] is an absolute path and argv is run as it
//     is, never through a shell (ReasonBadArgv).
//   - A terminal's shell, its children and its background jobs end with the
//     session: when the connection closes or ctx ends, every process in the
//     shell's session is killed (on Linux, found through /proc; elsewhere
//     the shell's process group) and the shell is reaped.
//
// Every terminal and root command is written to a transcript, one file per
// session or command, 0600 in Dir/transcripts (0700): a terminal's output
// byte for byte with each chunk of input as a marked line, a command's
// argv, combined output and end. A write to a transcript that fails ends
// the session or command: nothing runs unrecorded. Each start, end and
// refusal goes to Config.Audit; only malformed requests (a session id that
// is not one) are refused without an audit line.
//
// What it does not defend: a process that leaves the shell's session (a
// daemon that calls setsid) outlives it, as it would any terminal; the
// shell runs with this process's own rights, so a root terminal is root.
// Transcripts are not capped: the shell can fill the disk as its user can
// anyway. A terminal's input records hold what was typed, passwords to
// programs that turn echo off included; that is why transcripts are 0600.
package terminal
