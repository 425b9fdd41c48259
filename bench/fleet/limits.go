package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// processOwnFiles is what the gateway and the simulator hold besides
// their sessions' sockets: database connections, listeners, the
// renewals' 64 connections in flight, journal writes, the Go runtime's.
const processOwnFiles = 1024

// portHeadroom is how many loopback ports beyond one a session the run
// needs: the joins' and renewals' short connections, the baselines'.
const portHeadroom = 4096

// portRangeFile is where Linux keeps the ephemeral ports a connect may
// pick from.
const portRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// raiseLimits makes room for n sessions on one machine, or says what to
// run. Every session is a socket in the simulator and one in the gateway,
// so both processes (which inherit this one's limits) need n descriptors
// and some for their own files and database connections (processOwnFiles),
// and every session's connection comes from its own loopback port to the
// one gateway port, so the ephemeral port range must hold n with room for
// the joins' and renewals' short connections. It raises what it can
// (Go's runtime already lifts the soft open-files limit to the hard one;
// raising the hard limit needs CAP_SYS_RESOURCE) and returns a function
// that puts the port range back; otherwise it fails with the command to
// run, or with the largest fleet that fits.
func raiseLimits(n int) (restore func(), err error) {
	restore = func() {}
	want := uint64(n + processOwnFiles)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return restore, fmt.Errorf("open files limit: %w", err)
	}
	if lim.Cur < want {
		raised := syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return restore, fmt.Errorf("%d nodes need %d open files in the gateway and in the simulator, and this machine's hard limit is %d "+
				"(raising it needs root with CAP_SYS_RESOURCE: `ulimit -Hn %d`); the largest fleet that fits is %d nodes: %w",
				n, want, lim.Max, want, int(lim.Max)-processOwnFiles, err)
		}
	}
	b, err := os.ReadFile(portRangeFile)
	if err != nil {
		return restore, nil // not Linux: nothing to widen
	}
	old := strings.TrimSpace(string(b))
	f := strings.Fields(old)
	if len(f) != 2 {
		return restore, fmt.Errorf("%s: unexpected %q", portRangeFile, old)
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return restore, fmt.Errorf("%s: unexpected %q", portRangeFile, old)
	}
	if hi-lo >= n+portHeadroom {
		return restore, nil
	}
	if n+portHeadroom > 65535-1024 {
		return restore, fmt.Errorf("%d nodes need more loopback ports than one address has", n)
	}
	if err := os.WriteFile(portRangeFile, []byte("1024 65535"), 0o644); err != nil {
		return restore, fmt.Errorf("%d nodes need more ephemeral ports than %s (run as root, or `sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\"` first): %w", n, old, err)
	}
	fmt.Fprintf(os.Stderr, "ephemeral ports widened from %q to \"1024 65535\" for this run\n", old)
	return func() { _ = os.WriteFile(portRangeFile, []byte(old), 0o644) }, nil
}
