// Package egresscmd holds the cobra commands for the egress guard:
// `bcd egress check TARGET` (judge a target the way every egress dial
// would) and `bcd egress-proxy` (run the egress proxy).
//
// The commands report their outcome through the process exit code, carried
// by *ExitError. The caller's main must turn a returned error into an exit
// code, for example:
//
//	if err := root.Execute(); err != nil {
//		os.Exit(egresscmd.ExitCode(err))
//	}
//
// Exit codes of `egress check`: 0 allowed, 3 refused, 2 bad input (a
// malformed target, flag or allow-list entry), 1 any other failure (the
// name did not resolve).
package egresscmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// Exit codes used by the commands.
const (
	ExitAllowed  = 0
	ExitFailure  = 1
	ExitBadInput = 2
	ExitRefused  = 3
)

// ExitError carries the process exit code a command wants. Main must call
// os.Exit(Code) (see ExitCode); the message has already been printed.
type ExitError struct {
	// Code is the process exit code (ExitRefused, ExitBadInput, ...).
	Code int
	// Err is the underlying failure or refusal, if any.
	Err error
}

// Error describes the failure.
func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode maps an error returned by a command to a process exit code: 0
// for nil, the code of an *ExitError, and 1 for anything else.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return ExitFailure
}

// deps are the injectable parts, so tests need no DNS and no real network.
type deps struct {
	resolver netguard.Resolver
	local    netguard.LocalChecker
	// onListen, when set, is told the proxy's listening address.
	onListen func(net.Addr)
}

func (d deps) dialer(allow []string) (*netguard.Dialer, error) {
	return netguard.NewDialer(netguard.Config{Allow: allow, Resolver: d.resolver, Local: d.local})
}

// fail prints msg to the command's stderr and returns an ExitError.
func fail(cmd *cobra.Command, code int, err error) error {
	fmt.Fprintf(cmd.ErrOrStderr(), "error: %v\n", err)
	return &ExitError{Code: code, Err: err}
}

// NewEgressCommand returns the `egress` command with its `check`
// subcommand.
func NewEgressCommand() *cobra.Command { return newEgressCommand(deps{}) }

func newEgressCommand(d deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "egress",
		Short: "Inspect the egress guard's rules",
		Long: "The egress guard lets sandboxes, coder runs and the egress lane reach the public\n" +
			"internet and nothing on this machine or its network that nobody named.",
		SilenceUsage: true,
	}
	cmd.AddCommand(newCheckCommand(d))
	return cmd
}

// addrJSON and checkJSON are the --json output.
type addrJSON struct {
	Address     string `json:"address"`
	Verdict     string `json:"verdict"`
	Reason      string `json:"reason,omitempty"`
	AllowListed bool   `json:"allow_listed,omitempty"`
	Detail      string `json:"detail,omitempty"`
}

type checkJSON struct {
	Target    string     `json:"target"`
	Verdict   string     `json:"verdict"`
	Reason    string     `json:"reason,omitempty"`
	Addresses []addrJSON `json:"addresses"`
}

func verdictOf(r netguard.Reason) string {
	if r.Refused() {
		return netguard.VerdictRefused
	}
	return netguard.VerdictAllowed
}

