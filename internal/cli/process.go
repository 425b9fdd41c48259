package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/config"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/devenv"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/pprofserve"
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
	var tunnelPorts []uint
	c := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole system in one process on loopback: api, gateway, workers, lanes, preview, SQLite, a fresh PKI, simulated nodes and a bastion",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			o.Log = newLogger(cmd.ErrOrStderr(), level)
			o.Progress = cmd.ErrOrStderr()
			ports, err := daemon.ParseTunnelPorts("--tunnel-ports", tunnelPorts)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			o.TunnelPorts = ports
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
			fmt.Fprintf(out, "Console: %s/console/ (sign in with the API key in %s)\n\n", e.APIURL, e.KeyFile)
			fmt.Fprintf(out, "In another shell:\n  . %s\n  better-compute nodes list\n", e.EnvFile)
			if len(e.NodeIDs) > 0 {
				fmt.Fprintf(out, "  better-compute commands run --node %s --kind diag.run --wait --json\n", e.NodeIDs[0])
				fmt.Fprintf(out, "Destructive kinds need an approved batch (approver keys in %s, 2 of 3):\n", filepath.Join(o.DataDir, "approvers"))
				fmt.Fprintf(out, "  better-compute batch create --kind disk.wipe --node %s\n", e.NodeIDs[0])
				fmt.Fprintf(out, "  better-compute batch approve BATCH --key %s\n", filepath.Join(o.DataDir, "approvers", "approver-1.key"))
				fmt.Fprintf(out, "  better-compute commands run --node %s --kind disk.wipe --batch BATCH --wait\n", e.NodeIDs[0])
			}
			fmt.Fprintf(out, "\n%s", e.SandboxHint)
			if e.BastionHint != "" {
				fmt.Fprintf(out, "\n%s", e.BastionHint)
			}
			fmt.Fprintf(out, "\nStop with Ctrl-C; start again with the same --data to keep the fleet.\n")
			<-ctx.Done()
			fmt.Fprintln(cmd.ErrOrStderr(), "stopping")
			return nil
		},
	}
	c.Flags().StringVar(&o.DataDir, "data", defaultDevDir(), "directory that keeps all state (control.db, pki/, nodes/, env)")
	c.Flags().IntVar(&o.Nodes, "nodes", 3, "number of simulated nodes")
	c.Flags().BoolVar(&o.InstallPackages, "install-packages", true, "as root, install what sandboxes need (busybox-static, runc) with apt-get when it is missing (false: only say what to run)")
	c.Flags().BoolVar(&o.Bastion, "bastion", true, "pair one local bastion (DATA/bastion) forwarding a stand-in model server on loopback, granted inference on tinyllama:latest (--bastion=false: none)")
	c.Flags().UintSliceVar(&tunnelPorts, "tunnel-ports", []uint{22}, "ports on 127.0.0.1 the simulated nodes let tunnels reach (comma-separated), as bcd node --tunnel-port")
	defaults := config.Default()
	c.Flags().StringVar(&o.APIListen, "api", defaults.API.Listen, "address of the public API")
	c.Flags().StringVar(&o.GatewayAddr, "gateway", defaults.Gateway.Listen, "address of the node gateway")
	c.Flags().StringVar(&level, "log-level", "warn", "log level: debug, info, warn, error")
	return c
}

