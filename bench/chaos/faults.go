package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"time"
)

// allFaults are the fault types in the order they run.
var allFaults = []string{
	"gateway-kill", "api-kill", "node-kill", "pg-restart", "gateway-stop",
	"net-latency", "net-reset", "net-halfopen", "net-bandwidth", "slow-disk",
}

// faultOptions are the knobs of the faults.
type faultOptions struct {
	stopFor  time.Duration // how long gateway-stop keeps the gateway stopped
	faultFor time.Duration // how long a network or disk fault lasts
}

// inject applies one fault of the given type now and removes it (a killed
// process is started again at once; a stopped one continued after
// stopFor; a proxy toxic or the disk delay removed after faultFor). It
// returns when the fault is over and says what it did.
func (c *cluster) inject(ctx context.Context, fault string, rng *rand.Rand, o faultOptions) (string, error) {
	switch fault {
	case "gateway-kill":
		if err := c.gw.signal(syscall.SIGKILL); err != nil {
			return "", err
		}
		if err := c.gw.wait(30 * time.Second); err != nil {
			return "", err
		}
		return "SIGKILL gateway, restarted", c.startGateway(ctx)
	case "api-kill":
		if err := c.api.signal(syscall.SIGKILL); err != nil {
			return "", err
		}
		if err := c.api.wait(30 * time.Second); err != nil {
			return "", err
		}
		return "SIGKILL api+workers, restarted", c.startAPI(ctx)
	case "node-kill":
		k := 1 + rng.IntN(min(3, len(c.nodes)))
		var names []string
		for _, i := range rng.Perm(len(c.nodes))[:k] {
			if err := c.killNode(c.nodes[i]); err != nil {
				return "", err
			}
			names = append(names, c.nodes[i].name)
		}
		return "SIGKILL " + strings.Join(names, ","), nil
	case "pg-restart":
		t := time.Now()
		if err := c.restartPostgres(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("PostgreSQL fast restart (down %.2fs)", time.Since(t).Seconds()), nil
	case "gateway-stop":
		if err := c.gw.signal(syscall.SIGSTOP); err != nil {
			return "", err
		}
		sleep(ctx, o.stopFor)
		if err := c.gw.signal(syscall.SIGCONT); err != nil {
			return "", err
		}
		return fmt.Sprintf("SIGSTOP gateway %v", o.stopFor), nil
	case "net-latency", "net-reset", "net-halfopen", "net-bandwidth":
		return c.netFault(ctx, fault, rng, o.faultFor)
	case "slow-disk":
		if c.slow == nil {
			return "", fmt.Errorf("slow-disk: not available")
		}
		c.slow.setDelay(slowDiskDelay)
		sleep(ctx, o.faultFor)
		c.slow.setDelay(0)
		return fmt.Sprintf("%v per write and fsync under %s's journal for %v", slowDiskDelay, c.nodes[0].name, o.faultFor), nil
	}
	return "", fmt.Errorf("unknown fault %q", fault)
}

// slowDiskDelay is what each write and fsync under the slow node's data
// folder waits during a slow-disk fault.
const slowDiskDelay = 300 * time.Millisecond

// netFault puts one toxic on the proxies of a random non-empty subset of
// the nodes, both directions, for d, then removes it.
func (c *cluster) netFault(ctx context.Context, fault string, rng *rand.Rand, d time.Duration) (string, error) {
	var typ, attrs, what string
	switch fault {
	case "net-latency":
		typ, attrs, what = "latency", `{"latency":1000,"jitter":500}`, "latency 1000±500 ms"
	case "net-reset":
		typ, attrs, what = "reset_peer", `{"timeout":0}`, "connection resets (TCP RST on data)"
	case "net-halfopen":
		// Data is dropped and the connection kept open: neither side sees
		// a close until its own keepalive or timeout does.
		typ, attrs, what = "timeout", `{"timeout":0}`, "half-open (data dropped, connection kept)"
	case "net-bandwidth":
		typ, attrs, what = "bandwidth", `{"rate":1}`, "bandwidth 1 KB/s"
	}
	k := 1 + rng.IntN(len(c.nodes))
	var hit []*node
	var names []string
	for _, i := range rng.Perm(len(c.nodes))[:k] {
		hit = append(hit, c.nodes[i])
		names = append(names, c.nodes[i].name)
	}
	for _, n := range hit {
		for _, stream := range []string{"upstream", "downstream"} {
			body := fmt.Sprintf(`{"name":"chaos_%s","type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, stream, typ, stream, attrs)
			if _, err := n.proxy.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
				return "", fmt.Errorf("toxic %s on %s: %w", typ, n.name, err)
			}
		}
	}
	sleep(ctx, d)
	for _, n := range hit {
		n.proxy.Toxics.ResetToxics(context.Background())
	}
	return fmt.Sprintf("%s on %s for %v", what, strings.Join(names, ","), d), nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
