package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/collectors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/store"
)

// proc is one child process the harness started and owns: it is started
// in its own process group, so a Ctrl-C on the terminal reaches only the
// harness, which then ends every child by its id.
type proc struct {
	name string
	args []string
	env  []string
	log  string
	cred *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// start runs the process; its output is appended to its log file.
func (p *proc) start() error {
	f, err := os.OpenFile(p.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("%s: log: %w", p.name, err)
	}
	fmt.Fprintf(f, "=== start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: p.cred}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	return nil
}

// alive reports whether the process is running (stopped counts as running).
func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New(p.name + ": not started")
	}
	return syscall.Kill(p.cmd.Process.Pid, sig)
}

// wait waits until the process has exited, at most within.
func (p *proc) wait(within time.Duration) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-time.After(within):
		return fmt.Errorf("%s did not exit within %v", p.name, within)
	}
}

// kill ends the process and everything in its process group (the
// commands a node's driver runs) with SIGKILL and waits for it.
func (p *proc) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT) // a stopped gateway
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// node is one real `bcd node` process and its fault-injecting proxy.
type node struct {
	name, id string
	dataDir  string
	proc     *proc
	proxy    *toxiproxy.Proxy
	// minConnect is the earliest connected_at (unix ms) of a session that
	// counts as this node's current one: its last restart, or the
	// gateway's.
	minConnect int64
	// segments are copies of the journal taken right after each kill and
	// before the restart that compacts it.
	segments []string
	slow     bool // its data folder is on the slow-disk mount
}

// cluster is the deployment under test: its own PostgreSQL, a gateway-only
// process, an api+workers process and N bcd nodes, all on loopback.
type cluster struct {
	dir   string // everything but PostgreSQL's data
	pgDir string // PostgreSQL's data, owned by the postgres OS user
	bin   string
	bc    string
	bcd   string

	pgBin  string
	pgPort int
	pg     *proc
	dsn    string
	db     *store.DB

	apiAddr, gwAddr, internalAddr string
	api, gw                       *proc
	gwStarted                     int64 // unix ms of the gateway's last start
	cl                            *client.Client

	toxics *toxiproxy.ApiServer
	nodes  []*node
	slow   *slowDisk
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func freeAddr() (string, error) {
	p, err := freePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

func waitTCP(ctx context.Context, addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not open within %v", addr, within)
}

// findPGBin returns the newest /usr/lib/postgresql/*/bin with initdb.
func findPGBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(dirs) == 0 {
		return "", errors.New("no /usr/lib/postgresql/*/bin/initdb: install PostgreSQL (apt-get install postgresql)")
	}
	sort.Slice(dirs, func(a, b int) bool {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[a]))))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[b]))))
		return va > vb
	})
	return filepath.Dir(dirs[0]), nil
}