func serveCmd() *cobra.Command {
	cfg := config.Default()
	var cfgFile, pprofAddr string
	roles := strings.Join(cfg.Roles, ",")
	names := strings.Join(cfg.Gateway.Names, ",")
	trusted := strings.Join(cfg.API.TrustedProxies, ",")
	apiNames := strings.Join(cfg.API.Names, ",")
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run control plane roles (api, gateway, workers, lanes) against a database",
		Long: "Run control plane roles against a database. Settings come from --config (TOML, strict; see docs/operations.md)\n" +
			"and from flags, which override the file.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Flags given on the command line win over the file.
			set := map[string]string{}
			cmd.Flags().Visit(func(f *pflag.Flag) { set[f.Name] = f.Value.String() })
			if cfgFile != "" {
				loaded, err := config.Read(cfgFile)
				if err != nil {
					return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: %w", err)}
				}
				cfg = loaded
				roles, names, trusted = strings.Join(cfg.Roles, ","), strings.Join(cfg.Gateway.Names, ","), strings.Join(cfg.API.TrustedProxies, ",")
				apiNames = strings.Join(cfg.API.Names, ",")
				for name, v := range set {
					if err := cmd.Flags().Set(name, v); err != nil {
						return &ExitError{Code: 2, Err: err}
					}
				}
			}
			cfg.Roles, cfg.Gateway.Names, cfg.API.TrustedProxies = splitList(roles), splitList(names), splitList(trusted)
			cfg.API.Names = splitList(apiNames)
			if err := cfg.Validate(); err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: %w", err)}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log := newLogger(cmd.ErrOrStderr(), cfg.LogLevel)
			if pprofAddr != "" {
				if err := pprofserve.Serve(ctx, pprofAddr); err != nil {
					return &ExitError{Code: 2, Err: err}
				}
			}
			return Serve(ctx, cfg, log, nil, nil)
		},
	}
	f := c.Flags()
	f.StringVar(&cfgFile, "config", "", "TOML configuration file (strict: unknown keys are refused); flags override it")
	f.StringVar(&cfg.Database.DSN, "db", cfg.Database.DSN, "database: sqlite:PATH or postgres://…")
	f.StringVar(&cfg.PKI.Dir, "pki", cfg.PKI.Dir, "PKI bundle directory (from pki init)")
	f.StringVar(&cfg.PKI.KEKFile, "kek-file", cfg.PKI.KEKFile, "key-encryption key file (0600); BC_KEK overrides; not read by a gateway-only process")
	f.StringVar(&roles, "roles", roles, "roles to run, comma-separated")
	f.StringVar(&cfg.API.Listen, "api", cfg.API.Listen, "API listen address")
	f.StringVar(&cfg.Metrics.Listen, "metrics", cfg.Metrics.Listen, "Prometheus /metrics listen address (loopback by default; never the API listener); empty: none")
	f.StringVar(&cfg.Gateway.Listen, "gateway", cfg.Gateway.Listen, "gateway listen address")
	f.StringVar(&cfg.Lanes.Listen, "lanes-listen", cfg.Lanes.Listen, "UDP ip:port of the lanes role's WireGuard tunnel (with --roles ...,lanes)")
	f.StringVar(&cfg.Lanes.Advertise, "lanes-advertise", cfg.Lanes.Advertise, "host:port bastions dial for the tunnel (default: --lanes-listen)")
	f.StringVar(&cfg.Preview.Listen, "preview-listen", cfg.Preview.Listen, "ip:port of the preview role's proxy of sandbox preview URLs (with --roles ...,preview)")
	f.StringVar(&cfg.Preview.URL, "preview-url", cfg.Preview.URL, "public base URL of preview URLs (default: https://<preview-listen>)")
	f.StringVar(&names, "gateway-names", names, "comma-separated DNS names for the gateway certificate")
	f.StringVar(&cfg.Gateway.CertFile, "gateway-cert", cfg.Gateway.CertFile, "the gateway's certificate (pki issue-gateway); a gateway without the api role needs it")
	f.StringVar(&cfg.Gateway.KeyFile, "gateway-key", cfg.Gateway.KeyFile, "the gateway's key (0600, pki issue-gateway)")
	f.StringVar(&cfg.Gateway.Control, "control", cfg.Gateway.Control, "host:port of the api's internal channel (its --internal); a gateway without the api role relays to it")
	f.StringVar(&cfg.API.InternalListen, "internal", cfg.API.InternalListen, "host:port where the api serves the internal channel gateway-only processes relay to")
	addServeTLSFlags(f, &cfg, &apiNames)
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log level: debug, info, warn, error")
	f.StringVar(&trusted, "trusted-proxies", trusted, "comma-separated addresses or CIDRs of proxies whose X-Forwarded-For is believed")
	f.BoolVar(&cfg.API.SessionCookies, "session-cookies", cfg.API.SessionCookies, "accept the bc_session cookie (needs --base-url; Origin must match it exactly)")
	f.StringVar(&cfg.API.BaseURL, "base-url", cfg.API.BaseURL, "the API's public URL, such as https://bc.example.com")
	f.StringVar(&pprofAddr, "pprof", "", "serve Go profiles (net/http/pprof) on this loopback address, for profiling only")
	f.StringVar(&cfg.Audit.Sink, "audit-sink", cfg.Audit.Sink, "copy sealed audit rows to this sink: a JSON-lines file path, or a bucket URL (s3://…, file:///…)")
	f.StringVar(&cfg.Audit.SealInterval, "audit-seal-interval", cfg.Audit.SealInterval, "how often the workers role seals the audit log")
	f.StringVar(&cfg.Sandboxes.Images, "sandbox-images", cfg.Sandboxes.Images, "gocloud.dev/blob URL of the sandbox image store (file:///dir, s3://…); empty: no image imports")
	return c
}

