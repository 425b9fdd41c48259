//go:build linux

package netguard

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// netnsUnavailable skips, loudly, when the namespace test cannot run here;
// with BC_REQUIRE_NETNS=1 (as CI sets) it fails instead.
func netnsUnavailable(t *testing.T, why string) {
	t.Helper()
	msg := "NETNS INTEGRATION TEST NOT RUN: " + why + " (needs root and iproute2; set BC_REQUIRE_NETNS=1 to make this fatal)"
	if os.Getenv("BC_REQUIRE_NETNS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// ipCmd runs iproute2 and fails the test on error.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// makeNetns creates a network namespace that the test deletes at cleanup.
func makeNetns(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		netnsUnavailable(t, fmt.Sprintf("ip netns add: %v: %s", err, strings.TrimSpace(string(out))))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	ipCmd(t, "-n", name, "link", "set", "lo", "up")
}

// inNetns runs f on a goroutine locked to an OS thread that has joined the
// named network namespace, so every netlink socket f opens asks that
// namespace's kernel tables. The thread is never unlocked: when the
// goroutine ends the runtime discards it instead of reusing a thread left
// in a foreign namespace.
func inNetns(t *testing.T, name string, f func()) {
	t.Helper()
	nsFile, err := os.Open("/var/run/netns/" + name)
	if err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	defer nsFile.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(nsFile.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		f()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestNetnsThisMachine builds namespaces with iproute2 and checks the Linux
// LocalChecker against the real kernel. Every address is inside 11.0.0.0/8
// or 3ffe:1::/64, which the classifier allows, so each refusal below is the
// this-machine check and nothing else. No packet is sent: route lookups and
// address listings only.
//
//	ns A (checker)                          ns B / ns G
//	vA0 11.22.44.1/24  <-- veth -->  vB0 11.22.44.2 (B)
//	vA1 11.22.55.1/24  <-- veth -->  vG0 11.22.55.2 (G), default route via it
//	br0 11.22.66.1/24, ports: vA2 (veth to B) and tap tpA0
//	br1 11.22.77.1/24, ports: vA3 (veth to B) and vxlan vxA0 (leaves)
//	lo: local 11.22.33.0/24 and local 3ffe:1::/64 (AnyIP)
func TestNetnsThisMachine(t *testing.T) {
	if os.Geteuid() != 0 {
		netnsUnavailable(t, "not root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		netnsUnavailable(t, "ip (iproute2) not found")
	}
	pid := os.Getpid()
	nsA, nsB, nsG := fmt.Sprintf("bcng%d-a", pid), fmt.Sprintf("bcng%d-b", pid), fmt.Sprintf("bcng%d-g", pid)
	makeNetns(t, nsA)
	makeNetns(t, nsB)
	makeNetns(t, nsG)

	veth := func(a, nsa, b, nsb string) {
		ipCmd(t, "-n", nsa, "link", "add", a, "type", "veth", "peer", "name", b, "netns", nsb)
		ipCmd(t, "-n", nsa, "link", "set", a, "up")
		ipCmd(t, "-n", nsb, "link", "set", b, "up")
	}
	veth("vA0", nsA, "vB0", nsB)
	ipCmd(t, "-n", nsA, "addr", "add", "11.22.44.1/24", "dev", "vA0")
	ipCmd(t, "-n", nsB, "addr", "add", "11.22.44.2/24", "dev", "vB0")

	veth("vA1", nsA, "vG0", nsG)
	ipCmd(t, "-n", nsA, "addr", "add", "11.22.55.1/24", "dev", "vA1")
	ipCmd(t, "-n", nsG, "addr", "add", "11.22.55.2/24", "dev", "vG0")
	ipCmd(t, "-n", nsA, "route", "add", "default", "via", "11.22.55.2", "dev", "vA1")

	ipCmd(t, "-n", nsA, "link", "add", "br0", "type", "bridge")
	ipCmd(t, "-n", nsA, "addr", "add", "11.22.66.1/24", "dev", "br0")
	ipCmd(t, "-n", nsA, "link", "set", "br0", "up")
	veth("vA2", nsA, "vB2", nsB)
	ipCmd(t, "-n", nsA, "link", "set", "vA2", "master", "br0")
	ipCmd(t, "-n", nsA, "tuntap", "add", "dev", "tpA0", "mode", "tap")
	ipCmd(t, "-n", nsA, "link", "set", "tpA0", "master", "br0")

	ipCmd(t, "-n", nsA, "link", "add", "br1", "type", "bridge")
	ipCmd(t, "-n", nsA, "addr", "add", "11.22.77.1/24", "dev", "br1")
	ipCmd(t, "-n", nsA, "link", "set", "br1", "up")
	veth("vA3", nsA, "vB3", nsB)
	ipCmd(t, "-n", nsA, "link", "set", "vA3", "master", "br1")
	ipCmd(t, "-n", nsA, "link", "add", "vxA0", "type", "vxlan", "id", "42", "dstport", "4789", "remote", "11.22.55.2", "dev", "vA1")
	ipCmd(t, "-n", nsA, "link", "set", "vxA0", "master", "br1")

	ipCmd(t, "-n", nsA, "route", "add", "local", "11.22.33.0/24", "dev", "lo")
	ipCmd(t, "-n", nsA, "-6", "route", "add", "local", "3ffe:1::/64", "dev", "lo")

	cases := []struct {
		name string
		addr string
		want Reason
	}{
		{"own public interface address", "11.22.44.1", ReasonThisMachine},
		{"veth peer address", "11.22.44.2", ReasonThisMachine},
		{"veth peer address, IPv4-mapped", "::ffff:11.22.44.2", ReasonThisMachine},
		{"AnyIP local route on lo", "11.22.33.7", ReasonThisMachine},
		{"AnyIP local route on lo, IPv6", "3ffe:1::9", ReasonThisMachine},
		{"bridge of veth and tap", "11.22.66.9", ReasonThisMachine},
		{"subnet broadcast of a veth link", "11.22.44.255", ReasonThisMachine},
		{"bridge with a vxlan port is the LAN", "11.22.77.9", Allowed},
		{"public-looking address via the default route", "11.22.88.7", Allowed},
		{"neighbour on the default route's link", "11.22.55.9", Allowed},
		{"public-looking IPv6 with no IPv6 route", "2a00:1450::1", Allowed},
	}
	type result struct {
		got    Reason
		detail string
	}
	results := make([]result, len(cases))
	inNetns(t, nsA, func() {
		d, err := NewDialer(Config{Resolver: newFakeResolver(nil)}) // real NewLocalChecker
		if err != nil {
			panic(err) // not reachable: no allow list
		}
		for i, tc := range cases {
			v := d.CheckAddr(context.Background(), netip.MustParseAddr(tc.addr))
			results[i] = result{v.Reason, v.Detail}
		}
	})
	for i, tc := range cases {
		if results[i].got != tc.want {
			t.Errorf("%s: CheckAddr(%s) = %q (%s), want %q", tc.name, tc.addr, results[i].got, results[i].detail, tc.want)
		}
	}

	// The same addresses judged from ns G, where none of them is local
	// except G's own, show the answers above come from ns A's tables.
	var fromG, ownG Reason
	inNetns(t, nsG, func() {
		d, err := NewDialer(Config{Resolver: newFakeResolver(nil)})
		if err != nil {
			panic(err)
		}
		fromG = d.CheckAddr(context.Background(), netip.MustParseAddr("11.22.33.7")).Reason
		ownG = d.CheckAddr(context.Background(), netip.MustParseAddr("11.22.55.2")).Reason
	})
	if fromG != Allowed || ownG != ReasonThisMachine {
		t.Errorf("from ns G: 11.22.33.7 = %q (want allowed), 11.22.55.2 = %q (want this-machine)", fromG, ownG)
	}
}
