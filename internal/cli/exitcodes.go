package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// ExitApprovalRequired is the exit status of `bastions op` and `bastions
// terminal` when the bastion asks its person to approve the request on
// the machine first (bcd bastion approve), so a script tells "approve,
// then repeat" from a failure (1) and a usage error (2).
const ExitApprovalRequired = 4

// Exit statuses of a command that exits with another program's status
// (sandbox exec), as docker exec has them: the program's own status, or
// ExitCLIFailed when the CLI or the server failed (usage, configuration,
// an API error, a missing sandbox), so the program's 1 or 2 is never
// mistaken for the CLI's. The node gives 126 (not executable) and 127
// (not found) for a program that could not start.
const (
	ExitCLIFailed = 125
	// programExitCodes marks such a command (an annotation key).
	programExitCodes = "bc-program-exit-codes"
)

// programExit is the exit status of the program a command ran.
type programExit struct{ code int }

func (p *programExit) Error() string { return "the program exited non-zero" }

// programStatus turns the outcome of cmd, when it exits with another
// program's status, into that status or ExitCLIFailed with the CLI's own
// one-line error; any other command's outcome is err unchanged.
func programStatus(cmd *cobra.Command, err error) error {
	if err == nil || cmd == nil || cmd.Annotations[programExitCodes] == "" {
		return err
	}
	var pe *programExit
	if errors.As(err, &pe) {
		return &ExitError{Code: pe.code}
	}
	var ee *ExitError
	if errors.As(err, &ee) && ee.Err != nil {
		err = ee.Err
	}
	// The message alone: Main would exit 2 on a usage error it unwraps.
	return &ExitError{Code: ExitCLIFailed, Err: errors.New(err.Error())}
}
