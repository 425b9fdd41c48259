package bcdcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/bastion/agent"
	"github.com/bettercompute/bettercompute/internal/bastion/chainlog"
	"github.com/bettercompute/bettercompute/internal/bastion/forward"
	"github.com/bettercompute/bettercompute/internal/buildinfo"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// DefaultBastionDir is where a bastion keeps its state when --data is not
// given: the person's own config folder (a bastion needs no root).
func DefaultBastionDir() string {
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "bcd-bastion")
	}
	return ".bcd-bastion"
}

// bastionCmd is `bcd bastion`: pair, run, audit verify, and the person's
// on-machine commands (enroll, approve, share, ops, root-grant, anchor).
func bastionCmd(stdin io.Reader) *cobra.Command {
	c := &cobra.Command{Use: "bastion", Short: "Run this machine as a bastion: it dials out and serves only gated lanes"}
	c.AddCommand(bastionPairCmd(stdin), bastionRunCmd(), bastionAuditCmd())
	c.AddCommand(bastionOpsCmds(stdin)...)
	return c
}

func bastionPairCmd(stdin io.Reader) *cobra.Command {
	var dir, gw, name string
	c := &cobra.Command{
		Use:   "pair --gateway ADDR [--data DIR] [--name N]",
		Short: "Pair with the control plane: the token comes from BCD_PAIR_TOKEN or standard input, never an argument",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if gw == "" {
				return &ExitError{Code: 2, Err: errors.New("--gateway is required")}
			}
			if !ids.ValidName(name) {
				return &ExitError{Code: 2, Err: errors.New("--name: " + ids.NameRule)}
			}
			tok, err := readTokenFrom("BCD_PAIR_TOKEN", "pairing token", stdin, cmd.ErrOrStderr())
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			id, err := agent.Pair(cmd.Context(), dir, gw, tok, name)
			if err != nil {
				return joinError(gw, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "paired as bastion %s; state in %s\nnext: bcd bastion run --data %s\n", id, dir, dir)
			return nil
		},
	}
	c.Flags().StringVar(&dir, "data", DefaultBastionDir(), "state directory (0700)")
	c.Flags().StringVar(&gw, "gateway", "", "gateway address host:port")
	c.Flags().StringVar(&name, "name", hostname(), "bastion name")
	return c
}

// forwardsFromEnv is each inference forward's upstream: its environment
// variable when set, else its default on loopback. noForwards drops all.
func forwardsFromEnv(noForwards bool) map[forward.Kind]string {
	out := map[forward.Kind]string{}
	if noForwards {
		return out
	}
	for _, k := range []forward.Kind{forward.KindOllama, forward.KindLLM, forward.KindPII} {
		if v := os.Getenv(k.EnvVar()); v != "" {
			out[k] = v
		} else {
			out[k] = k.DefaultAddr()
		}
	}
	return out
}

func bastionRunCmd() *cobra.Command {
	var dir, level string
	var services []string
	var noForwards, egress bool
	c := &cobra.Command{
		Use:   "run [--data DIR] [--service NAME=unix:PATH]... [--egress]",
		Short: "Run the bastion: hold the stream to the control plane and serve the gated lanes in the tunnel",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := agent.Config{DataDir: dir, Forwards: forwardsFromEnv(noForwards), Log: bastionLogger(cmd.ErrOrStderr(), level), Version: buildinfo.Read().Version, EgressEnabled: egress}
			for _, s := range services {
				svc, err := agent.ParseService(s)
				if err != nil {
					return &ExitError{Code: 2, Err: err}
				}
				cfg.Services = append(cfg.Services, svc)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			a, err := agent.Open(ctx, cfg)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			defer a.Close()
			fmt.Fprintf(cmd.ErrOrStderr(), "bastion %s running; state in %s\n", a.ID(), dir)
			return runBastion(ctx, a)
		},
	}
	c.Flags().StringVar(&dir, "data", DefaultBastionDir(), "state directory from bcd bastion pair")
	c.Flags().StringArrayVar(&services, "service", nil, "expose a server in a service slot: NAME=unix:/path/to.sock (repeatable)")
	c.Flags().BoolVar(&noForwards, "no-forwards", false, "serve no inference forward")
	c.Flags().BoolVar(&egress, "egress", false, "let the control plane open connections to the public internet from this machine (the egress lane; it also needs the egress grant)")
	c.Flags().StringVar(&level, "log-level", "info", "log level")
	return c
}

// bastionLogger logs text at level to w.
func bastionLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// runBastion runs a until ctx ends; an unpair or revocation is an error
// exit with its message.
func runBastion(ctx context.Context, a *agent.Agent) error {
	err := a.Run(ctx)
	if errors.Is(err, agent.ErrUnpaired) || errors.Is(err, agent.ErrRevoked) {
		return &ExitError{Code: 3, Err: err}
	}
	return err
}

func bastionAuditCmd() *cobra.Command {
	c := &cobra.Command{Use: "audit", Short: "The bastion's on-machine audit log"}
	var dir string
	var asJSON bool
	v := &cobra.Command{
		Use:   "verify [--data DIR] [--json]",
		Short: "Check the on-machine audit log's hash chain, line by line",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p := filepath.Join(dir, "audit.log")
			n, err := chainlog.VerifyFile(p)
			if asJSON {
				out := map[string]any{"path": p, "events": n, "ok": err == nil}
				if err != nil {
					out["error"] = err.Error()
				}
				_ = json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			if err != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("%s: %w", p, err)}
			}
			if !asJSON {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %d events, chain intact\n", p, n)
			}
			return nil
		},
	}
	v.Flags().StringVar(&dir, "data", DefaultBastionDir(), "state directory")
	v.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	c.AddCommand(v)
	return c
}
