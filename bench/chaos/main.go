// Command chaos is the chaos harness behind bench/chaos/run (issue 23 item
// 7). It starts the production layout on loopback from the built
// binaries: its own PostgreSQL cluster (initdb into a temporary folder, a
// free port; the machine's own PostgreSQL is never touched), a
// gateway-only process, an api+workers process and N real `bcd node`
// processes joined with one-time tokens, each node reaching the gateway
// through its own in-process toxiproxy proxy. Then, for each fault type,
// it runs rounds: a few fan-outs to every node and one fault at a random
// moment during the round. After each round it checks, from the database
// and from every node's journal (copied before each node restart, since a
// restart compacts it), that every command ended succeeded or failed
// within the settle time, that none began twice, that the database's
// state equals the one the node signed in its journal, and that
// `better-compute audit verify` is clean. It prints a table per fault
// (or JSON), and ends every process and removes every folder it made on
// exit, also on Ctrl-C.
//
// It sends traffic only to 127.0.0.1 and stops by itself: rounds, settle
// time and an overall timeout bound it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/idempotency"
)

// options are the harness's flags.
type options struct {
	bin      string
	rounds   int
	faults   []string
	nodes    int
	seed     uint64
	timeout  time.Duration
	fanouts  int
	interval time.Duration
	settle   time.Duration
	kind     string
	json     bool
	keep     bool
	fault    faultOptions
}