// Serve runs cfg's roles until ctx ends: what `serve` does once its
// configuration is read and valid. db, when set, is used instead of
// opening cfg.Database.DSN (tests share theirs); started, when set, is
// called once the roles run. The api and workers roles load the sealed PKI
// bundle and the key-encryption key; a gateway-only process loads neither:
// it reads the bundle's public half and its own certificate and key (pki
// issue-gateway) and relays what needs a key to gateway.control.
func Serve(ctx context.Context, cfg config.Config, log *slog.Logger, db *store.DB, started func(*server.ControlPlane)) error {
	var kek pki.KEK
	var b *pki.Bundle
	var err error
	if cfg.Keyed() {
		if kek, err = pki.LoadKEK(cfg.PKI.KEKFile); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: pki.kek_file: %w", err)}
		}
		// A deployment made before the break-glass SSH CA existed gets one.
		b, _, err = pki.EnsureBreakGlassCA(cfg.PKI.Dir, kek)
	} else {
		b, err = pki.LoadPublic(cfg.PKI.Dir)
	}
	if err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: pki.dir %s: %w", cfg.PKI.Dir, err)}
	}
	if db == nil {
		if db, err = store.Open(ctx, cfg.Database.DSN); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: database.dsn: %w", err)}
		}
		defer db.Close()
	}
	if err := db.Migrate(ctx); err != nil {
		return err
	}
	so, err := server.FromConfig(cfg)
	if err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: %w", err)}
	}
	so.DB, so.Bundle, so.KEK, so.Log = db, b, kek, log
	if cfg.Gateway.CertFile != "" {
		cert, err := pki.LoadGatewayCert(cfg.Gateway.CertFile, cfg.Gateway.KeyFile)
		if err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: gateway.cert_file: %w", err)}
		}
		so.GatewayCert = &cert
	}
	if cfg.API.CertFile != "" {
		if so.APICert, err = loadAPICert(cfg.API.CertFile, cfg.API.KeyFile); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: %w", err)}
		}
	}
	if cfg.Audit.Sink != "" {
		sink, err := auditlog.OpenSink(ctx, cfg.Audit.Sink)
		if err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: audit.sink: %w", err)}
		}
		defer sink.Close()
		so.AuditSink = sink
	}
	cp, err := server.Start(ctx, so)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	defer cp.Close()
	log.Info("serving", "roles", strings.Join(cfg.Roles, ","), "api", cp.APIAddr, "gateway", cp.GatewayAddr, "internal", cp.InternalAddr, "metrics", cp.MetricsAddr)
	if started != nil {
		started(cp)
	}
	select {
	case <-ctx.Done():
	case <-cp.Done():
	}
	return cp.Err()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
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
	var asJSON, apiCA bool
	var showDir string
	show := &cobra.Command{
		Use:   "show",
		Short: "Print the bundle's public material (never a private key)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := pki.LoadPublic(showDir)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if apiCA {
				_, err = cmd.OutOrStdout().Write(b.APICAPEM())
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), b.Show())
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), b.Show().String())
			return err
		},
	}
	show.Flags().StringVar(&showDir, "dir", envOr(envPKI, "pki"), "bundle directory (default $BC_PKI, else pki)")
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	show.Flags().BoolVar(&apiCA, "api-ca", false, "print only the PEM of the CAs an API client trusts (BC_CA_FILE), every one while the internal CA rotates")
	c.AddCommand(initC, show, issueGatewayCmd(), pkiRotateCmd(clock.Real{}), rotateKEKCmd())
	return c
}

func issueGatewayCmd() *cobra.Command {
	var dir, kekFile, out, names, ips string
	var lifetime time.Duration
	var force bool
	c := &cobra.Command{
		Use:   "issue-gateway",
		Short: "Write what a gateway-only process needs: the bundle's public half and a gateway certificate and key",
		Long: "Issue a gateway certificate from the internal CA (spiffe://<td>/gateway; server and client authentication) and write\n" +
			"OUT/bundle.json (public half: no sealed key), OUT/gateway.crt and OUT/gateway.key (0600). Run it where the KEK is;\n" +
			"copy OUT to the gateway host and run `serve --roles gateway --pki OUT --gateway-cert OUT/gateway.crt\n" +
			"--gateway-key OUT/gateway.key --control API:PORT` there, without the KEK.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kek, err := pki.LoadKEK(kekFile)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			b, err := pki.Load(dir)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			key, err := b.InternalCAKey(kek)
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_CONFIG: the internal CA key does not unseal with this key-encryption key: %w", err)}
			}
			ipList := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
			for _, s := range splitList(ips) {
				ip := net.ParseIP(s)
				if ip == nil {
					return &ExitError{Code: 2, Err: fmt.Errorf("INVALID_INPUT: --ips: %q is not an IP address", s)}
				}
				ipList = append(ipList, ip)
			}
			if err := refuseExisting(force, filepath.Join(out, pki.BundleFile), filepath.Join(out, pki.GatewayCertFile), filepath.Join(out, pki.GatewayKeyFile)); err != nil {
				return err
			}
			cert, err := pki.IssueGatewayCert(b.InternalCA, key, b.TrustDomain, splitList(names), ipList, lifetime, time.Now())
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if err := b.WriteGatewayFiles(out, cert); err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "gateway files for %s written to %s (certificate expires %s)\n", b.TrustDomain, out, timeText(cert.Leaf.NotAfter))
			return nil
		},
	}
	c.Flags().StringVar(&dir, "pki", "pki", "bundle directory")
	c.Flags().StringVar(&kekFile, "kek-file", "kek", "key-encryption key file; BC_KEK overrides")
	c.Flags().StringVar(&out, "out", "gateway", "directory to write bundle.json, gateway.crt and gateway.key into")
	forceFlag(c, &force)
	c.Flags().StringVar(&names, "names", "localhost", "comma-separated DNS names nodes reach the gateway by")
	c.Flags().StringVar(&ips, "ips", "", "comma-separated IP addresses nodes reach the gateway by (loopback is always included)")
	c.Flags().DurationVar(&lifetime, "lifetime", 90*24*time.Hour, "certificate lifetime (at most 398 days)")
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
