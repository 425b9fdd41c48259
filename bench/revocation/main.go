// Command revocation is the revocation feed's staleness benchmark behind
// bench/revocation/run. In one process it starts a control plane (all
// roles) and N connected simulated nodes on the real daemon code path
// (each with its own key, certificate, mutual-TLS session and the
// break-glass sshaccess driver over the sim driver), then revokes in a
// loop and prints, per kind, the time from the revoke call's start until
// its effect: the node's session closed (node-cert), an open tunnel closed
// (api-key), the node's KRL holds the serial (ssh-cert, through the feed);
// median and p99, beside the round trip of a no-op command (node.ping) in
// the same run, as a ratio.
package main

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sync/errgroup"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sshaccess"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
)

func main() {
	nodes := flag.Int("nodes", 1000, "connected simulated nodes")
	rounds := flag.Int("rounds", 30, "revocations of each kind")
	dbKind := flag.String("db", "postgres", "postgres or sqlite")
	pgDSN := flag.String("pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL admin DSN")
	flag.Parse()
	if err := run(*dbKind, *pgDSN, *nodes, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "revocation:", err)
		os.Exit(1)
	}
}

// bench is the running system.
type bench struct {
	cp     *server.ControlPlane
	admin  *client.Client
	url    string
	agents []*agent
	port   uint32
}

// agent is one simulated node with its sshaccess driver and its hooks.
type agent struct {
	*daemon.Node
	ssh   *sshaccess.Driver
	down  chan struct{}
	revs  chan string
	once  sync.Once
	ready chan struct{}
}

func run(dbKind, pgDSN string, n, rounds int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bc-revocation-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, cleanup, err := openDB(ctx, dbKind, pgDSN, dir)
	if err != nil {
		return err
	}
	defer cleanup()
	b, err := start(ctx, db, dir)
	if err != nil {
		return err
	}
	defer b.cp.Close()
	t0 := time.Now()
	if err := b.startNodes(ctx, dir, n); err != nil {
		return err
	}
	fmt.Printf("%s: %d nodes connected in %.1fs; %d rounds of each kind\n", dbKind, n, time.Since(t0).Seconds(), rounds)
	res := map[string][]time.Duration{}
	for i := 0; i < rounds; i++ {
		for _, m := range []struct {
			kind string
			f    func(context.Context, int) (time.Duration, error)
		}{{"node.ping (baseline)", b.ping}, {"node-cert: session closed", b.revokeNode}, {"api-key: tunnel closed", b.revokeKey}, {"ssh-cert: in the node's KRL", b.revokeSSH}} {
			d, err := m.f(ctx, i)
			if err != nil {
				return fmt.Errorf("%s round %d: %w", m.kind, i, err)
			}
			res[m.kind] = append(res[m.kind], d)
		}
	}
	printTable(res)
	return nil
}

// openDB opens a fresh database of kind.
func openDB(ctx context.Context, kind, pgDSN, dir string) (*store.DB, func(), error) {
	dsn := "sqlite:" + filepath.Join(dir, "control.db")
	cleanup := func() {}
	if kind == "postgres" {
		admin, err := sql.Open("pgx", pgDSN)
		if err != nil {
			return nil, nil, err
		}
		_, _ = admin.ExecContext(ctx, `DROP DATABASE IF EXISTS bc_revocation_bench`)
		if _, err := admin.ExecContext(ctx, `CREATE DATABASE bc_revocation_bench`); err != nil {
			return nil, nil, err
		}
		dsn = strings.Replace(pgDSN, "/postgres?", "/bc_revocation_bench?", 1)
		cleanup = func() {
			_, _ = admin.ExecContext(context.Background(), `DROP DATABASE IF EXISTS bc_revocation_bench`)
			admin.Close()
		}
	}
	db, err := store.Open(ctx, dsn)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	if err := db.Migrate(ctx); err != nil {
		db.Close()
		cleanup()
		return nil, nil, err
	}
	return db, func() { db.Close(); cleanup() }, nil
}

