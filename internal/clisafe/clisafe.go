// Package clisafe keeps what the command lines print safe for the operator's
// terminal and free of what the operator typed.
//
// Server text (a node's name, an error message, a label) is written by
// whoever controls a node or a tenant; printed raw, an escape sequence in it
// retitles, clears or reprograms the operator's terminal. So the CLIs write
// through a Writer that drops every C0 control but newline and tab, DEL, and
// the C1 controls (U+0080–U+009F, which terminals in UTF-8 mode may treat as
// CSI and friends), and JSON output escapes DEL and the C1 controls as \u00XX
// (encoding/json escapes only C0). Raw byte streams a user asked for (the
// output of a program in a sandbox) bypass the Writer on purpose.
//
// Positional arguments may hold a secret typed in the wrong place (a token,
// a secret value), so argument errors never quote them: GuardArgs replaces
// every command's argument check with one that reports only counts.
package clisafe

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
)

// unsafeRune reports whether r must not reach a terminal.
func unsafeRune(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == utf8.RuneError:
		// An invalid byte: a terminal may still read it as C1 (0x9b).
		return true
	}
	return false
}

// Clean returns s without the runes a terminal would act on.
func Clean(s string) string {
	if strings.IndexFunc(s, unsafeRune) < 0 && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if !unsafeRune(r) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Writer filters what is written to W through Clean. It holds back an
// incomplete UTF-8 sequence at the end of one Write until the next, so a
// rune split across writes is judged whole; Flush is not needed because an
// incomplete sequence left at the end is dropped as invalid anyway.
type Writer struct {
	W       io.Writer
	pending []byte
}

// Write filters p and writes the rest to W. It reports len(p) on success,
// since the dropped bytes were consumed on purpose.
func (w *Writer) Write(p []byte) (int, error) {
	buf := append(w.pending, p...)
	w.pending = nil
	// Keep back a trailing sequence that is only the start of a rune.
	if n := incompleteTail(buf); n > 0 {
		w.pending = append([]byte(nil), buf[len(buf)-n:]...)
		buf = buf[:len(buf)-n]
	}
	out := make([]byte, 0, len(buf))
	for i := 0; i < len(buf); {
		r, size := utf8.DecodeRune(buf[i:])
		if !unsafeRune(r) {
			out = append(out, buf[i:i+size]...)
		}
		i += size
	}
	if _, err := w.W.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// incompleteTail returns how many bytes at the end of b start a UTF-8
// sequence that more bytes could still complete.
func incompleteTail(b []byte) int {
	for n := 1; n <= 3 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c < 0x80 {
			return 0
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-n:]) {
				return n
			}
			return 0
		}
	}
	return 0
}

// Raw returns the writer underneath w when w is a *Writer, so a command can
// pass a byte stream the user asked for through unchanged; any other writer
// is returned as it is.
func Raw(w io.Writer) io.Writer {
	if sw, ok := w.(*Writer); ok {
		return sw.W
	}
	return w
}

// EscapeJSON rewrites DEL and the C1 controls in encoded JSON as \u00XX
// escapes. Outside strings JSON holds only ASCII, so every such rune is in a
// string and the escape keeps the document's meaning.
func EscapeJSON(js []byte) []byte {
	if !bytes.ContainsFunc(js, func(r rune) bool { return r == 0x7f || r >= 0x80 && r <= 0x9f }) {
		return js
	}
	var b bytes.Buffer
	for i := 0; i < len(js); {
		r, size := utf8.DecodeRune(js[i:])
		if r == 0x7f || r >= 0x80 && r <= 0x9f {
			fmt.Fprintf(&b, `\u%04x`, r)
		} else {
			b.Write(js[i : i+size])
		}
		i += size
	}
	return b.Bytes()
}

// GuardArgs walks the command tree under root and gives every command an
// argument check whose errors name counts, never the arguments themselves.
// A command's own rule still decides what is accepted.
func GuardArgs(root *cobra.Command) {
	if !root.HasParent() {
		// cobra adds these at Execute; add them now so they are guarded
		// too, and answer an unknown help topic without quoting it.
		root.InitDefaultCompletionCmd()
		root.SetHelpCommand(helpCmd())
		root.SetFlagErrorFunc(FlagError)
	}
	for _, c := range root.Commands() {
		GuardArgs(c)
	}
	orig := root.Args
	hasSubs := root.HasSubCommands()
	if hasSubs && !root.Runnable() {
		// cobra never checks a group's arguments and answers a typo with
		// help and success; a group that runs reaches the check below.
		root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	root.Args = func(cmd *cobra.Command, args []string) error {
		var err error
		switch {
		case orig != nil:
			err = orig(cmd, args)
		case hasSubs && len(args) > 0:
			// cobra would say `unknown command "ARG"`.
			return &UsageError{Msg: fmt.Sprintf("%s: unknown subcommand (see %s --help)", cmd.CommandPath(), cmd.CommandPath())}
		}
		if err != nil {
			return &UsageError{Msg: fmt.Sprintf("%s: wrong arguments (%d given; see %s --help)", cmd.CommandPath(), len(args), cmd.CommandPath())}
		}
		return nil
	}
}

// helpCmd is cobra's help command without its "Unknown help topic [ARG]".
func helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || cmd == nil || len(rest) > 0 {
				return &UsageError{Msg: fmt.Sprintf("help: unknown command (see %s --help)", c.Root().Name())}
			}
			return cmd.Help()
		},
	}
}

// UsageError is a command line the program cannot take; it names no
// argument. The mains exit 2 on it.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }
