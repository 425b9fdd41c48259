package cli

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// stdinIsTerminal reports whether the CLI can ask its user (tests replace
// it).
var stdinIsTerminal = func() bool { return isTerminal(os.Stdin) }

// confirmOrYes asks question on standard error and reads the answer from
// standard input, when that is a terminal. yes (the command's --yes) skips
// the question. With no terminal and no --yes it refuses, exit 2, naming
// --yes: a script must say so. An answer other than y or yes refuses,
// exit 1.
func confirmOrYes(cmd *cobra.Command, yes bool, question string) error {
	if yes {
		return nil
	}
	if !stdinIsTerminal() {
		return &ExitError{Code: 2, Err: errors.New("standard input is not a terminal to ask on: review, then pass --yes")}
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "%s [y/N] ", question)
	line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
	if err != nil && line == "" {
		return &ExitError{Code: 1, Err: errors.New("no answer: nothing done")}
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return &ExitError{Code: 1, Err: errors.New("not confirmed: nothing done")}
}
