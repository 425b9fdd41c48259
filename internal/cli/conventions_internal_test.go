package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestCellText: table cells show times in the API's one format, sizes
// human-readable and whole numbers without an exponent.
func TestCellText(t *testing.T) {
	for _, c := range []struct {
		col  string
		v    any
		want string
	}{
		{"created_at", "2026-12-01T20:12:42.1+02:00", "2026-12-01T18:12:42.100Z"},
		{"created_at", "2026-12-01T18:12:42Z", "2026-12-01T18:12:42.000Z"},
		{"created_at", "soon", "soon"},
		{"name", "2026-12-01T18:12:42Z", "2026-12-01T18:12:42Z"},
		{"size_bytes", float64(512), "512 B"},
		{"size_bytes", float64(1536), "1.5 KiB"},
		{"size_bytes", float64(1 << 30), "1.0 GiB"},
		{"size_bytes", int64(24 << 30), "24.0 GiB"},
		{"memory_mb", float64(2048), "2.0 GiB"},
		{"count", float64(1e6), "1000000"},
		{"ratio", 0.5, "0.5"},
		{"attested", true, "true"},
	} {
		if got := cellText(c.col, c.v); got != c.want {
			t.Errorf("cellText(%s, %v) = %q, want %q", c.col, c.v, got, c.want)
		}
	}
	if got := timeText(time.Date(2026, 12, 1, 18, 12, 42, 7_000_000, time.FixedZone("x", -3600))); got != "2026-12-01T19:12:42.007Z" {
		t.Errorf("timeText = %q", got)
	}
	if timeText(time.Time{}) != "-" {
		t.Error("the zero time is not -")
	}
}

// walk calls fn for every command of the tree.
func walk(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, s := range c.Commands() {
		walk(s, fn)
	}
}

// TestFlagTypesRender: every flag's help shows a one-word type (pflag
// takes the first `backquoted` word of the usage as the type, so a
// backquoted phrase such as `audit key` would show as the type).
func TestFlagTypesRender(t *testing.T) {
	walk(NewRoot(), func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			name, _ := pflag.UnquoteUsage(f)
			if strings.ContainsAny(name, " \t") {
				t.Errorf("%s --%s shows the type %q", c.CommandPath(), f.Name, name)
			}
		})
	})
}

// TestShowNotGet: no visible command is named get; sandbox get still runs
// sandbox show, hidden.
func TestShowNotGet(t *testing.T) {
	walk(NewRoot(), func(c *cobra.Command) {
		if c.Name() == "get" && !c.Hidden {
			t.Errorf("%s is visible: name it show", c.CommandPath())
		}
	})
	root := NewRoot()
	show, _, err := root.Find([]string{"sandbox", "show"})
	if err != nil || show.Name() != "show" {
		t.Fatalf("sandbox show: %v", err)
	}
	get, _, err := root.Find([]string{"sandbox", "get"})
	if err != nil || get.Name() != "get" || !get.Hidden || get.Flags().Lookup("json") == nil {
		t.Fatalf("sandbox get is not a hidden alias with show's flags: %v", err)
	}
}

// TestConfirmOrYes: --yes skips the question; with no terminal and no
// --yes the answer is a refusal, exit 2; on a terminal only y or yes
// confirms, anything else refuses, exit 1.
func TestConfirmOrYes(t *testing.T) {
	terminal := false
	old := stdinIsTerminal
	stdinIsTerminal = func() bool { return terminal }
	defer func() { stdinIsTerminal = old }()
	ask := func(yes bool, in string) (string, error) {
		c := &cobra.Command{}
		var errb bytes.Buffer
		c.SetIn(strings.NewReader(in))
		c.SetErr(&errb)
		err := confirmOrYes(c, yes, "sign it?")
		return errb.String(), err
	}
	code := func(err error) int {
		var ee *ExitError
		if errors.As(err, &ee) {
			return ee.Code
		}
		return -1
	}
	if _, err := ask(true, ""); err != nil {
		t.Fatalf("--yes: %v", err)
	}
	if _, err := ask(false, "y\n"); code(err) != 2 || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("no terminal: %v", err)
	}
	terminal = true
	for _, in := range []string{"y\n", "YES\n", " yes \n"} {
		if prompt, err := ask(false, in); err != nil || !strings.Contains(prompt, "sign it? [y/N]") {
			t.Errorf("%q: %v (%q)", in, err, prompt)
		}
	}
	for _, in := range []string{"\n", "n\n", "yess\n", ""} {
		if _, err := ask(false, in); code(err) != 1 {
			t.Errorf("%q: %v, want exit 1", in, err)
		}
	}
}
