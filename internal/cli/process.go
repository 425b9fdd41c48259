package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/devenv"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
)

func defaultDevDir() string {
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".better-compute", "dev")
	}
	return "bc-dev-data"
}

func devCmd() *cobra.Command {
	var o devenv.Options
	var level string
	c := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole system in one process on loopback: api, gateway, workers, SQLite, a fresh PKI and simulated nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			o.Log = newLogger(cmd.ErrOrStderr(), level)
			abs, err := filepath.Abs(o.DataDir)
			if err != nil {
				return err
			}
			o.DataDir = abs
			fmt.Fprintf(cmd.ErrOrStderr(), "starting: data in %s, %d simulated nodes\n", o.DataDir, o.Nodes)
			e, err := devenv.Start(ctx, o)
			if err != nil {
				return err
			}
			defer e.Close()
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "ready: API %s, gateway %s, %d nodes connected\n\n", e.APIURL, e.CP.GatewayAddr, len(e.NodeIDs))
			fmt.Fprintf(out, "In another shell:\n  . %s\n  better-compute nodes list\n", e.EnvFile)
			if len(e.NodeIDs) > 0 {
				fmt.Fprintf(out, "  better-compute commands run --node %s --kind diag.run --wait --json\n", e.NodeIDs[0])
				fmt.Fprintf(out, "Destructive kinds need an approved batch (approver keys in %s, 2 of 3):\n", filepath.Join(o.DataDir, "approvers"))
				fmt.Fprintf(out, "  better-compute batch create --kind disk.wipe --node %s\n", e.NodeIDs[0])
				fmt.Fprintf(out, "  better-compute batch approve BATCH --key %s\n", filepath.Join(o.DataDir, "approvers", "approver-1.key"))
				fmt.Fprintf(out, "  better-compute commands run --node %s --kind disk.wipe --batch BATCH --wait\n", e.NodeIDs[0])
			}
			fmt.Fprintf(out, "\n%s", e.SandboxHint)
			fmt.Fprintf(out, "\nStop with Ctrl-C; start again with the same --data to keep the fleet.\n")
			<-ctx.Done()
			fmt.Fprintln(cmd.ErrOrStderr(), "stopping")
			return nil
		},
	}
	c.Flags().StringVar(&o.DataDir, "data", defaultDevDir(), "directory that keeps all state (control.db, pki/, nodes/, env)")
	c.Flags().IntVar(&o.Nodes, "nodes", 3, "number of simulated nodes")
	c.Flags().StringVar(&o.APIListen, "api", "127.0.0.1:7780", "address of the public API")
	c.Flags().StringVar(&o.GatewayAddr, "gateway", "127.0.0.1:7781", "address of the node gateway")
	c.Flags().StringVar(&level, "log-level", "warn", "log level: debug, info, warn, error")
	return c
}