func main() {
	var o options
	var faults string
	flag.StringVar(&o.bin, "bin", "", "directory with the better-compute and bcd binaries")
	flag.IntVar(&o.rounds, "rounds", 100, "rounds per fault type")
	flag.StringVar(&faults, "faults", strings.Join(allFaults, ","), "fault types to run, comma-separated, in order")
	flag.IntVar(&o.nodes, "nodes", 5, "bcd node processes")
	flag.Uint64Var(&o.seed, "seed", 0, "random seed (0: from the clock; printed)")
	flag.DurationVar(&o.timeout, "timeout", 12*time.Hour, "overall time limit; rounds stop when it is reached and the table shows what ran")
	flag.IntVar(&o.fanouts, "fanouts", 5, "fan-outs per round (each one command to every node)")
	flag.DurationVar(&o.interval, "interval", 200*time.Millisecond, "time between a round's fan-outs")
	flag.DurationVar(&o.settle, "settle", 2*time.Minute, "how long after the fault ends every command must be final")
	flag.StringVar(&o.kind, "kind", "diag.run", "command kind the fan-outs send (one every node allows)")
	flag.BoolVar(&o.json, "json", false, "print the results as JSON instead of the table")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folders (logs, journals, PostgreSQL) for inspection")
	flag.DurationVar(&o.fault.stopFor, "stop-for", 20*time.Second, "how long gateway-stop keeps the gateway SIGSTOPped")
	flag.DurationVar(&o.fault.faultFor, "fault-for", 10*time.Second, "how long a network or slow-disk fault lasts")
	flag.Parse()
	// toxiproxy's toxics log through zerolog's global logger; the harness
	// prints its own progress.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	for _, f := range strings.Split(faults, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(allFaults, f) {
			fmt.Fprintf(os.Stderr, "chaos: unknown fault %q (known: %s)\n", f, strings.Join(allFaults, ", "))
			os.Exit(2)
		}
		o.faults = append(o.faults, f)
	}
	if o.nodes < 1 || o.rounds < 1 || o.fanouts < 1 || o.bin == "" {
		fmt.Fprintln(os.Stderr, "chaos: --nodes, --rounds and --fanouts must be at least 1, and --bin is required")
		os.Exit(2)
	}
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	rep, err := run(ctx, o)
	if rep != nil {
		if o.json {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		} else {
			printTable(os.Stdout, rep)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
	if rep != nil && rep.defective() {
		os.Exit(3)
	}
}

// report is the run's outcome, printed as a table or JSON.
type report struct {
	Seed     uint64        `json:"seed"`
	Nodes    int           `json:"nodes"`
	Fanouts  int           `json:"fanouts_per_round"`
	Kind     string        `json:"kind"`
	Postgres string        `json:"postgres"`
	Stopped  string        `json:"stopped,omitempty"` // why rounds stopped early
	Faults   []*faultStats `json:"faults"`
}

func (r *report) defective() bool {
	for _, f := range r.Faults {
		if f.Lost+f.RunTwice+f.StateDiffers+f.AuditFailures > 0 {
			return true
		}
	}
	return false
}

// faultStats sums one fault type's rounds.
type faultStats struct {
	Fault         string    `json:"fault"`
	Rounds        int       `json:"rounds"`
	Commands      int       `json:"commands"`
	Lost          int       `json:"lost"`
	RunTwice      int       `json:"run_twice"`
	StateDiffers  int       `json:"state_differs"`
	AuditFailures int       `json:"audit_failures"`
	RecoverMedian float64   `json:"recover_median_s"`
	RecoverMax    float64   `json:"recover_max_s"`
	RoundMax      float64   `json:"round_max_s"` // first fan-out to all final, the slowest round
	Unavailable   string    `json:"unavailable,omitempty"`
	Errors        []string  `json:"errors,omitempty"`
	Defects       []defect  `json:"defects,omitempty"`
	recover       []float64 // seconds, per round
}

func run(ctx context.Context, o options) (*report, error) {
	rep := &report{Seed: o.seed, Nodes: o.nodes, Fanouts: o.fanouts, Kind: o.kind}
	c := &cluster{bin: o.bin, bc: filepath.Join(o.bin, "better-compute"), bcd: filepath.Join(o.bin, "bcd")}
	var err error
	if c.dir, err = os.MkdirTemp("", "bc-chaos-"); err != nil {
		return nil, err
	}
	defer c.close(o.keep)
	progress("seed %d; logs and journals under %s", o.seed, c.dir)
	if err := c.startPostgres(ctx); err != nil {
		return nil, err
	}
	if out, err := exec.Command(filepath.Join(c.pgBin, "postgres"), "--version").Output(); err == nil {
		rep.Postgres = strings.TrimSpace(string(out))
	}
	progress("%s on 127.0.0.1:%d (data in %s)", rep.Postgres, c.pgPort, c.pgDir)
	var slowWhy string
	if slices.Contains(o.faults, "slow-disk") {
		if c.slow, slowWhy = newSlowDisk(filepath.Join(c.dir, "slow")); c.slow == nil {
			progress("slow-disk: not available: %s", slowWhy)
		}
	}
	if err := c.startControlPlane(ctx); err != nil {
		return nil, err
	}
	progress("api+workers on %s, gateway on %s", c.apiAddr, c.gwAddr)
	if err := c.startNodes(ctx, o.nodes); err != nil {
		return nil, err
	}
	if err := waitConnected(ctx, c, 2*time.Minute); err != nil {
		return nil, err
	}
	progress("%d nodes connected through their proxies", o.nodes)
	js := &journals{}
	round := 0
	for _, f := range o.faults {
		fs := &faultStats{Fault: f}
		rep.Faults = append(rep.Faults, fs)
		if f == "slow-disk" && c.slow == nil {
			fs.Unavailable = slowWhy
			continue
		}
		for r := 1; r <= o.rounds; r++ {
			if ctx.Err() != nil {
				break
			}
			round++
			rng := rand.New(rand.NewPCG(o.seed, uint64(round)))
			if err := oneRound(ctx, c, js, o, f, r, rng, fs); err != nil {
				if ctx.Err() != nil {
					break
				}
				return rep, fmt.Errorf("%s round %d: %w", f, r, err)
			}
		}
		sort.Float64s(fs.recover)
		if n := len(fs.recover); n > 0 {
			fs.RecoverMedian, fs.RecoverMax = (fs.recover[(n-1)/2]+fs.recover[n/2])/2, fs.recover[n-1]
		}
		if ctx.Err() != nil {
			break
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		rep.Stopped = fmt.Sprintf("overall --timeout %v reached", o.timeout)
	} else if ctx.Err() != nil {
		rep.Stopped = "interrupted"
	}
	return rep, nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func waitConnected(ctx context.Context, c *cluster, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ok, err := c.connected(ctx)
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("some node has no current session")
			}
			return fmt.Errorf("nodes not all connected within %v: %w", within, err)
		}
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// oneRound runs one experiment: fan-outs, one fault at a random moment,
// the wait for every command to be final, and the checks.
func oneRound(ctx context.Context, c *cluster, js *journals, o options, fault string, r int, rng *rand.Rand, fs *faultStats) error {
	errsBefore := len(fs.Errors)
	if err := waitConnected(ctx, c, o.settle); err != nil {
		fs.Errors = append(fs.Errors, fmt.Sprintf("round %d: before the round: %v", r, err))
	}
	// The fault comes before the last fan-out is made, so some of the
	// round's commands are made, sent or run around it.
	window := max(time.Duration(o.fanouts)*o.interval, 100*time.Millisecond)
	at := time.Duration(rng.Int64N(int64(window)))
	faultRng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
	start := time.Now()
	var (
		mu       sync.Mutex
		ids      []string
		lastMade time.Time
		wg       sync.WaitGroup
		what     string
		faultErr error
		healed   time.Time
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range o.fanouts {
			if i > 0 {
				sleep(ctx, o.interval)
			}
			key := fmt.Sprintf("chaos-%d-%s-%d-%d", o.seed, fault, r, i)
			// A call cut by the fault may hold its key for the API's
			// idempotency lease, so the retries last longer than that.
			got, took, last, err := createFanout(ctx, c, key, o.kind, o.settle+idempotency.Lease)
			mu.Lock()
			switch {
			case err != nil:
				fs.Errors = append(fs.Errors, fmt.Sprintf("round %d: fan-out %d not made after %.1fs of retries: %v", r, i, took.Seconds(), err))
			case took > 10*time.Second:
				fs.Errors = append(fs.Errors, fmt.Sprintf("round %d: fan-out %d made only after %.1fs of retries; last refusal: %v", r, i, took.Seconds(), last))
			}
			ids = append(ids, got...)
			lastMade = time.Now()
			mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		sleep(ctx, at)
		what, faultErr = c.inject(ctx, fault, faultRng, o.fault)
		healed = time.Now()
	}()
	wg.Wait()
	if faultErr != nil {
		return faultErr
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	from := healed
	if lastMade.After(from) {
		from = lastMade
	}
	deadline := from.Add(o.settle)
	var finalAt time.Time
	for time.Now().Before(deadline) {
		st, err := c.commandStates(ctx, ids)
		if err == nil {
			all := len(st) == len(ids)
			for _, d := range st {
				all = all && isFinal(d.state)
			}
			if all {
				finalAt = time.Now()
				break
			}
		}
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	lost, twice, differs, defects, err := c.check(ctx, js, fault, r, ids)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	auditOK, auditOut := c.audit(ctx)
	fs.Rounds++
	fs.Commands += len(ids)
	fs.Lost += lost
	fs.RunTwice += twice
	fs.StateDiffers += differs
	fs.Defects = append(fs.Defects, defects...)
	rec := "not all final"
	if !finalAt.IsZero() {
		s := max(0, finalAt.Sub(healed).Seconds())
		fs.recover = append(fs.recover, s)
		fs.RoundMax = max(fs.RoundMax, finalAt.Sub(start).Seconds())
		rec = fmt.Sprintf("all final %.1fs after the fault ended", s)
	}
	if !auditOK {
		fs.AuditFailures++
		fs.Errors = append(fs.Errors, fmt.Sprintf("round %d: audit verify: %s", r, auditOut))
	}
	progress("%s round %d/%d: %d commands, fault at %.2fs: %s; %s; lost %d, run twice %d, state differs %d, audit %s",
		fault, r, o.rounds, len(ids), at.Seconds(), what, rec, lost, twice, differs, map[bool]string{true: "clean", false: "FAILED"}[auditOK])
	for _, e := range fs.Errors[errsBefore:] {
		progress("  %s", e)
	}
	for _, d := range defects {
		progress("  %s %s on %s: database %s; journal %s", d.What, d.Command, d.Node, d.DB, d.Journal)
	}
	return nil
}

// createFanout makes one fan-out of kind to every node, retrying under one
// Idempotency-Key while the API or its database is down (so a retry never
// makes a second fan-out), for at most within. It also returns how long
// the retries took and the last refusal, when there was one.
func createFanout(ctx context.Context, c *cluster, key, kind string, within time.Duration) ([]string, time.Duration, error, error) {
	ids := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		ids[i] = n.id
	}
	start := time.Now()
	deadline := start.Add(within)
	var last error
	for {
		var out client.FanoutOut
		err := c.cl.CallIdempotent(ctx, "commands.fanout", key, map[string]any{"node_ids": ids, "kind": kind, "ttl_seconds": 3600}, &out)
		if err == nil {
			return out.CommandIDs, time.Since(start), last, nil
		}
		last = err
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, time.Since(start), last, err
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// audit seals the root tenant's log and verifies it with the real CLI,
// against the database, as an operator would.
func (c *cluster) audit(ctx context.Context) (bool, string) {
	pkiDir, kek := filepath.Join(c.dir, "pki"), filepath.Join(c.dir, "kek")
	env := append(os.Environ(), "BC_KEK=", "BC_DB=", "BC_PKI=", "BC_KEK_FILE=")
	seal := exec.CommandContext(ctx, c.bc, "audit", "seal", "--db", c.dsn, "--pki", pkiDir, "--kek-file", kek)
	seal.Env = env
	if out, err := seal.CombinedOutput(); err != nil {
		return false, fmt.Sprintf("seal: %v: %s", err, strings.TrimSpace(string(out)))
	}
	verify := exec.CommandContext(ctx, c.bc, "audit", "verify", "--db", c.dsn, "--pki", pkiDir)
	verify.Env = env
	out, err := verify.CombinedOutput()
	if err != nil {
		return false, fmt.Sprintf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return true, ""
}

func printTable(w *os.File, rep *report) {
	fmt.Fprintf(w, "seed %d, %d nodes, %d fan-outs of %s per round, %s\n", rep.Seed, rep.Nodes, rep.Fanouts, rep.Kind, rep.Postgres)
	if rep.Stopped != "" {
		fmt.Fprintf(w, "stopped early: %s\n", rep.Stopped)
	}
	fmt.Fprintf(w, "%-14s %6s %8s %5s %9s %13s %11s %16s %13s %11s\n", "fault", "rounds", "commands", "lost", "run twice", "state differs", "audit fails", "recover median s", "recover max s", "round max s")
	for _, f := range rep.Faults {
		if f.Unavailable != "" {
			fmt.Fprintf(w, "%-14s not available: %s\n", f.Fault, f.Unavailable)
			continue
		}
		fmt.Fprintf(w, "%-14s %6d %8d %5d %9d %13d %11d %16.1f %13.1f %11.1f\n", f.Fault, f.Rounds, f.Commands, f.Lost, f.RunTwice, f.StateDiffers, f.AuditFailures, f.RecoverMedian, f.RecoverMax, f.RoundMax)
	}
	for _, f := range rep.Faults {
		for _, e := range f.Errors {
			fmt.Fprintf(w, "%s: %s\n", f.Fault, e)
		}
		for _, d := range f.Defects {
			fmt.Fprintf(w, "%s round %d: %s %s on %s: database %s; journal %s\n", d.Fault, d.Round, d.What, d.Command, d.Node, d.DB, d.Journal)
		}
	}
}