// start starts the control plane with every role, and an echo server the
// tunnels reach.
func start(ctx context.Context, db *store.DB, dir string) (*bench, error) {
	kek, err := pki.CreateKEK(filepath.Join(dir, "kek"))
	if err != nil {
		return nil, err
	}
	bundle, err := pki.Init(filepath.Join(dir, "pki"), "bench.bc.local", kek, clock.NewFake(time.Now().Add(-48*time.Hour)))
	if err != nil {
		return nil, err
	}
	o := server.Options{DB: db, Bundle: bundle, KEK: kek, Clock: clock.Real{}, Log: slog.New(slog.DiscardHandler),
		APIListen: "127.0.0.1:0", APIPlainHTTP: true, TenantMutates: 1 << 16,
		RateLimits: api.RateLimits{ReadPerSecond: 1e6, ReadBurst: 1e6, MutatePerSecond: 1e6, MutateBurst: 1e6}}
	cp, err := server.Start(ctx, o)
	if err != nil {
		return nil, err
	}
	_, key, err := cp.APIKeys.Create(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "bench"}, iam.RootTenant, "admin", "admin", 0)
	if err != nil {
		cp.Close()
		return nil, err
	}
	url := "http://" + cp.APIAddr
	b := &bench{cp: cp, admin: client.New(url, key), url: url}
	if b.port, err = echoServer(); err != nil {
		cp.Close()
		return nil, err
	}
	return b, nil
}

// startNodes joins and connects n nodes, 32 joins at a time.
func (b *bench) startNodes(ctx context.Context, dir string, n int) error {
	chains := pki.NewWorkerChainCache(0)
	b.agents = make([]*agent, n)
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			name := fmt.Sprintf("sim-%d", i)
			nd := filepath.Join(dir, "nodes", name)
			tok, err := b.cp.Nodes.CreateJoinToken(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "bench"}, pki.RoleNode, name, 10*time.Minute)
			if err != nil {
				return err
			}
			if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: nd, Gateway: b.cp.GatewayAddr, Token: tok.Token, Name: name}); err != nil {
				return fmt.Errorf("join %s: %w", name, err)
			}
			sa := &sshaccess.Driver{Driver: driver.NewSim(name), Dir: filepath.Join(nd, "sshd"), StateDir: nd}
			node, err := daemon.Open(daemon.Config{DataDir: nd, Gateway: b.cp.GatewayAddr, Driver: sa, Clock: clock.Real{},
				Log: slog.New(slog.DiscardHandler), TunnelPorts: []uint32{b.port}, WorkerChains: chains})
			if err != nil {
				return err
			}
			sa.SetNodeID(node.NodeID())
			a := &agent{Node: node, ssh: sa, down: make(chan struct{}, 1), revs: make(chan string, 16), ready: make(chan struct{})}
			node.OnState(func(up bool) {
				if up {
					a.once.Do(func() { close(a.ready) })
				} else {
					select {
					case a.down <- struct{}{}:
					default:
					}
				}
			})
			node.OnRevocation(func(kind, reason string) { a.revs <- kind + reason })
			b.agents[i] = a
			go func() { _ = node.Run(context.WithoutCancel(ctx)) }()
			select {
			case <-a.ready:
				return nil
			case <-time.After(2 * time.Minute):
				return fmt.Errorf("%s did not connect", name)
			}
		})
	}
	return g.Wait()
}

// waitCommand waits for command id to be final.
func (b *bench) waitCommand(ctx context.Context, id string) (commands.Command, error) {
	poke, stop := b.cp.Bus.Subscribe(bus.CommandTopic(id))
	defer stop()
	deadline := time.After(time.Minute)
	for {
		c, err := b.cp.Commands.Get(ctx, iam.RootScope(), id)
		if err != nil || commands.Terminal(c.State) {
			return c, err
		}
		select {
		case <-poke:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			return c, fmt.Errorf("command %s still %s", id, c.State)
		}
	}
}

