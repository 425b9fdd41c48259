package cli

import (
	"bytes"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/clisafe"
)

// On a terminal, fan-out progress rewrites one line in place (the CLI's
// own \r and erase-line, raw) while the server's text in it stays
// filtered; off a terminal it is plain lines.
func TestFanoutProgressOnTerminal(t *testing.T) {
	var buf bytes.Buffer
	show := fanoutProgress(&clisafe.Writer{W: &buf}, true)
	show(client.FanoutSummary{FanoutID: "fo1\x1b]0;pwned\a", Total: 2, States: map[string]int{"running": 1, "succeeded": 1}})
	show(client.FanoutSummary{FanoutID: "fo1", Total: 2, States: map[string]int{"succeeded": 2}})
	want := "\r\x1b[Kfan-out fo1]0;pwned: 1/2 final (1 running, 1 succeeded)\r\x1b[Kfan-out fo1: 2/2 final (2 succeeded)"
	if buf.String() != want {
		t.Fatalf("terminal progress %q, want %q", buf.String(), want)
	}
	buf.Reset()
	show = fanoutProgress(&clisafe.Writer{W: &buf}, false)
	show(client.FanoutSummary{FanoutID: "fo1", Total: 3, States: map[string]int{"queued": 1, "failed": 1, "cancelled": 1}})
	if want := "fan-out fo1: 2/3 final (1 queued, 1 failed, 1 cancelled)\n"; buf.String() != want {
		t.Fatalf("plain progress %q, want %q", buf.String(), want)
	}
}
