package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/clisafe"
)

// fanoutStates is the order a fan-out's summary names its states in.
var fanoutStates = []string{"queued", "sent", "running", "succeeded", "failed", "cancelled"}

// fanoutFlags are commands fanout's flags.
type fanoutFlags struct {
	nodes         []string
	labels        map[string]string
	kind, payload string
	ttl, timeout  time.Duration
	wait, asJSON  bool
}

// input checks the flags (usage errors exit 2) and returns the call's
// input.
func (f *fanoutFlags) input() (client.FanoutIn, error) {
	if f.kind == "" || (len(f.nodes) == 0) == (len(f.labels) == 0) {
		return client.FanoutIn{}, &ExitError{Code: 2, Err: errors.New("--kind and either --node or --label (not both) are required")}
	}
	for _, n := range f.nodes {
		if n == "" {
			return client.FanoutIn{}, &ExitError{Code: 2, Err: errors.New("--node must not be empty")}
		}
	}
	if f.payload != "" && !json.Valid([]byte(f.payload)) {
		return client.FanoutIn{}, &ExitError{Code: 2, Err: errors.New("--payload is not valid JSON")}
	}
	if f.ttl < 0 || f.ttl%time.Second != 0 {
		return client.FanoutIn{}, &ExitError{Code: 2, Err: errors.New("--ttl must be a positive whole number of seconds, such as 10m")}
	}
	if f.wait && f.timeout <= 0 {
		return client.FanoutIn{}, &ExitError{Code: 2, Err: errors.New("--timeout must be positive, such as 5m")}
	}
	in := client.FanoutIn{NodeIDs: f.nodes, Labels: f.labels, Kind: f.kind, TTLSeconds: int64(f.ttl / time.Second)}
	if f.payload != "" {
		in.Payload = json.RawMessage(f.payload)
	}
	return in, nil
}

// fanoutCmd queues one command of a kind for many nodes in one call
// (commands.fanout): by node ids or by labels, never both. With --wait it
// shows progress until every command is final and ends with a summary by
// state.
func fanoutCmd() *cobra.Command {
	var f fanoutFlags
	c := &cobra.Command{
		Use:   "fanout (--node ID ... | --label KEY=VALUE ...) --kind KIND [--wait]",
		Short: "Queue one command for many nodes (up to 10,000) in one call, by node ids or labels; --wait for a summary by state",
		Long: "Queue one command for many nodes (up to 10,000) in one call, by node ids or labels. The commands share a fan-out id\n" +
			"(commands list --fanout ID). With --wait, progress goes to standard error (one updating line on a terminal, a line per\n" +
			"change otherwise) and a summary by state to standard output; the exit status is 0 only when every command succeeded.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in, err := f.input()
			if err != nil {
				return err
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			out, err := cl.Fanout(contextOf(cmd), in)
			if err != nil {
				return apiErr(err)
			}
			if !f.wait {
				return printFanout(cmd.OutOrStdout(), out, f.kind, f.asJSON)
			}
			return waitFanout(cmd, cl, out, f)
		},
	}
	fl := c.Flags()
	fl.StringArrayVar(&f.nodes, "node", nil, "node id (repeat for more)")
	fl.StringToStringVar(&f.labels, "label", nil, "label the nodes must carry, KEY=VALUE (repeat for more; all must match)")
	fl.StringVar(&f.kind, "kind", "", "command kind (node.ping, diag.run, ...)")
	fl.StringVar(&f.payload, "payload", "", "JSON payload")
	fl.DurationVar(&f.ttl, "ttl", 0, "how long the commands may wait for their nodes (default 10m, at most 24h)")
	fl.BoolVar(&f.wait, "wait", false, "wait until every command is final, showing progress, and print a summary by state")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "how long --wait waits")
	fl.BoolVar(&f.asJSON, "json", false, "print JSON")
	return c
}

// printFanout prints a fan-out's answer: its id and commands.
func printFanout(w io.Writer, out client.FanoutOut, kind string, asJSON bool) error {
	if asJSON {
		return printJSON(w, out)
	}
	fmt.Fprintf(w, "fan-out %s: queued %s of kind %s\n", out.FanoutID, plural(out.Count, "command"), kind)
	for _, id := range out.CommandIDs {
		fmt.Fprintln(w, id)
	}
	return nil
}

// waitFanout waits for out's commands, showing progress on standard error,
// and prints the summary; the exit status is 1 unless every command
// succeeded.
func waitFanout(cmd *cobra.Command, cl *client.Client, out client.FanoutOut, f fanoutFlags) error {
	ctx, cancel := contextWithTimeout(contextOf(cmd), f.timeout)
	defer cancel()
	tty := isTerminal(os.Stderr) && !f.asJSON
	errw := cmd.ErrOrStderr()
	var progress func(client.FanoutSummary)
	if !f.asJSON {
		progress = fanoutProgress(errw, tty)
	}
	sum, err := cl.WaitFanout(ctx, out.FanoutID, 200*time.Millisecond, progress)
	if tty {
		fmt.Fprintln(errw)
	}
	if err != nil && (sum.FanoutID == "" || ctx.Err() == nil) {
		return &ExitError{Code: 1, Err: fmt.Errorf("waiting for fan-out %s: %w", out.FanoutID, apiErr(err))}
	}
	if f.asJSON {
		if perr := printJSON(cmd.OutOrStdout(), struct {
			client.FanoutOut
			Summary client.FanoutSummary `json:"summary"`
		}{out, sum}); perr != nil {
			return perr
		}
	} else {
		fmt.Fprintf(cmd.OutOrStdout(), "fan-out %s: %s: %s\n", out.FanoutID, plural(sum.Total, "command"), byState(sum))
	}
	switch {
	case !sum.Done():
		return &ExitError{Code: 1, Err: fmt.Errorf("fan-out %s: gave up after %s with commands unfinished; see commands list --fanout %s", out.FanoutID, f.timeout, out.FanoutID)}
	case sum.States["succeeded"] != sum.Total:
		return &ExitError{Code: 1}
	}
	return nil
}

// fanoutProgress shows a fan-out's progress on w: one line rewritten in
// place on a terminal, else a line per change.
func fanoutProgress(w io.Writer, tty bool) func(client.FanoutSummary) {
	return func(s client.FanoutSummary) {
		if !tty {
			fmt.Fprintln(w, fanoutLine(s))
			return
		}
		// Back to the line's start and clear it (our own controls, raw);
		// the line itself is filtered like all server text.
		_, _ = io.WriteString(clisafe.Raw(w), "\r\x1b[K")
		fmt.Fprint(w, fanoutLine(s))
	}
}

// fanoutLine is a progress line: how many commands are final, and the
// counts by state.
func fanoutLine(s client.FanoutSummary) string {
	final := s.States["succeeded"] + s.States["failed"] + s.States["cancelled"]
	return fmt.Sprintf("fan-out %s: %d/%d final (%s)", s.FanoutID, final, s.Total, byState(s))
}

// byState names the summary's nonzero counts in fanoutStates order.
func byState(s client.FanoutSummary) string {
	var parts []string
	for _, st := range fanoutStates {
		if n := s.States[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// plural is "1 command", "2 commands".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