// pgCredential is the postgres OS user when the harness runs as root
// (PostgreSQL refuses to run as root), else nil: the current user.
func pgCredential() (*syscall.Credential, int, int, error) {
	if os.Geteuid() != 0 {
		return nil, -1, -1, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, 0, 0, fmt.Errorf("running as root needs the postgres OS user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid, nil
}

// startPostgres makes and starts the harness's own cluster on a free
// loopback port. It never touches the machine's own PostgreSQL.
func (c *cluster) startPostgres(ctx context.Context) error {
	var err error
	if c.pgBin, err = findPGBin(); err != nil {
		return err
	}
	cred, uid, gid, err := pgCredential()
	if err != nil {
		return err
	}
	if c.pgDir, err = os.MkdirTemp("", "bc-chaos-pg-"); err != nil {
		return fmt.Errorf("pg dir: %w", err)
	}
	if cred != nil {
		if err := os.Chown(c.pgDir, uid, gid); err != nil {
			return fmt.Errorf("pg dir: %w", err)
		}
	}
	initdb := exec.CommandContext(ctx, filepath.Join(c.pgBin, "initdb"), "-D", filepath.Join(c.pgDir, "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	if c.pgPort, err = freePort(); err != nil {
		return err
	}
	c.pg = &proc{name: "postgres", cred: cred, log: filepath.Join(c.pgDir, "postgres.log"),
		args: []string{filepath.Join(c.pgBin, "postgres"), "-D", filepath.Join(c.pgDir, "data"), "-p", strconv.Itoa(c.pgPort),
			"-k", c.pgDir, "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"}}
	if err := c.pgUp(ctx); err != nil {
		return err
	}
	admin, err := store.Open(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.pgPort))
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE bc`); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	c.dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/bc?sslmode=disable", c.pgPort)
	return nil
}

// pgUp starts the postgres process and waits until it accepts queries.
func (c *cluster) pgUp(ctx context.Context) error {
	if err := c.pg.start(); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		db, err := store.Open(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", c.pgPort))
		if err == nil {
			db.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not answer within 60 s (log %s): %w", c.pg.log, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// restartPostgres is a fast shutdown (SIGINT: active transactions are
// rolled back, connections closed) and a start, as an operator's
// `pg_ctl restart -m fast` does.
func (c *cluster) restartPostgres(ctx context.Context) error {
	if err := c.pg.signal(syscall.SIGINT); err != nil {
		return err
	}
	if err := c.pg.wait(60 * time.Second); err != nil {
		return err
	}
	return c.pgUp(ctx)
}

func (c *cluster) run(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "BC_KEK=", "BC_DB=", "BC_PKI=", "BC_KEK_FILE=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args[1:3], " "), err, out)
	}
	return nil
}

// startControlPlane makes the PKI and the first admin key and starts the
// api+workers process and the gateway-only process.
func (c *cluster) startControlPlane(ctx context.Context) error {
	pkiDir, kek := filepath.Join(c.dir, "pki"), filepath.Join(c.dir, "kek")
	if err := c.run(ctx, c.bc, "pki", "init", "--dir", pkiDir, "--kek-file", kek, "--trust-domain", "chaos.bench"); err != nil {
		return err
	}
	keyFile := filepath.Join(c.dir, "admin.key")
	if err := c.run(ctx, c.bc, "bootstrap", "--db", c.dsn, "--pki", pkiDir, "--kek-file", kek, "--out", keyFile); err != nil {
		return err
	}
	gwDir := filepath.Join(c.dir, "gateway")
	if err := c.run(ctx, c.bc, "pki", "issue-gateway", "--pki", pkiDir, "--kek-file", kek, "--out", gwDir); err != nil {
		return err
	}
	var err error
	for _, a := range []*string{&c.apiAddr, &c.gwAddr, &c.internalAddr} {
		if *a, err = freeAddr(); err != nil {
			return err
		}
	}
	metrics, err := freeAddr()
	if err != nil {
		return err
	}
	env := []string{"BC_KEK=", "BC_DB=", "BC_PKI=", "BC_KEK_FILE="}
	// The API serves plain HTTP on loopback (as serve allows when asked):
	// the harness tests delivery, not TLS to the API.
	c.api = &proc{name: "api+workers", env: env, log: filepath.Join(c.dir, "api.log"), args: []string{c.bc, "serve", "--roles", "api,workers",
		"--api", c.apiAddr, "--plain-http", "--internal", c.internalAddr, "--metrics", metrics,
		"--db", c.dsn, "--pki", pkiDir, "--kek-file", kek, "--log-level", "warn"}}
	c.gw = &proc{name: "gateway", env: env, log: filepath.Join(c.dir, "gateway.log"), args: []string{c.bc, "serve", "--roles", "gateway",
		"--gateway", c.gwAddr, "--metrics", "", "--db", c.dsn, "--pki", gwDir,
		"--gateway-cert", filepath.Join(gwDir, "gateway.crt"), "--gateway-key", filepath.Join(gwDir, "gateway.key"),
		"--control", c.internalAddr, "--log-level", "warn"}}
	if err := c.startAPI(ctx); err != nil {
		return err
	}
	if err := c.startGateway(ctx); err != nil {
		return err
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return fmt.Errorf("admin key: %w", err)
	}
	c.cl = client.New("http://"+c.apiAddr, strings.TrimSpace(string(key)))
	c.cl.HTTP.Timeout = 15 * time.Second
	if c.db, err = store.Open(ctx, c.dsn); err != nil {
		return err
	}
	return nil
}

func (c *cluster) startAPI(ctx context.Context) error {
	if err := c.api.start(); err != nil {
		return err
	}
	return waitTCP(ctx, c.apiAddr, 60*time.Second)
}

func (c *cluster) startGateway(ctx context.Context) error {
	c.gwStarted = time.Now().UnixMilli()
	if err := c.gw.start(); err != nil {
		return err
	}
	if err := waitTCP(ctx, c.gwAddr, 60*time.Second); err != nil {
		return err
	}
	for _, n := range c.nodes {
		n.minConnect = max(n.minConnect, c.gwStarted)
	}
	return nil
}

// startNodes joins n nodes with one-time tokens, each through its own
// toxiproxy proxy to the gateway, and starts `bcd node` for each. The
// first node's data folder is on the slow-disk mount when there is one.
func (c *cluster) startNodes(ctx context.Context, n int) error {
	c.toxics = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	c.toxics.Metrics.ProxyMetrics = collectors.NewProxyMetricCollectors()
	var out struct {
		Tokens []client.JoinToken `json:"tokens"`
	}
	if err := c.cl.Call(ctx, "joinTokens.createMany", map[string]any{"count": n, "ttl_seconds": 3600}, &out); err != nil {
		return fmt.Errorf("join tokens: %w", err)
	}
	if len(out.Tokens) != n {
		return fmt.Errorf("join tokens: got %d, want %d", len(out.Tokens), n)
	}
	for i := range n {
		nd := &node{name: fmt.Sprintf("chaos-%d", i), dataDir: filepath.Join(c.dir, "nodes", fmt.Sprintf("chaos-%d", i))}
		if i == 0 && c.slow != nil {
			nd.dataDir, nd.slow = filepath.Join(c.slow.mount, nd.name), true
		}
		if err := os.MkdirAll(filepath.Dir(nd.dataDir), 0o700); err != nil {
			return err
		}
		nd.proxy = toxiproxy.NewProxy(c.toxics, nd.name, "127.0.0.1:0", c.gwAddr)
		if err := nd.proxy.Start(); err != nil {
			return fmt.Errorf("proxy %s: %w", nd.name, err)
		}
		join := exec.CommandContext(ctx, c.bcd, "join", "--gateway", nd.proxy.Listen, "--data", nd.dataDir, "--name", nd.name)
		join.Env = append(os.Environ(), "BCD_JOIN_TOKEN="+out.Tokens[i].Token)
		if b, err := join.CombinedOutput(); err != nil {
			return fmt.Errorf("bcd join %s: %w: %s", nd.name, err, b)
		}
		nd.proc = &proc{name: nd.name, log: filepath.Join(c.dir, nd.name+".log"), args: []string{c.bcd, "node", "--data", nd.dataDir,
			"--gateway", nd.proxy.Listen, "--driver", "linux", "--sandbox-runtime", "none", "--log-level", "info"}}
		nd.minConnect = time.Now().UnixMilli()
		if err := nd.proc.start(); err != nil {
			return err
		}
		if err := c.db.QueryRowContext(ctx, `SELECT id FROM nodes WHERE name = $1`, nd.name).Scan(&nd.id); err != nil {
			return fmt.Errorf("node %s: id: %w", nd.name, err)
		}
		c.nodes = append(c.nodes, nd)
	}
	return nil
}

// killNode SIGKILLs a node, copies its journal (a restart compacts it)
// and starts it again.
func (c *cluster) killNode(nd *node) error {
	if err := nd.proc.signal(syscall.SIGKILL); err != nil {
		return err
	}
	if err := nd.proc.wait(30 * time.Second); err != nil {
		return err
	}
	if err := c.saveJournal(nd); err != nil {
		return err
	}
	nd.minConnect = time.Now().UnixMilli()
	return nd.proc.start()
}

func (c *cluster) saveJournal(nd *node) error {
	b, err := os.ReadFile(filepath.Join(nd.dataDir, "journal.log"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("journal copy: %w", err)
	}
	seg := filepath.Join(c.dir, "journals", fmt.Sprintf("%s.%03d.log", nd.name, len(nd.segments)))
	if err := os.MkdirAll(filepath.Dir(seg), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		return fmt.Errorf("journal copy: %w", err)
	}
	nd.segments = append(nd.segments, seg)
	return nil
}

// connected reports whether every node has an open session that started
// after its last restart and the gateway's.
func (c *cluster) connected(ctx context.Context) (bool, error) {
	rows, err := c.db.QueryContext(ctx, `SELECT node_id, connected_at FROM node_sessions WHERE closed_at IS NULL`)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	open := map[string]int64{}
	for rows.Next() {
		var id string
		var at int64
		if err := rows.Scan(&id, &at); err != nil {
			return false, err
		}
		open[id] = at
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	for _, n := range c.nodes {
		if at, ok := open[n.id]; !ok || at < n.minConnect {
			return false, nil
		}
	}
	return true, nil
}

// close ends every process the harness started (by its id), stops the
// proxies and the slow-disk mount, and removes the temporary folders
// unless keep is set.
func (c *cluster) close(keep bool) {
	for _, n := range c.nodes {
		n.proc.kill()
		if n.proxy != nil {
			n.proxy.Stop()
		}
	}
	if c.gw != nil {
		c.gw.kill()
	}
	if c.api != nil {
		c.api.kill()
	}
	if c.db != nil {
		c.db.Close()
	}
	if c.pg != nil && c.pg.alive() {
		_ = c.pg.signal(syscall.SIGQUIT) // immediate shutdown
		if c.pg.wait(20*time.Second) != nil {
			c.pg.kill()
		}
	}
	if c.slow != nil {
		c.slow.close()
	}
	if keep {
		fmt.Fprintf(os.Stderr, "chaos: kept %s and %s\n", c.dir, c.pgDir)
		return
	}
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
	if c.pgDir != "" {
		_ = os.RemoveAll(c.pgDir)
	}
}
