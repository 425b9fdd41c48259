// Package bcdcli is the bcd command line: join, node, and tools. It only
// parses flags and wires the daemon; the daemon's logic is package daemon.
package bcdcli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bettercompute/bettercompute/internal/buildinfo"
	"github.com/bettercompute/bettercompute/internal/clisafe"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/fleetsim"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/netguard/egresscmd"
	"github.com/bettercompute/bettercompute/internal/pprofserve"
	"github.com/bettercompute/bettercompute/internal/sshca"
)

// ExitError carries an exit status for main.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// NewRoot builds bcd's command tree; the join command reads its token from
// stdin when BCD_JOIN_TOKEN is not set.
func NewRoot(stdin io.Reader) *cobra.Command {
	root := &cobra.Command{Use: "bcd", Short: "bcd: the Better Compute node daemon", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(joinCmd(stdin), bastionCmd(stdin), nodeCmd(), sshdConfigCmd(), simulateCmd(), egresscmd.NewEgressCommand(), egresscmd.NewProxyCommand())
	root.AddCommand(helperCmd())
	root.AddCommand(installCmds()...)
	root.AddCommand(pluginCmds()...)
	buildinfo.AddVersionFlag(root)
	clisafe.GuardArgs(root)
	return root
}

// Main runs bcd with args and returns the exit status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := NewRoot(stdin)
	stdout = &clisafe.Writer{W: stdout}
	stderr = &clisafe.Writer{W: stderr}
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ue *clisafe.UsageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "error:", ue)
		return 2
	}
	var egress *egresscmd.ExitError
	if errors.As(err, &egress) {
		return egress.Code // the egress commands print their own verdicts
	}
	code := 1
	var ee *ExitError
	if errors.As(err, &ee) {
		code = ee.Code
		err = ee.Err
	}
	if err != nil {
		fmt.Fprintln(stderr, "error:", err)
	}
	return code
}

// readToken takes the join token from BCD_JOIN_TOKEN or standard input,
// never from an argument, and never echoes it.
func readToken(stdin io.Reader, stderr io.Writer) (string, error) {
	return readTokenFrom("BCD_JOIN_TOKEN", "join token", stdin, stderr)
}

// readTokenFrom takes a one-time token from the environment variable env
// or standard input (a terminal is asked without echo), never from an
// argument.
func readTokenFrom(env, what string, stdin io.Reader, stderr io.Writer) (string, error) {
	if t := strings.TrimSpace(os.Getenv(env)); t != "" {
		return t, nil
	}
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(stderr, what+": ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(stderr)
		if err != nil {
			return "", fmt.Errorf("read token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read token: %w", err)
	}
	t := strings.TrimSpace(line)
	if t == "" {
		return "", fmt.Errorf("no %s: set %s or pipe it on standard input", what, env)
	}
	return t, nil
}

func joinCmd(stdin io.Reader) *cobra.Command {
	var o daemon.JoinOptions
	c := &cobra.Command{
		Use:   "join",
		Short: "Join the fleet: the token comes from BCD_JOIN_TOKEN or standard input, never an argument",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Gateway == "" {
				return &ExitError{Code: 2, Err: errors.New("--gateway is required")}
			}
			if !ids.ValidName(o.Name) {
				return &ExitError{Code: 2, Err: errors.New("--name: " + ids.NameRule)}
			}
			tok, err := readToken(stdin, cmd.ErrOrStderr())
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			o.Token = tok
			rec, err := daemon.Join(cmd.Context(), o)
			if err != nil {
				return joinError(o.Gateway, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "joined as %s; state in %s\n", rec.NodeID, o.DataDir)
			return nil
		},
	}
	c.Flags().StringVar(&o.Gateway, "gateway", "", "gateway address host:port")
	c.Flags().StringVar(&o.DataDir, "data", "/var/lib/bcd", "state directory (0700)")
	c.Flags().StringVar(&o.Name, "name", hostname(), "node name")
	return c
}

// hostname is the default node name: the machine's host name, or its
// first label when the whole name is not a valid node name.
func hostname() string {
	h, _ := os.Hostname()
	if !ids.ValidName(h) {
		h, _, _ = strings.Cut(h, ".")
	}
	return h
}

// openSandboxHost opens the node's own sandbox host (a root node) in
// front of d, and runs its deadlines until ctx ends.
func openSandboxHost(ctx context.Context, cmd *cobra.Command, sbx sandbox.Options, dir string, log *slog.Logger, d driver.Driver) (driver.Driver, error) {
	sbx.DataDir, sbx.Clock, sbx.Log = dir, clock.Real{}, log
	h, closeImages, err := sandbox.Open(cmd.Context(), sbx)
	switch {
	case errors.Is(err, sandbox.ErrNoRuntime):
		log.Info("no sandbox runtime on this host")
		return d, nil
	case err != nil:
		return nil, &ExitError{Code: 2, Err: err}
	}
	context.AfterFunc(ctx, closeImages)
	go h.Run(ctx, time.Second) // deadlines hold with or without a session
	log.Info("sandbox host ready", "runtime", h.Runtime())
	return &sandbox.Driver{Driver: d, Host: h}, nil
}

// helperEvents drains the root helper's events over its socket.
func helperEvents(c *helperwire.Client) daemon.HelperEventSource {
	return func(ctx context.Context) ([]helperwire.Event, int, error) {
		res, err := c.Call(ctx, &helperwire.Request{Op: helperwire.OpEventsDrain})
		if err != nil {
			return nil, 0, err
		}
		var evs helperwire.Events
		if err := json.Unmarshal(res, &evs); err != nil {
			return nil, 0, fmt.Errorf("helper events: %w", err)
		}
		return evs.Events, evs.Dropped, nil
	}
}

func simulateCmd() *cobra.Command {
	var o fleetsim.Options
	var tokensFile, level, pprofAddr string
	var hold time.Duration
	var renewAll bool
	c := &cobra.Command{
		Use:   "simulate --nodes N --gateway ADDR --tokens-file FILE --data DIR",
		Short: "Run N simulated nodes in one process, each on the real daemon code path",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if o.Gateway == "" || o.DataDir == "" {
				return &ExitError{Code: 2, Err: errors.New("--gateway and --data are required")}
			}
			if tokensFile != "" {
				toks, err := fleetsim.ReadTokens(tokensFile)
				if err != nil {
					return &ExitError{Code: 2, Err: err}
				}
				o.Tokens = toks
			}
			if pprofAddr != "" {
				if err := pprofserve.Serve(ctx, pprofAddr); err != nil {
					return &ExitError{Code: 2, Err: err}
				}
			}
			var l slog.Level
			_ = l.UnmarshalText([]byte(level))
			o.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l}))
			tty := isTTY(cmd.ErrOrStderr())
			o.Progress = func(n int) {
				if tty && (n%100 == 0 || n == o.Nodes) {
					fmt.Fprintf(cmd.ErrOrStderr(), "\rjoined %d/%d", n, o.Nodes)
				}
			}
			return simulate(ctx, cmd, o, renewAll, hold)
		},
	}
	c.Flags().IntVar(&o.Nodes, "nodes", 100, "number of simulated nodes")
	c.Flags().StringVar(&o.Gateway, "gateway", "", "gateway address host:port")
	c.Flags().StringVar(&tokensFile, "tokens-file", "", "0600 file with one join token per line, for nodes not yet joined")
	c.Flags().StringVar(&o.DataDir, "data", "", "directory for the nodes' state")
	c.Flags().Float64Var(&o.JoinRate, "join-rate", 0, "joins per second (0: unlimited)")
	c.Flags().IntVar(&o.Parallel, "parallel", 32, "joins in flight at once")
	c.Flags().DurationVar(&hold, "hold", 0, "how long to hold the sessions (0: until interrupted)")
	c.Flags().BoolVar(&renewAll, "renew-all", false, "once connected, renew every certificate at once and report the rate")
	c.Flags().StringVar(&level, "log-level", "error", "log level")
	c.Flags().StringVar(&pprofAddr, "pprof", "", "serve Go profiles (net/http/pprof) on this loopback address, for profiling only")
	return c
}

