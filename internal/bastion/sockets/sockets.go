// Package sockets lists the sockets a process listens on, read from Linux's
// /proc: TCP sockets in state LISTEN and every UDP socket, in
// /proc/<pid>/net/{tcp,tcp6,udp,udp6}, kept only when the process holds the
// socket (its inode is one of /proc/<pid>/fd's "socket:[inode]" links).
//
// It exists so tests can prove what a process exposes: the bastion's
// integration test uses it to show that a bastion opens exactly one UDP
// port off loopback (its tunnel's) and no TCP listener off loopback. It
// fails closed: a /proc line it cannot parse is an error, never a skipped
// socket.
package sockets

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Socket is one listening socket of a process.
type Socket struct {
	// Proto names the /proc/<pid>/net file the socket was listed in:
	// "tcp", "tcp6", "udp" or "udp6". A "tcp6"/"udp6" socket bound to
	// [::] also takes IPv4 unless it is IPv6-only.
	Proto string
	// Local is the bound address and port (0.0.0.0 or :: for every
	// address). IPv4-mapped IPv6 addresses are kept as the kernel lists
	// them; Loopback unmaps.
	Local netip.AddrPort
	// Inode is the socket's inode, as in /proc/<pid>/fd's links.
	Inode uint64
}

// Loopback reports whether the socket is bound to a loopback address only
// (127.0.0.0/8, ::1, or an IPv4-mapped loopback address).
func (s Socket) Loopback() bool {
	return s.Local.Addr().Unmap().IsLoopback()
}

// String is "proto addr:port" for messages.
func (s Socket) String() string {
	return s.Proto + " " + s.Local.String()
}

// protos are the /proc/<pid>/net files read, in the order listed (a
// function, so no package state can be changed).
func protos() []string { return []string{"tcp", "tcp6", "udp", "udp6"} }

// tcpListen is the kernel's TCP_LISTEN state as /proc/net/tcp prints it.
const tcpListen = 0x0A

// ListeningSockets lists process pid's TCP sockets in state LISTEN and all
// its UDP sockets. A protocol file that does not exist (IPv6 disabled) lists
// nothing; any other read or parse failure is an error.
func ListeningSockets(pid int) ([]Socket, error) {
	return listening(filepath.Join("/proc", strconv.Itoa(pid)))
}

// listening is ListeningSockets for the process whose /proc directory is dir.
func listening(dir string) ([]Socket, error) {
	inodes, err := socketInodes(filepath.Join(dir, "fd"))
	if err != nil {
		return nil, err
	}
	var out []Socket
	for _, proto := range protos() {
		socks, err := readTable(filepath.Join(dir, "net", proto), proto)
		if err != nil {
			return nil, err
		}
		for _, s := range socks {
			if inodes[s.sock.Inode] && (s.state == tcpListen || strings.HasPrefix(proto, "udp")) {
				out = append(out, s.sock)
			}
		}
	}
	return out, nil
}

// socketInodes reads the socket inodes a process holds from its fd
// directory. An fd closed while we read is skipped.
func socketInodes(fdDir string) (map[uint64]bool, error) {
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, fmt.Errorf("sockets: reading %s: %w", fdDir, err)
	}
	out := map[uint64]bool{}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("sockets: reading fd link: %w", err)
		}
		rest, ok := strings.CutPrefix(link, "socket:[")
		if !ok {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(rest, "]"), 10, 64)
		if err != nil || !strings.HasSuffix(rest, "]") {
			return nil, fmt.Errorf("sockets: fd link %q is not socket:[inode]", link)
		}
		out[ino] = true
	}
	return out, nil
}

// entry is one parsed /proc/net line.
type entry struct {
	sock  Socket
	state uint8
}

// readTable parses one /proc/<pid>/net/<proto> file.
func readTable(path, proto string) ([]entry, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sockets: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var out []entry
	for n := 1; sc.Scan(); n++ {
		if n == 1 {
			continue // the header
		}
		sock, state, err := parseLine(proto, sc.Text())
		if err != nil {
			return nil, fmt.Errorf("sockets: %s line %d: %w", path, n, err)
		}
		out = append(out, entry{sock: sock, state: state})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("sockets: reading %s: %w", path, err)
	}
	return out, nil
}

// parseLine parses one entry line of /proc/net/{tcp,tcp6,udp,udp6}:
//
//	sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
//
// The local address is hex: IPv4 as one 32-bit word, IPv6 as four, each
// word printed from the kernel's memory in host byte order; the port is hex
// in network order.
func parseLine(proto, line string) (Socket, uint8, error) {
	f := strings.Fields(line)
	if len(f) < 10 || !strings.HasSuffix(f[0], ":") {
		return Socket{}, 0, errors.New("not a socket entry line")
	}
	local, err := parseAddrPort(f[1], strings.HasSuffix(proto, "6"))
	if err != nil {
		return Socket{}, 0, err
	}
	if len(f[3]) != 2 {
		return Socket{}, 0, errors.New("state is not two hex digits")
	}
	state, err := strconv.ParseUint(f[3], 16, 8)
	if err != nil {
		return Socket{}, 0, errors.New("state is not hex")
	}
	ino, err := strconv.ParseUint(f[9], 10, 64)
	if err != nil {
		return Socket{}, 0, errors.New("inode is not a decimal number")
	}
	return Socket{Proto: proto, Local: local, Inode: ino}, uint8(state), nil
}

// parseAddrPort parses "ADDR:PORT" in /proc/net's hex form.
func parseAddrPort(s string, v6 bool) (netip.AddrPort, error) {
	hexAddr, hexPort, ok := strings.Cut(s, ":")
	want := 8
	if v6 {
		want = 32
	}
	if !ok || len(hexAddr) != want || len(hexPort) != 4 {
		return netip.AddrPort{}, fmt.Errorf("address is not %d:4 hex digits", want)
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return netip.AddrPort{}, errors.New("port is not hex")
	}
	var b [16]byte
	for i := 0; i < want/8; i++ {
		w, err := strconv.ParseUint(hexAddr[i*8:i*8+8], 16, 32)
		if err != nil {
			return netip.AddrPort{}, errors.New("address is not hex")
		}
		binary.NativeEndian.PutUint32(b[i*4:], uint32(w))
	}
	addr := netip.AddrFrom16(b)
	if !v6 {
		addr = netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrPortFrom(addr, uint16(port)), nil
}
