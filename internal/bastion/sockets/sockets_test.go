package sockets

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// own lists this test process's sockets.
func own(t *testing.T) []Socket {
	t.Helper()
	got, err := ListeningSockets(os.Getpid())
	if err != nil {
		t.Fatalf("ListeningSockets: %v", err)
	}
	return got
}

func TestListeningSocketsFindsExactlyOwnListeners(t *testing.T) {
	before := own(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	uc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	// An established connection (both ends in this process) is no
	// listener and must not be reported.
	client, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	want := []Socket{
		{Proto: "tcp", Local: ln.Addr().(*net.TCPAddr).AddrPort()},
		{Proto: "udp", Local: netip.AddrPortFrom(netip.IPv4Unspecified(), uc.LocalAddr().(*net.UDPAddr).AddrPort().Port())},
	}
	got := added(before, own(t))
	if !sameSockets(got, want) {
		t.Fatalf("sockets added by the test = %v, want exactly %v", got, want)
	}
	for _, s := range got {
		if s.Inode == 0 {
			t.Errorf("%v has no inode", s)
		}
	}
	if !got[slices.IndexFunc(got, func(s Socket) bool { return s.Proto == "tcp" })].Loopback() {
		t.Errorf("the 127.0.0.1 listener is not reported as loopback")
	}
	if got[slices.IndexFunc(got, func(s Socket) bool { return s.Proto == "udp" })].Loopback() {
		t.Errorf("the 0.0.0.0 UDP socket is reported as loopback")
	}

	ln.Close()
	uc.Close()
	if left := added(before, own(t)); len(left) != 0 {
		t.Fatalf("after closing, still reported: %v", left)
	}
}

func TestListeningSocketsIPv6(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	defer ln.Close()
	want := Socket{Proto: "tcp6", Local: ln.Addr().(*net.TCPAddr).AddrPort()}
	for _, s := range own(t) {
		if s.Proto == want.Proto && s.Local == want.Local {
			if !s.Loopback() {
				t.Errorf("%v not reported as loopback", s)
			}
			return
		}
	}
	t.Fatalf("tcp6 listener %v not found in %v", want, own(t))
}

// childEnv makes the test binary, run again as a child, listen on
// 127.0.0.1 and print its port (see TestChildListener).
const childEnv = "SOCKETS_TEST_CHILD_LISTENER"

// TestChildListener is the child's body; in a normal run it does nothing.
func TestChildListener(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		return
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		os.Exit(2)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	_, _ = io.Copy(io.Discard, os.Stdin) // hold the listener until the parent closes stdin
	os.Exit(0)
}

// Another process's listener, in the same network namespace (so in the
// same /proc/net tables), is that process's, never ours: ownership is by
// the fds' socket inodes.
func TestListeningSocketsOwnershipIsByFd(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildListener$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	var port uint16
	if _, err := fmt.Fscan(stdout, &port); err != nil {
		t.Fatalf("reading the child's port: %v", err)
	}
	childAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	for _, s := range own(t) {
		if s.Local == childAddr {
			t.Fatalf("the child's listener %v is reported as ours", s)
		}
	}
	theirs, err := ListeningSockets(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(theirs) != 1 || theirs[0].Proto != "tcp" || theirs[0].Local != childAddr {
		t.Fatalf("child's sockets = %v, want exactly tcp %v", theirs, childAddr)
	}
}

func TestParseLine(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("fixtures are little-endian /proc lines")
	}
	cases := []struct {
		proto, line string
		want        Socket
		state       uint8
	}{
		{"tcp", "   0: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0000000000000000 100 0 0 10 0",
			Socket{"tcp", netip.MustParseAddrPort("127.0.0.1:3306"), 12345}, 0x0A},
		{"udp", "  42: 00000000:D431 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 777 2 0000000000000000 0",
			Socket{"udp", netip.MustParseAddrPort("0.0.0.0:54321"), 777}, 0x07},
		{"tcp6", "   1: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4876 1 0000000059086541 100 0 0 10 0",
			Socket{"tcp6", netip.MustParseAddrPort("[::1]:8080"), 4876}, 0x0A},
		{"udp6", "   3: 0000000000000000FFFF00000100007F:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 99 2 0000000000000000 0",
			Socket{"udp6", netip.MustParseAddrPort("[::ffff:127.0.0.1]:53"), 99}, 0x07},
	}
	for _, c := range cases {
		got, state, err := parseLine(c.proto, c.line)
		if err != nil || got != c.want || state != c.state {
			t.Errorf("parseLine(%s, %q) = %v, %#x, %v; want %v, %#x", c.proto, c.line, got, state, err, c.want, c.state)
		}
	}
}

func TestParseLineRefusesMalformed(t *testing.T) {
	for _, line := range []string{
		"",
		"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
		"   0: 0100007F:0CEA 00000000:0000 0A",                                                        // short
		"   0: 0100007G:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 12345 1", // bad hex
		"   0: 0100007F:CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 12345 1",  // short port
		"   0: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 -1 1",    // bad inode
		"   0: 00000000000000000000000001000000:1F90 0:0 0A 0:0 0:0 0 0 0 1 1",                        // v6 in the v4 table
		"   0  0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 12345 1", // no "sl:"
		"   0: 0100007F:0CEA 00000000:0000 A 00000000:00000000 00:00000000 00000000  1000 0 12345 1",  // one-digit state
	} {
		if s, _, err := parseLine("tcp", line); err == nil {
			t.Errorf("parseLine(%q) = %v, want an error", line, s)
		}
	}
}

// added is after minus before (by proto, address and inode).
func added(before, after []Socket) []Socket {
	var out []Socket
	for _, s := range after {
		if !slices.Contains(before, s) {
			out = append(out, s)
		}
	}
	return out
}

// sameSockets compares by proto and address (inodes are not known ahead).
func sameSockets(got, want []Socket) bool {
	key := func(ss []Socket) []string {
		var k []string
		for _, s := range ss {
			k = append(k, s.Proto+" "+s.Local.String())
		}
		slices.Sort(k)
		return k
	}
	return strings.Join(key(got), ",") == strings.Join(key(want), ",")
}

// formatLine writes s back in /proc/net's form (the inverse of parseLine),
// for the fuzz target's round trip.
func formatLine(s Socket, state uint8) string {
	var hexAddr string
	if strings.HasSuffix(s.Proto, "6") {
		b := s.Local.Addr().As16()
		for i := 0; i < 4; i++ {
			hexAddr += fmt.Sprintf("%08X", binary.NativeEndian.Uint32(b[i*4:]))
		}
	} else {
		b := s.Local.Addr().As4()
		hexAddr = fmt.Sprintf("%08X", binary.NativeEndian.Uint32(b[:]))
	}
	return fmt.Sprintf("   0: %s:%04X 00000000:0000 %02X 00000000:00000000 00:00000000 00000000 0 0 %d 1",
		hexAddr, s.Local.Port(), state, s.Inode)
}