func newCheckCommand(d deps) *cobra.Command {
	var (
		allow  []string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "check TARGET",
		Short: "Say whether the egress guard would let a target be dialed, and why",
		Long: "check judges TARGET (an IP address or a host name, which it resolves) as every\n" +
			"egress dial does, and prints the verdict and the reason for each address.\n" +
			"Exit status: 0 allowed, 3 refused, 2 bad input, 1 lookup failure.",
		SilenceUsage:  true,
		SilenceErrors: true, // messages are printed here; main only exits
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fail(cmd, ExitBadInput, fmt.Errorf("check takes exactly one TARGET, got %d", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			dl, err := d.dialer(allow)
			if err != nil {
				return fail(cmd, ExitBadInput, err)
			}
			dec, err := dl.Check(cmd.Context(), "tcp", args[0])
			if errors.Is(err, netguard.ErrBadTarget) {
				return fail(cmd, ExitBadInput, err)
			}
			if err != nil {
				return fail(cmd, ExitFailure, err)
			}
			if err := printDecision(cmd.OutOrStdout(), dec, asJSON); err != nil {
				return fail(cmd, ExitFailure, err)
			}
			if !dec.Allowed {
				return &ExitError{Code: ExitRefused, Err: dec.Err()}
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return fail(c, ExitBadInput, err) })
	cmd.Flags().StringArrayVar(&allow, "allow-lan", nil, "host name, address or CIDR to reach despite the rules (repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the verdict as JSON")
	return cmd
}

func printDecision(w io.Writer, dec netguard.Decision, asJSON bool) error {
	if asJSON {
		out := checkJSON{Target: dec.Target, Verdict: verdictOf(dec.Reason), Reason: string(dec.Reason), Addresses: []addrJSON{}}
		for _, v := range dec.Addrs {
			out.Addresses = append(out.Addresses, addrJSON{
				Address: v.Addr.String(), Verdict: verdictOf(v.Reason), Reason: string(v.Reason),
				AllowListed: v.AllowListed, Detail: v.Detail,
			})
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
		return nil
	}
	var err error
	if dec.Allowed {
		_, err = fmt.Fprintf(w, "%s: allowed\n", dec.Target)
	} else {
		_, err = fmt.Fprintf(w, "%s: refused (%s)\n", dec.Target, dec.Reason)
	}
	for _, v := range dec.Addrs {
		if err != nil {
			break
		}
		line := fmt.Sprintf("  %-40s %s", v.Addr, verdictOf(v.Reason))
		if v.Reason.Refused() {
			line += " (" + string(v.Reason) + ")"
		}
		if v.AllowListed {
			line += " [allow list]"
		}
		if v.Detail != "" && !v.AllowListed {
			line += " [" + v.Detail + "]"
		}
		_, err = fmt.Fprintln(w, line)
	}
	if err != nil {
		return fmt.Errorf("write verdict: %w", err)
	}
	return nil
}

// NewProxyCommand returns the `egress-proxy` command, which serves the
// egress proxy (HTTP CONNECT and absolute-form HTTP) until interrupted.
func NewProxyCommand() *cobra.Command { return newProxyCommand(deps{}) }

func newProxyCommand(d deps) *cobra.Command {
	var (
		listen, metricsListen string
		allow                 []string
	)
	cmd := &cobra.Command{
		Use:   "egress-proxy",
		Short: "Serve an HTTP egress proxy that reaches only the public internet",
		Long: "egress-proxy serves HTTP CONNECT and plain HTTP forwarding. Every target is\n" +
			"resolved once, every address checked, and only checked addresses are dialed;\n" +
			"a refused target is answered 403 with the reason code. One JSON log line per\n" +
			"connection goes to stderr.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 0 {
				return fail(cmd, ExitBadInput, fmt.Errorf("egress-proxy takes no arguments"))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			logger := slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil))
			dl, err := d.dialer(allow)
			if err != nil {
				return fail(cmd, ExitBadInput, err)
			}
			reg := prometheus.NewRegistry()
			p, err := netguard.NewProxy(netguard.ProxyConfig{Dialer: dl, Logger: logger, Registerer: reg})
			if err != nil {
				return fail(cmd, ExitFailure, err)
			}
			var lc net.ListenConfig
			ln, err := lc.Listen(ctx, "tcp", listen)
			if err != nil {
				return fail(cmd, ExitFailure, fmt.Errorf("listen %s: %w", listen, err))
			}
			if metricsListen != "" {
				mln, err := lc.Listen(ctx, "tcp", metricsListen)
				if err != nil {
					_ = ln.Close()
					return fail(cmd, ExitFailure, fmt.Errorf("listen %s: %w", metricsListen, err))
				}
				go serveMetrics(ctx, mln, reg, logger)
			}
			logger.LogAttrs(ctx, slog.LevelInfo, "egress proxy listening", slog.String("addr", ln.Addr().String()))
			if d.onListen != nil {
				d.onListen(ln.Addr())
			}
			if err := p.Serve(ctx, ln); err != nil {
				return fail(cmd, ExitFailure, err)
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return fail(c, ExitBadInput, err) })
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:3128", "address to serve the proxy on")
	cmd.Flags().StringArrayVar(&allow, "allow-lan", nil, "host name, address or CIDR to reach despite the rules (repeatable)")
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", "address to serve Prometheus /metrics on (off when empty)")
	return cmd
}

// serveMetrics serves the proxy's registry on /metrics until ctx is done.
func serveMetrics(ctx context.Context, ln net.Listener, reg *prometheus.Registry, logger *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.LogAttrs(ctx, slog.LevelError, "egress metrics server stopped", slog.String("error", err.Error()))
	}
}