// ping is the baseline: node.ping's round trip, create to final.
func (b *bench) ping(ctx context.Context, i int) (time.Duration, error) {
	a := b.agents[(i*7)%len(b.agents)]
	start := time.Now()
	c, err := b.admin.CreateCommand(ctx, a.NodeID(), "node.ping", nil)
	if err != nil {
		return 0, err
	}
	if _, err := b.waitCommand(ctx, c.ID); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// pick returns the agent a kind uses in round i: each kind its own
// quarter of the fleet, a node never used twice.
func (b *bench) pick(kind, i int) *agent {
	q := len(b.agents) / 4
	return b.agents[kind*q+i%q]
}

// revokeNode revokes a node's certificate and times its session's close.
func (b *bench) revokeNode(ctx context.Context, i int) (time.Duration, error) {
	a := b.pick(1, i)
	start := time.Now()
	if err := b.admin.Call(ctx, "nodes.revoke", apitypes.NodeRevokeIn{NodeID: a.NodeID()}, nil); err != nil {
		return 0, err
	}
	select {
	case <-a.down:
		return time.Since(start), nil
	case <-time.After(time.Minute):
		return 0, errors.New("the session did not close")
	}
}

// revokeKey opens a tunnel with a fresh key and times its close after the
// key's revocation.
func (b *bench) revokeKey(ctx context.Context, i int) (time.Duration, error) {
	a := b.pick(2, i)
	id, key, err := b.cp.APIKeys.Create(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "bench"}, iam.RootTenant, "admin", "tunnel-"+strconv.Itoa(i), 0)
	if err != nil {
		return 0, err
	}
	tun, err := client.New(b.url, key).OpenTunnel(ctx, a.NodeID(), int(b.port))
	if err != nil {
		return 0, err
	}
	defer tun.Close()
	if _, err := tun.Write([]byte("x")); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(tun, make([]byte, 1)); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := b.admin.Call(ctx, "apiKeys.revoke", apitypes.IDIn{ID: id}, nil); err != nil {
		return 0, err
	}
	stop := time.AfterFunc(time.Minute, func() { tun.Close() })
	defer stop.Stop()
	_, err = io.ReadAll(tun)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != "ACCESS_DENIED" {
		return 0, fmt.Errorf("tunnel ended with %v", err)
	}
	return time.Since(start), nil
}

// revokeSSH issues a certificate (its state applied), revokes it and
// times until the node's KRL holds the serial through the feed.
func (b *bench) revokeSSH(ctx context.Context, i int) (time.Duration, error) {
	a := b.pick(3, i)
	pub, err := sshKey()
	if err != nil {
		return 0, err
	}
	// An identity of its own each round: one gets 20 certificates an hour.
	who, err := b.admin.CreateIdentity(ctx, "", "ssh-"+strconv.Itoa(i), "person")
	if err != nil {
		return 0, err
	}
	if err := b.admin.Bind(ctx, "", who.ID, "admin"); err != nil {
		return 0, err
	}
	k, err := b.admin.CreateAPIKey(ctx, "", who.ID, "ssh-"+strconv.Itoa(i), 0)
	if err != nil {
		return 0, err
	}
	var out breakglass.Issued
	if err := client.New(b.url, k.Key).Call(ctx, "nodes.issueSshCert", breakglass.IssueIn{NodeID: a.NodeID(), Account: "root", PublicKey: pub}, &out); err != nil {
		return 0, err
	}
	if out.CommandID != "" {
		if _, err := b.waitCommand(ctx, out.CommandID); err != nil {
			return 0, err
		}
	}
	serial, _ := strconv.ParseUint(out.Serial, 10, 64)
	start := time.Now()
	if err := b.admin.Call(ctx, "nodes.revokeSshCert", breakglass.RevokeIn{NodeID: a.NodeID(), Serial: out.Serial}, nil); err != nil {
		return 0, err
	}
	deadline := time.After(time.Minute)
	for {
		select {
		case k := <-a.revs:
			if k != revwire.KindSSHCert {
				continue
			}
			if s, err := a.ssh.KRLSerials(); err != nil || !slices.Contains(s, serial) {
				return 0, fmt.Errorf("the entry came but the KRL lacks the serial (%v)", err)
			}
			return time.Since(start), nil
		case <-deadline:
			return 0, errors.New("the serial did not reach the node")
		}
	}
}

func sshKey() (string, error) {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return "", err
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return "", err
	}
	return string(ssh.MarshalAuthorizedKey(s.PublicKey())), nil
}

// echoServer echoes every connection on a loopback port.
func echoServer() (uint32, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return uint32(l.Addr().(*net.TCPAddr).Port), nil
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func printTable(res map[string][]time.Duration) {
	base := quantile(res["node.ping (baseline)"], 0.5)
	fmt.Printf("%-30s %10s %10s %16s\n", "kind: until", "median", "p99", "median / ping")
	for _, k := range []string{"node.ping (baseline)", "node-cert: session closed", "api-key: tunnel closed", "ssh-cert: in the node's KRL"} {
		med, p99 := quantile(res[k], 0.5), quantile(res[k], 0.99)
		fmt.Printf("%-30s %8.1fms %8.1fms %15.2fx\n", k, ms(med), ms(p99), float64(med)/float64(base))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
