package terminal

import (
	"context"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestMinimalEnvironment: neither a root command nor a terminal's shell
// inherits the bastion's environment; they get HOME, USER and PATH (and
// the shell TERM and SHELL).
func TestMinimalEnvironment(t *testing.T) {
	t.Setenv("BC_TEST_SECRET", "do-not-pass")
	terms, _, _ := newTerms(t, nil)
	res, err := terms.RunRoot(context.Background(), []string{"/usr/bin/env"}, holding())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(res.Output), "\n") {
		names = append(names, strings.SplitN(l, "=", 2)[0])
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "HOME PATH USER" {
		t.Errorf("root command env = %q", res.Output)
	}
	client, out, done := startServe(t, terms, context.Background(), false)
	typeIn(t, client, "echo \"[$TERM|$SHELL|${BC_TEST_SECRET:-unset}]\"; exit 0\n")
	got := out.waitMatch(t, regexp.MustCompile(`\[([^$\]]*)\]`))
	if got != "xterm-256color|/bin/sh|unset" {
		t.Errorf("shell sees %q", got)
	}
	if err := waitServe(t, done); err != nil {
		t.Fatal(err)
	}
}