// simulate runs the fleet of o, prints the connected report (with the
// renewal rate when renewAll) and holds the sessions for hold, or until
// ctx ends when hold is 0.
func simulate(ctx context.Context, cmd *cobra.Command, o fleetsim.Options, renewAll bool, hold time.Duration) error {
	tty := isTTY(cmd.ErrOrStderr())
	f, rep, err := fleetsim.Start(ctx, o)
	if tty {
		fmt.Fprintln(cmd.ErrOrStderr())
	}
	if err != nil {
		return err
	}
	defer f.Stop()
	start := time.Now()
	if err := f.WaitConnected(ctx, o.Nodes); err != nil {
		return err
	}
	rep.Connected = f.Connected()
	out := map[string]any{"event": "connected", "report": rep, "connect_seconds": time.Since(start).Seconds()}
	if renewAll {
		rate, err := f.RenewAll(ctx, 64)
		if err != nil {
			return err
		}
		out["renewals_per_second"] = rate
	}
	b, _ := json.Marshal(out)
	fmt.Fprintln(cmd.OutOrStdout(), string(b))
	if hold > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(hold):
		}
	} else {
		<-ctx.Done()
	}
	return nil
}

func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// DefaultSSHDDir is where bcd node on the linux driver writes the
// break-glass sshd files unless --sshd-dir says otherwise.
const DefaultSSHDDir = "/etc/ssh/bettercompute"

// sshdDirFor is the sshd file directory: flag when set, else
// DefaultSSHDDir on the linux driver and DATA/sshd on any other.
func sshdDirFor(flag, drv, data string) string {
	switch {
	case flag != "":
		return flag
	case drv == "linux":
		return DefaultSSHDDir
	}
	abs, err := filepath.Abs(filepath.Join(data, "sshd"))
	if err != nil {
		return filepath.Join(data, "sshd")
	}
	return abs
}

// sshdConfigCmd prints the sshd_config lines that make sshd use the files
// bcd node writes, for operators to add to sshd_config.
func sshdConfigCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "sshd-config [--sshd-dir DIR]",
		Short: "Print the sshd_config lines for break-glass SSH (the CA, principals and KRL files bcd node writes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := sshca.SSHDConfigSnippet(dir)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			_, err = io.WriteString(cmd.OutOrStdout(), s)
			return err
		},
	}
	c.Flags().StringVar(&dir, "sshd-dir", DefaultSSHDDir, "the directory given to bcd node --sshd-dir")
	return c
}
