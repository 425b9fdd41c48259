package clisafe

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// FlagError turns a flag parsing error into a UsageError (exit 2) that
// names the flag and what it wants, never the value given (a secret typed
// into the wrong flag stays off the screen and out of logs). Both command
// lines install it on their root through GuardArgs.
func FlagError(cmd *cobra.Command, err error) error {
	path := cmd.CommandPath()
	var notExist *pflag.NotExistError
	var invalid *pflag.InvalidValueError
	var needs *pflag.ValueRequiredError
	var syntax *pflag.InvalidSyntaxError
	switch {
	case errors.As(err, &notExist):
		name := "--" + notExist.GetSpecifiedName()
		if s := notExist.GetSpecifiedShortnames(); s != "" {
			name = "-" + s
		}
		return &UsageError{Msg: fmt.Sprintf("%s: unknown flag %s (see %s --help)", path, Clean(name), path)}
	case errors.As(err, &invalid):
		f := invalid.GetFlag()
		return &UsageError{Msg: fmt.Sprintf("%s: --%s: not a valid %s%s (see %s --help)", path, f.Name, f.Value.Type(), example(f.Value.Type()), path)}
	case errors.As(err, &needs):
		return &UsageError{Msg: fmt.Sprintf("%s: --%s needs a value (see %s --help)", path, needs.GetFlag().Name, path)}
	case errors.As(err, &syntax):
		return &UsageError{Msg: fmt.Sprintf("%s: bad flag syntax (see %s --help)", path, path)}
	}
	return &UsageError{Msg: fmt.Sprintf("%s: bad flags (see %s --help)", path, path)}
}

// example shows the form a flag type takes.
func example(typ string) string {
	switch typ {
	case "duration":
		return " such as 90s, 10m or 2h"
	case "int", "int64", "int32", "uint32", "uint64", "uint":
		return " (a whole number)"
	case "float64":
		return " (a number)"
	case "bool":
		return " (true or false)"
	case "stringToString":
		return " (KEY=VALUE)"
	}
	return ""
}
