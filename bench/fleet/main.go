// Command fleet is the fleet-scale benchmark behind bench/fleet/run. For
// each database it starts a control plane from the built binaries (api and
// workers in one process, the gateway alone in another, so its memory and
// CPU are its own), joins N simulated nodes with `bcd simulate`, and
// measures joins, renewals, gateway memory and idle CPU, a diag.run
// fan-out until every result is attested, revocation, a reconnect storm
// after a gateway restart, and the same fan-out over two baselines on the
// same TLS setup: a bare gRPC echo, and the cryptographic floor (each
// message signed and checked as a command and its result are, floor.go).
// It prints one table.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
)

func main() {
	if len(os.Args) > 4 {
		if f, ok := baselineMains[os.Args[1]]; ok {
			n, _ := strconv.Atoi(os.Args[4])
			if err := f(os.Args[2], os.Args[3], n); err != nil {
				fmt.Fprintln(os.Stderr, os.Args[1]+":", err)
				os.Exit(1)
			}
			return
		}
	}
	nodes := flag.String("nodes", "1000", "simulated nodes: one size, or a comma-separated list of sizes (1000,10000,50000) to print how the costs grow")
	bin := flag.String("bin", "", "directory with better-compute and bcd binaries")
	self := flag.String("self", "", "this benchmark's own binary (for the echo baseline)")
	dbs := flag.String("db", "postgres,sqlite", "databases to run on, in order")
	pgDSN := flag.String("pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL admin DSN")
	simDir := flag.String("sim-dir", defaultSimDir(), "where the simulated nodes keep their state and journals")
	flag.Parse()
	fmt.Printf("simulated nodes' state and journals under %s\n", *simDir)
	sizes, err := parseSizes(*nodes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(2)
	}
	restore, err := raiseLimits(sizes[len(sizes)-1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(2)
	}
	var rows []result
	for _, db := range strings.Split(*dbs, ",") {
		for _, n := range sizes {
			r, err := run(db, n, *bin, *self, *pgDSN, *simDir)
			if err != nil {
				fmt.Fprintf(os.Stderr, "fleet: %s, %d nodes: %v\n", db, n, err)
				restore()
				if len(rows) > 0 {
					printTable(rows) // what the sizes before it measured
				}
				os.Exit(1)
			}
			rows = append(rows, r)
		}
	}
	restore()
	printTable(rows)
	if len(sizes) > 1 {
		printCurves(rows)
	}
}

// parseSizes reads --nodes: one size or a comma-separated list, each a
// positive count, in increasing order.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--nodes %q: want a positive count or a comma-separated list of them", s)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("--nodes %q: list the sizes in increasing order", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// printCurves prints, per database, how each cost grows with the fleet:
// each size's figure and its ratio to the smallest size's, beside the
// ratio of the sizes themselves (linear growth keeps the two equal).
func printCurves(rows []result) {
	byDB := map[string][]result{}
	var order []string
	for _, r := range rows {
		if _, ok := byDB[r.DB]; !ok {
			order = append(order, r.DB)
		}
		byDB[r.DB] = append(byDB[r.DB], r)
	}
	for _, db := range order {
		rs := byDB[db]
		fmt.Printf("\ngrowth on %s (figure, and its ratio to %d nodes'):\n", db, rs[0].Nodes)
		fmt.Printf("%-8s %8s %20s %24s %24s\n", "nodes", "x nodes", "gateway RSS (MB)", "fan-out attested (s)", "restart reconnected (s)")
		for _, r := range rs {
			fmt.Printf("%-8d %8.1f %13.0f (%4.1fx) %17.2f (%4.1fx) %17.1f (%4.1fx)\n", r.Nodes, float64(r.Nodes)/float64(rs[0].Nodes),
				r.GatewayRSSMB, r.GatewayRSSMB/rs[0].GatewayRSSMB, r.FanoutSeconds, r.FanoutSeconds/rs[0].FanoutSeconds,
				r.StormSeconds, r.StormSeconds/rs[0].StormSeconds)
		}
	}
}

type result struct {
	DB                  string
	Nodes               int
	JoinsPerSec         float64
	RenewalsPerSec      float64
	GatewayRSSPerNodeKB float64
	GatewayRSSMB        float64
	IdleCPUPercent      float64
	FanoutSeconds       float64
	FanoutCreatedS      float64 // commands.fanout returned (all queued)
	FanoutSignedS       float64 // every command signed
	FanoutSentS         float64 // every command sent (or further)
	FanoutMedianMS      float64
	FanoutP99MS         float64
	RevokeCloseMS       float64
	StormSeconds        float64
	StormPeakPerSec     int
	Reconnected         int
	EchoSeconds         float64
	FloorSeconds        float64 // the cryptographic floor (floor.go)
	OneProcess          bool    // every role in one process (SQLite)
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func start(ctx context.Context, dir, name string, args ...string) (*exec.Cmd, error) {
	log, err := os.Create(filepath.Join(dir, filepath.Base(args[0])+"-"+name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "BC_KEK=")
	return cmd, cmd.Start()
}

func waitTCP(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not open within %v", addr, within)
}

func rssKB(pid int) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

func cpuTicks(pid int) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return u + k
}

// defaultSimDir is where the simulated nodes' state goes: memory
// (/dev/shm) when the machine has it. A real fleet's 10,000 journals sit on
// 10,000 disks that fsync in parallel; simulated on one machine they would
// share its one disk, whose fsync rate (about 10,000 per second here) the
// control plane does not cause and a real fleet does not have. Every node
// still writes and fsyncs its journal on the real code path. Pass
// -sim-dir on a disk to measure with one shared disk instead.
func defaultSimDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

func run(dbName string, n int, bin, self, pgDSN, simRoot string) (result, error) {
	r := result{DB: dbName, Nodes: n}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "bc-fleet-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	simDir, err := os.MkdirTemp(simRoot, "bc-fleet-nodes-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(simDir)
	bc, bcd := filepath.Join(bin, "better-compute"), filepath.Join(bin, "bcd")
	if out, err := exec.Command(bc, "pki", "init", "--dir", filepath.Join(dir, "pki"), "--kek-file", filepath.Join(dir, "kek"), "--trust-domain", "fleet.bench").CombinedOutput(); err != nil {
		return r, fmt.Errorf("pki init: %v: %s", err, out)
	}
	dsn := "sqlite:" + filepath.Join(dir, "control.db")
	if dbName == "postgres" {
		admin, err := store.Open(ctx, pgDSN)
		if err != nil {
			return r, err
		}
		_, _ = admin.ExecContext(ctx, `DROP DATABASE IF EXISTS bc_fleet_bench`)
		if _, err := admin.ExecContext(ctx, `CREATE DATABASE bc_fleet_bench`); err != nil {
			return r, err
		}
		admin.Close()
		dsn = strings.Replace(pgDSN, "/postgres?", "/bc_fleet_bench?", 1)
	}
	db, err := store.Open(ctx, dsn)
	if err != nil {
		return r, err
	}
	defer db.Close()
	if err := db.Migrate(ctx); err != nil {
		return r, err
	}
	_, key, err := apikeys.New(db, clock.Real{}, iam.New(db, clock.Real{})).Create(ctx, audit.Entry{TenantID: "root", Actor: "bench"}, "root", "admin", "bench", 0)
	if err != nil {
		return r, err
	}
	apiAddr, gwAddr := freeAddr(), freeAddr()
	common := []string{"--db", dsn, "--pki", filepath.Join(dir, "pki"), "--kek-file", filepath.Join(dir, "kek"), "--log-level", "error"}
	// On PostgreSQL the gateway runs alone, so its memory and CPU are its
	// own. SQLite is the embedded, one-process deployment: every role in
	// one process, since separate processes would queue on SQLite's one
	// file lock (its busy handler sleeps up to 100 ms a try), which no
	// operator runs; there the "gateway" figures include api and workers.
	r.OneProcess = dbName == "sqlite"
	internalAddr := freeAddr()
	// The bench measures the fleet, not TLS: the API serves plain HTTP on
	// loopback, as serve allows when asked.
	apiArgs := []string{bc, "serve", "--roles", "api,workers", "--api", apiAddr, "--plain-http", "--internal", internalAddr}
	// The gateway-only process holds no keys: it gets its certificate from
	// the internal CA (pki issue-gateway), runs without the KEK and relays
	// to the api's internal channel. Two processes on one host: only the
	// first serves metrics (on the default loopback address).
	gwDir := filepath.Join(dir, "gateway")
	if out, err := exec.Command(bc, "pki", "issue-gateway", "--pki", filepath.Join(dir, "pki"), "--kek-file", filepath.Join(dir, "kek"), "--out", gwDir).CombinedOutput(); err != nil {
		return r, fmt.Errorf("pki issue-gateway: %v: %s", err, out)
	}
	gwArgs := []string{bc, "serve", "--roles", "gateway", "--gateway", gwAddr, "--metrics", "", "--db", dsn, "--pki", gwDir,
		"--gateway-cert", filepath.Join(gwDir, "gateway.crt"), "--gateway-key", filepath.Join(gwDir, "gateway.key"), "--control", internalAddr, "--log-level", "error"}
	if r.OneProcess {
		apiArgs = []string{bc, "serve", "--roles", "api,workers,gateway", "--api", apiAddr, "--plain-http", "--gateway", gwAddr}
		gwArgs = apiArgs
	}
	profDir := os.Getenv("BC_BENCH_PROFILE_DIR")
	if profDir != "" {
		apiArgs = append(apiArgs, "--pprof", "127.0.0.1:6062")
		if !r.OneProcess {
			gwArgs = append(gwArgs, "--pprof", "127.0.0.1:6061")
		}
	}
	apiProc, err := start(ctx, dir, "api", append(apiArgs, common...)...)
	if err != nil {
		return r, err
	}
	defer apiProc.Process.Kill()
	gw := apiProc
	if !r.OneProcess {
		if gw, err = start(ctx, dir, "gw", gwArgs...); err != nil {
			return r, err
		}
		defer gw.Process.Kill() // a run that fails before the restart leaves none behind
	}
	if err := waitTCP(apiAddr, 30*time.Second); err != nil {
		return r, err
	}
	if err := waitTCP(gwAddr, 30*time.Second); err != nil {
		return r, err
	}
	cl := client.New("http://"+apiAddr, key)
	cl.HTTP.Timeout = 5 * time.Minute
	var tokens []string
	for left := n; left > 0; left -= 10000 {
		var out struct {
			Tokens []client.JoinToken `json:"tokens"`
		}
		if err := cl.Call(ctx, "joinTokens.createMany", map[string]any{"count": min(left, 10000), "ttl_seconds": 7200}, &out); err != nil {
			return r, fmt.Errorf("tokens: %w", err)
		}
		for _, t := range out.Tokens {
			tokens = append(tokens, t.Token)
		}
	}
	tokFile := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokFile, []byte(strings.Join(tokens, "\n")+"\n"), 0o600); err != nil {
		return r, err
	}
	rssBefore := rssKB(gw.Process.Pid)
	fmt.Fprintf(os.Stderr, "%s: joining %d nodes\n", dbName, n)
	simArgs := []string{"simulate", "--nodes", strconv.Itoa(n), "--gateway", gwAddr, "--tokens-file", tokFile,
		"--data", simDir, "--parallel", "32", "--renew-all"}
	if profDir != "" {
		simArgs = append(simArgs, "--pprof", "127.0.0.1:6063")
	}
	sim := exec.CommandContext(ctx, bcd, simArgs...)
	simOut, err := sim.StdoutPipe()
	if err != nil {
		return r, err
	}
	simLog, _ := os.Create(filepath.Join(dir, "simulate.log"))
	sim.Stderr = simLog
	if err := sim.Start(); err != nil {
		return r, err
	}
	defer sim.Process.Kill()
	line, err := bufio.NewReader(simOut).ReadString('\n')
	if err != nil {
		return r, fmt.Errorf("simulate: %w (see %s)", err, simLog.Name())
	}
	var rep struct {
		Report struct {
			JoinsPerSecond float64 `json:"joins_per_second"`
		} `json:"report"`
		Renewals float64 `json:"renewals_per_second"`
	}
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		return r, fmt.Errorf("simulate said %q: %w", line, err)
	}
	r.JoinsPerSec, r.RenewalsPerSec = rep.Report.JoinsPerSecond, rep.Renewals
	rssAfter := rssKB(gw.Process.Pid)
	r.GatewayRSSMB = rssAfter / 1024
	r.GatewayRSSPerNodeKB = (rssAfter - rssBefore) / float64(n)
	if profDir != "" {
		saveHeapProfiles(profDir, dbName, r.OneProcess)
	}

	fmt.Fprintf(os.Stderr, "%s: idle CPU over 10 s\n", dbName)
	t0 := cpuTicks(gw.Process.Pid)
	time.Sleep(10 * time.Second)
	r.IdleCPUPercent = (cpuTicks(gw.Process.Pid) - t0) / 100 / 10 * 100

	fmt.Fprintf(os.Stderr, "%s: fan-out of diag.run to %d nodes\n", dbName, n)
	if profDir != "" {
		secs := os.Getenv("BC_BENCH_PROFILE_SECONDS")
		if secs == "" {
			secs = "1"
		}
		procs := map[string]string{"gateway": "127.0.0.1:6061", "api": "127.0.0.1:6062", "simulate": "127.0.0.1:6063"}
		if r.OneProcess {
			delete(procs, "gateway")
		}
		for name, addr := range procs {
			go func() {
				resp, err := http.Get("http://" + addr + "/debug/pprof/profile?seconds=" + secs)
				if err != nil {
					return
				}
				defer resp.Body.Close()
				f, _ := os.Create(filepath.Join(profDir, dbName+"-"+name+".pprof"))
				defer f.Close()
				_, _ = io.Copy(f, resp.Body)
			}()
		}
	}
	fanStart := time.Now()
	if err := fanout(ctx, cl, db, n); err != nil {
		return r, err
	}
	r.FanoutCreatedS = time.Since(fanStart).Seconds()
	// Poll lightly (the state index, every 100 ms) so that measuring does
	// not load the machine; the end time comes from the rows themselves.
	for {
		var unsigned, queued, final int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM commands WHERE state = 'queued' AND body IS NULL`).Scan(&unsigned); err != nil {
			return r, err
		}
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM commands WHERE state = 'queued'`).Scan(&queued); err != nil {
			return r, err
		}
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM commands WHERE state IN ('succeeded', 'failed', 'cancelled')`).Scan(&final); err != nil {
			return r, err
		}
		if unsigned == 0 && r.FanoutSignedS == 0 {
			r.FanoutSignedS = time.Since(fanStart).Seconds()
		}
		if queued == 0 && r.FanoutSentS == 0 {
			r.FanoutSentS = time.Since(fanStart).Seconds()
		}
		if final == n {
			break
		}
		if time.Since(fanStart) > 10*time.Minute {
			return r, fmt.Errorf("fanout: %d of %d final after 10 minutes", final, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var attested int
	var last int64
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), MAX(updated_at) FROM commands WHERE state = 'succeeded' AND attested = 1`).Scan(&attested, &last); err != nil {
		return r, err
	}
	if attested != n {
		return r, fmt.Errorf("fanout: %d of %d succeeded and attested", attested, n)
	}
	// The gateway stamps updated_at when it records the attested result.
	r.FanoutSeconds = float64(last-fanStart.UnixMilli()) / 1000
	var lat []float64
	rows, err := db.QueryContext(ctx, `SELECT updated_at - created_at FROM commands`)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var v float64
		_ = rows.Scan(&v)
		lat = append(lat, v)
	}
	rows.Close()
	sort.Float64s(lat)
	r.FanoutMedianMS, r.FanoutP99MS = lat[len(lat)/2], lat[len(lat)*99/100]

	fmt.Fprintf(os.Stderr, "%s: revocation\n", dbName)
	var victim string
	if err := db.QueryRowContext(ctx, `SELECT node_id FROM node_sessions WHERE closed_at IS NULL LIMIT 1`).Scan(&victim); err != nil {
		return r, err
	}
	if err := cl.Call(ctx, "nodes.revoke", map[string]any{"node_id": victim}, nil); err != nil {
		return r, err
	}
	for i := 0; ; i++ {
		var revoked int64
		var closed *int64
		if err := db.QueryRowContext(ctx, `SELECT MAX(c.revoked_at), MAX(s.closed_at) FROM node_certs c JOIN node_sessions s ON s.node_id = c.node_id WHERE c.node_id = $1`, victim).Scan(&revoked, &closed); err != nil {
			return r, err
		}
		if closed != nil && *closed >= revoked {
			r.RevokeCloseMS = float64(*closed - revoked)
			break
		}
		if i > 600 {
			return r, errors.New("revocation: session not closed within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}

	fmt.Fprintf(os.Stderr, "%s: gateway restart and reconnect storm\n", dbName)
	_ = gw.Process.Signal(syscall.SIGKILL)
	_, _ = gw.Process.Wait()
	restart := time.Now()
	gw2, err := start(ctx, dir, "gw2", append(gwArgs, common...)...)
	if err != nil {
		return r, err
	}
	defer gw2.Process.Kill()
	for {
		var back int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM node_sessions WHERE closed_at IS NULL AND connected_at >= $1`, restart.UnixMilli()).Scan(&back); err != nil {
			return r, err
		}
		r.Reconnected = back
		if back >= n-1 {
			break
		}
		if time.Since(restart) > 10*time.Minute {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.StormSeconds = time.Since(restart).Seconds()
	_ = db.QueryRowContext(ctx, `SELECT COALESCE(MAX(c), 0) FROM (SELECT connected_at / 1000 AS s, COUNT(*) AS c FROM node_sessions WHERE connected_at >= $1 GROUP BY connected_at / 1000) x`, restart.UnixMilli()).Scan(&r.StormPeakPerSec)
	_ = sim.Process.Kill()

	fmt.Fprintf(os.Stderr, "%s: baselines (bare echo, crypto floor) over %d streams\n", dbName, n)
	if err := writeEchoCert(dir); err != nil {
		return r, err
	}
	if r.EchoSeconds, err = runBaseline(ctx, self, "echo", dir, n); err != nil {
		return r, err
	}
	if r.FloorSeconds, err = runBaseline(ctx, self, "floor", dir, n); err != nil {
		return r, err
	}
	if dbName == "postgres" {
		db.Close()
		if admin, err := store.Open(context.Background(), pgDSN); err == nil {
			_ = apiProc.Process.Kill()
			_ = gw2.Process.Kill()
			_, _ = apiProc.Process.Wait()
			_, _ = gw2.Process.Wait()
			_, _ = admin.ExecContext(context.Background(), `DROP DATABASE IF EXISTS bc_fleet_bench`)
			admin.Close()
		}
	}
	return r, nil
}

// baselineMains are the baselines' own processes, run as
// `fleet MODE DIR ADDR N` by runBaseline.
var baselineMains = map[string]func(dir, addr string, n int) error{
	"echo-server": echoServerMain, "echo-clients": echoClientsMain,
	"floor-server": floorServerMain, "floor-clients": floorClientsMain,
}

// runBaseline runs the baseline named kind ("echo" or "floor") over n
// streams: its server and its clients as two processes of this binary
// with the TLS identity (and, for the floor, the bundle and KEK) in dir.
// It returns the seconds the server reports, and stops the clients.
func runBaseline(ctx context.Context, self, kind, dir string, n int) (float64, error) {
	addr := freeAddr()
	srv := exec.CommandContext(ctx, self, kind+"-server", dir, addr, strconv.Itoa(n))
	srvOut, err := srv.StdoutPipe()
	if err != nil {
		return 0, err
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	if err := waitTCP(addr, 10*time.Second); err != nil {
		return 0, err
	}
	cli := exec.CommandContext(ctx, self, kind+"-clients", dir, addr, strconv.Itoa(n))
	cli.Stderr = os.Stderr
	if err := cli.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cli.Process.Kill(); _ = cli.Wait() }()
	line, err := bufio.NewReader(srvOut).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("%s server: %w", kind, err)
	}
	var out map[string]float64
	if err := json.Unmarshal([]byte(line), &out); err != nil {
		return 0, fmt.Errorf("%s server said %q: %w", kind, line, err)
	}
	v, ok := out[kind+"_fanout_seconds"]
	if !ok {
		return 0, fmt.Errorf("%s server said %q", kind, line)
	}
	return v, nil
}

func printTable(rows []result) {
	fmt.Printf("%-34s", "measure")
	for _, r := range rows {
		fmt.Printf(" %14s", r.DB)
	}
	fmt.Println()
	line := func(name, format string, get func(result) any) {
		fmt.Printf("%-34s", name)
		for _, r := range rows {
			fmt.Printf(" %14s", fmt.Sprintf(format, get(r)))
		}
		fmt.Println()
	}
	line("nodes", "%d", func(r result) any { return r.Nodes })
	line("control plane processes", "%s", func(r result) any {
		if r.OneProcess {
			return "one"
		}
		return "gw + api"
	})
	line("joins per second", "%.0f", func(r result) any { return r.JoinsPerSec })
	line("renewals per second (all at once)", "%.0f", func(r result) any { return r.RenewalsPerSec })
	line("gateway RSS (MB)", "%.0f", func(r result) any { return r.GatewayRSSMB })
	line("gateway RSS per node (KB)", "%.1f", func(r result) any { return r.GatewayRSSPerNodeKB })
	line("gateway CPU at idle (% of a core)", "%.1f", func(r result) any { return r.IdleCPUPercent })
	line("fan-out: call returned (s)", "%.2f", func(r result) any { return r.FanoutCreatedS })
	line("fan-out: all signed (s)", "%.2f", func(r result) any { return r.FanoutSignedS })
	line("fan-out: all sent (s)", "%.2f", func(r result) any { return r.FanoutSentS })
	line("fan-out: all attested (s)", "%.2f", func(r result) any { return r.FanoutSeconds })
	line("fan-out per command median (ms)", "%.0f", func(r result) any { return r.FanoutMedianMS })
	line("fan-out per command p99 (ms)", "%.0f", func(r result) any { return r.FanoutP99MS })
	line("bare gRPC echo fan-out (s)", "%.3f", func(r result) any { return r.EchoSeconds })
	line("fan-out / bare transport", "%.1f", func(r result) any { return r.FanoutSeconds / r.EchoSeconds })
	line("crypto floor fan-out (baseline, s)", "%.3f", func(r result) any { return r.FloorSeconds })
	line("fan-out / crypto floor", "%.1f", func(r result) any { return r.FanoutSeconds / r.FloorSeconds })
	line("revocation to session closed (ms)", "%.0f", func(r result) any { return r.RevokeCloseMS })
	line("restart: all reconnected (s)", "%.1f", func(r result) any { return r.StormSeconds })
	line("restart: reconnected (all but revoked)", "%d", func(r result) any { return r.Reconnected })
	line("restart: peak reconnects per second", "%d", func(r result) any { return r.StormPeakPerSec })
}

// saveHeapProfiles saves the gateway's and the simulator's live heap with
// every session up (BC_BENCH_PROFILE_DIR), to show what a session costs.
func saveHeapProfiles(dir, dbName string, oneProcess bool) {
	procs := map[string]string{"gateway": "127.0.0.1:6061", "simulate": "127.0.0.1:6063"}
	if oneProcess {
		procs["gateway"] = "127.0.0.1:6062"
	}
	for name, addr := range procs {
		// The profile, its text form (which ends with the runtime's
		// memory statistics: stacks, GC goal) and the goroutines.
		for file, path := range map[string]string{"heap.pprof": "heap?gc=1", "heap.txt": "heap?debug=1", "goroutine.txt": "goroutine?debug=1"} {
			resp, err := http.Get("http://" + addr + "/debug/pprof/" + path)
			if err != nil {
				fmt.Fprintf(os.Stderr, "profile %s of %s: %v\n", path, name, err)
				continue
			}
			f, err := os.Create(filepath.Join(dir, dbName+"-"+name+"-"+file))
			if err == nil {
				_, _ = io.Copy(f, resp.Body)
				_ = f.Close()
			}
			_ = resp.Body.Close()
		}
	}
}

// idsPerFanout is how many node ids one commands.fanout names past the
// cap: as many as fit the API's 64 KiB body.
const idsPerFanout = 2500

// fanout sends one diag.run to each of the n nodes: one commands.fanout by
// label, or, past the API's cap of commands.MaxFanout nodes a call, one
// call per idsPerFanout node ids, one after the other (an operator
// reaching a larger fleet does the same).
func fanout(ctx context.Context, cl *client.Client, db *store.DB, n int) error {
	call := func(params map[string]any) (int, error) {
		var fo struct {
			Count int `json:"count"`
		}
		params["kind"], params["ttl_seconds"] = "diag.run", 3600
		err := cl.Call(ctx, "commands.fanout", params, &fo)
		return fo.Count, err
	}
	if n <= commands.MaxFanout {
		got, err := call(map[string]any{"labels": map[string]string{"fleet": "bench"}})
		if err != nil {
			return fmt.Errorf("fanout: %w", err)
		}
		if got != n {
			return fmt.Errorf("fanout addressed %d nodes, want %d", got, n)
		}
		return nil
	}
	rows, err := db.QueryContext(ctx, `SELECT id FROM nodes ORDER BY id`)
	if err != nil {
		return err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	total := 0
	for chunk := range slices.Chunk(ids, idsPerFanout) {
		got, err := call(map[string]any{"node_ids": chunk})
		if err != nil {
			return fmt.Errorf("fanout: %w", err)
		}
		total += got
	}
	if total != n {
		return fmt.Errorf("fanout addressed %d nodes, want %d", total, n)
	}
	return nil
}