func serveCmd() *cobra.Command {
	var dsn, pkiDir, kekFile, roles, apiAddr, gwAddr, gwNames, level, baseURL, sandboxImages string
	var trusted []string
	var cookies bool
	var auditSink string
	var auditSeal time.Duration
	var pprofAddr string
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run control plane roles (api, gateway, workers) against a database",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log := newLogger(cmd.ErrOrStderr(), level)
			if pprofAddr != "" {
				if err := servePprof(ctx, pprofAddr); err != nil {
					return &ExitError{Code: 2, Err: err}
				}
			}
			kek, err := pki.LoadKEK(kekFile)
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: key-encryption key: %w", err)}
			}
			b, err := pki.Load(pkiDir)
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: PKI bundle in %s: %w", pkiDir, err)}
			}
			db, err := store.Open(ctx, dsn)
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: database: %w", err)}
			}
			defer db.Close()
			if err := db.Migrate(ctx); err != nil {
				return err
			}
			proxies, err := api.ParseProxies(trusted)
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: --trusted-proxy: %w", err)}
			}
			var names []string
			if gwNames != "" {
				names = strings.Split(gwNames, ",")
			}
			so := server.Options{DB: db, Bundle: b, KEK: kek, Roles: strings.Split(roles, ","), Clock: clock.Real{}, Log: log, SandboxImages: sandboxImages,
				APIListen: apiAddr, GatewayListen: gwAddr, GatewayNames: names, TrustedProxies: proxies, SessionCookies: cookies, BaseURL: baseURL,
				AuditSealInterval: auditSeal}
			if auditSink != "" {
				sink, err := auditlog.OpenSink(ctx, auditSink)
				if err != nil {
					return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: audit sink: %w", err)}
				}
				defer sink.Close()
				so.AuditSink, so.AuditSinkName = sink, auditSink
			}
			cp, err := server.Start(ctx, so)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			defer cp.Close()
			log.Info("serving", "roles", roles, "api", cp.APIAddr, "gateway", cp.GatewayAddr)
			<-ctx.Done()
			return nil
		},
	}
	c.Flags().StringVar(&dsn, "db", "sqlite:better-compute.db", "database: sqlite:PATH or postgres://…")
	c.Flags().StringVar(&pkiDir, "pki", "pki", "PKI bundle directory (from pki init)")
	c.Flags().StringVar(&kekFile, "kek-file", "kek", "key-encryption key file (0600); BC_KEK overrides")
	c.Flags().StringVar(&roles, "roles", "api,gateway,workers", "roles to run")
	c.Flags().StringVar(&apiAddr, "api", "127.0.0.1:7780", "API listen address")
	c.Flags().StringVar(&gwAddr, "gateway", "127.0.0.1:7781", "gateway listen address")
	c.Flags().StringVar(&gwNames, "gateway-names", "localhost", "comma-separated DNS names for the gateway certificate")
	c.Flags().StringVar(&level, "log-level", "info", "log level")
	c.Flags().StringSliceVar(&trusted, "trusted-proxy", nil, "address or CIDR of a proxy whose X-Forwarded-For is believed (repeatable)")
	c.Flags().BoolVar(&cookies, "session-cookies", false, "accept the bc_session cookie (needs --base-url; Origin must match it exactly)")
	c.Flags().StringVar(&baseURL, "base-url", "", "the API's public URL, such as https://bc.example.com")
	c.Flags().StringVar(&pprofAddr, "pprof", "", "serve Go profiles (net/http/pprof) on this loopback address, for profiling only")
	c.Flags().StringVar(&auditSink, "audit-sink", "", "copy sealed audit rows to this sink: a JSON-lines file path, or a bucket URL (s3://…, file:///…)")
	c.Flags().DurationVar(&auditSeal, "audit-seal-interval", time.Hour, "how often the workers role seals the audit log")
	c.Flags().StringVar(&sandboxImages, "sandbox-images", "", "gocloud.dev/blob URL of the sandbox image store (file:///dir, s3://…); empty: no image imports")
	return c
}

func pkiCmd() *cobra.Command {
	c := &cobra.Command{Use: "pki", Short: "Make and show the PKI bundle"}
	var dir, kekFile, td string
	initC := &cobra.Command{
		Use:   "init",
		Short: "Make a PKI bundle: node CA, internal CA, command-signing root, join key, audit key; private keys sealed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kek, err := pki.LoadKEK(kekFile)
			if errors.Is(err, os.ErrNotExist) {
				kek, err = pki.CreateKEK(kekFile)
				if err == nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "made a new key-encryption key in %s (0600); keep it apart from the bundle\n", kekFile)
				}
			}
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			b, err := pki.Init(dir, td, kek, clock.Real{})
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "PKI bundle for trust domain %s written to %s\n", b.TrustDomain, dir)
			return nil
		},
	}
	initC.Flags().StringVar(&dir, "dir", "pki", "bundle directory")
	initC.Flags().StringVar(&kekFile, "kek-file", "kek", "key-encryption key file (made 0600 if missing); BC_KEK overrides")
	initC.Flags().StringVar(&td, "trust-domain", "bc.local", "SPIFFE trust domain")
	var asJSON bool
	var showDir string
	show := &cobra.Command{
		Use:   "show",
		Short: "Print the bundle's public material (never a private key)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := pki.Load(showDir)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), b.Show())
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), b.Show().String())
			return err
		},
	}
	show.Flags().StringVar(&showDir, "dir", "pki", "bundle directory")
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(initC, show)
	return c
}

// contextOf returns the command's context or Background.
func contextOf(cmd *cobra.Command) context.Context {
	if cmd.Context() != nil {
		return cmd.Context()
	}
	return context.Background()
}

func contextWithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

// servePprof serves net/http/pprof on a loopback address only.
func servePprof(ctx context.Context, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || (host != "127.0.0.1" && host != "::1" && host != "localhost") {
		return errors.New("--pprof must be a loopback address such as 127.0.0.1:6060")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--pprof: %w", err)
	}
	go func() { _ = srv.Serve(lis) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return nil
}
