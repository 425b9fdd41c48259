package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/netguard"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Egress defaults.
const (
	// DefaultEgressRange is the IPv4 range egress sandboxes' links are cut
	// from, one /30 per sandbox (16,384 of them).
	DefaultEgressRange = "10.253.0.0/16"
	// DefaultEgressPort is the egress proxy's port on each link's host end.
	DefaultEgressPort = 3128
	// EgressIfPrefix starts the host end of every sandbox link, and the
	// firewall matches it.
	EgressIfPrefix = "bcs"
	// egressTable is the nftables table (family inet) that confines what a
	// sandbox link may reach on the host.
	egressTable = "bcsandbox"
	// netnsDir is where iproute2 keeps named network namespaces.
	netnsDir = "/var/run/netns"
	// sandboxIf is the sandbox end's name inside its namespace.
	sandboxIf = "eth0"
)

// Link is an egress sandbox's network, kept in its state so that a
// restarted bcd serves it again or removes it.
type Link struct {
	Slot        int    `json:"slot"`         // index of the /30 in the range
	HostIf      string `json:"host_if"`      // the host end, bcs + 12 hex
	NetNS       string `json:"netns"`        // named network namespace (iproute2)
	HostAddr    string `json:"host_addr"`    // the host end's address: the proxy listens here
	SandboxAddr string `json:"sandbox_addr"` // the sandbox end's address
	ProxyPort   int    `json:"proxy_port"`
}

// NetNSPath is the namespace file runc joins.
func (l Link) NetNSPath() string { return filepath.Join(netnsDir, l.NetNS) }

// ProxyURL is the proxy the sandbox's HTTP_PROXY names.
func (l Link) ProxyURL() string {
	return "http://" + net.JoinHostPort(l.HostAddr, strconv.Itoa(l.ProxyPort))
}

// Env is what an egress sandbox's processes get so that ordinary clients
// use the proxy.
func (l Link) Env() map[string]string {
	u := l.ProxyURL()
	return map[string]string{"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u}
}

// EgressConfig configures the egress wiring of a host.
type EgressConfig struct {
	// Range is the IPv4 range links are cut from (a /30 each); it should
	// be unused on this machine and its networks. Zero means
	// DefaultEgressRange.
	Range netip.Prefix
	// Port is the proxy's port on every link's host end; zero means
	// DefaultEgressPort. Every bcd on a machine must use the same port:
	// the firewall table is per machine.
	Port int
	// Dialer judges and dials every target of the proxy; nil means
	// netguard's default (system resolver, this machine's addresses
	// refused).
	Dialer *netguard.Dialer
	// Log receives setup lines and the proxy's per-connection lines.
	Log *slog.Logger
	// GuardTicks, when set, drives the firewall guard instead of a
	// ticker every FirewallCheckEvery (tests).
	GuardTicks <-chan time.Time
}

// FirewallCheckEvery is how often the guard re-checks the firewall table.
const FirewallCheckEvery = 5 * time.Second

// Egress wires egress sandboxes: per sandbox a named network namespace
// with one veth pair to the host, addresses from a /30 of the range, no
// default route inside (the host end is the only address the sandbox
// can reach), and a listener of the host's one netguard egress proxy on
// the host end. An nftables table lets a sandbox link reach only that
// port: every other packet from a link to the host is refused, and
// nothing from or to a link is forwarded.
//
// A guard re-checks the table every FirewallCheckEvery: a table that was
// flushed, deleted or changed is loaded again, and while it cannot be,
// egress fails closed: every link's host end is set down (nothing from a
// sandbox reaches the host or the proxy) until the table is back.
type Egress struct {
	cfg   EgressConfig
	proxy *netguard.Proxy
	mu    sync.Mutex
	serve map[string]*listener // sandbox id → its proxy listener
	nft   string               // the nft binary
	want  [32]byte             // hash of the table as listed after loading it
	down  bool                 // links set down: the table could not be restored
	stop  context.CancelFunc
	done  chan struct{}
}

type listener struct {
	cancel context.CancelFunc
	done   chan struct{}
	link   Link
}

// NewEgress checks the configuration, builds the proxy and installs the
// firewall table (idempotently: it replaces the table it owns).
func NewEgress(ctx context.Context, cfg EgressConfig) (*Egress, error) {
	if !cfg.Range.IsValid() {
		cfg.Range = netip.MustParsePrefix(DefaultEgressRange)
	}
	cfg.Range = cfg.Range.Masked()
	if !cfg.Range.Addr().Is4() || cfg.Range.Bits() > 30 {
		return nil, fmt.Errorf("sandbox: egress range %s: an IPv4 prefix of /30 or wider", cfg.Range)
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultEgressPort
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("sandbox: egress port %d out of range", cfg.Port)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Dialer == nil {
		d, err := netguard.NewDialer(netguard.Config{})
		if err != nil {
			return nil, fmt.Errorf("sandbox: egress dialer: %w", err)
		}
		cfg.Dialer = d
	}
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		return nil, fmt.Errorf("sandbox: egress descriptor budget: %w", err)
	}
	p, err := netguard.NewProxy(netguard.ProxyConfig{Dialer: cfg.Dialer, Logger: cfg.Log,
		MaxConns: ProxyConnBudget(nofile.Cur), MaxConnsPerListener: netguard.DefaultMaxConnsPerListener})
	if err != nil {
		return nil, fmt.Errorf("sandbox: egress proxy: %w", err)
	}
	e := &Egress{cfg: cfg, proxy: p, serve: map[string]*listener{}, nft: "nft", done: make(chan struct{})}
	if err := e.installFirewall(ctx); err != nil {
		return nil, err
	}
	ticks := cfg.GuardTicks
	var ticker *time.Ticker
	if ticks == nil {
		ticker = time.NewTicker(FirewallCheckEvery)
		ticks = ticker.C
	}
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.stop = cancel
	go func() {
		defer close(e.done)
		if ticker != nil {
			defer ticker.Stop()
		}
		for {
			select {
			case <-gctx.Done():
				return
			case <-ticks:
				e.GuardFirewall(gctx)
			}
		}
	}()
	return e, nil
}

// listFirewall lists the table and hashes the listing.
func (e *Egress) listFirewall(ctx context.Context, nft string) ([32]byte, error) {
	out, err := exec.CommandContext(ctx, nft, "list", "table", "inet", egressTable).Output()
	if err != nil {
		return [32]byte{}, fmt.Errorf("sandbox: egress firewall list: %w", err)
	}
	return sha256.Sum256(out), nil
}

// GuardFirewall checks the firewall table once: as loaded, nothing to
// do (links set down earlier come back up); flushed, deleted or changed,
// it is loaded again; and when that fails, every link's host end is set
// down, so egress stops rather than run without its firewall.
func (e *Egress) GuardFirewall(ctx context.Context) {
	e.mu.Lock()
	nft, want, down := e.nft, e.want, e.down
	e.mu.Unlock()
	if got, err := e.listFirewall(ctx, nft); err == nil && got == want {
		if down {
			e.setLinks(ctx, true)
		}
		return
	}
	e.cfg.Log.Warn("sandbox egress firewall changed or gone, restoring")
	if err := e.installFirewall(ctx); err != nil {
		e.cfg.Log.Error("sandbox egress firewall not restored, egress stopped", "err", err)
		e.setLinks(ctx, false)
		return
	}
	e.cfg.Log.Info("sandbox egress firewall restored")
	if down {
		e.setLinks(ctx, true)
	}
}

// setLinks sets every served link's host end up or down, and records it.
func (e *Egress) setLinks(ctx context.Context, up bool) {
	e.mu.Lock()
	var links []Link
	for _, l := range e.serve {
		links = append(links, l.link)
	}
	e.down = !up
	e.mu.Unlock()
	state := "down"
	if up {
		state = "up"
	}
	for _, l := range links {
		if err := ip(ctx, "link", "set", l.HostIf, state); err != nil {
			e.cfg.Log.Error("sandbox egress link not set "+state, "host_if", l.HostIf, "err", err)
		}
	}
}

// Stopped reports whether egress is stopped because the firewall could
// not be restored.
func (e *Egress) Stopped() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.down
}

// ProxyConnBudget is how many client connections the egress proxy may
// hold at once in a process allowed nofile descriptors: each costs at
// most two (client and upstream), and the proxy gets at most a quarter
// of them in connections, half in descriptors. The other half is the
// daemon's own (its API, journal, database, runtimes), never lent to
// the proxy, so no number of sandboxes' connections starves it.
func ProxyConnBudget(nofile uint64) int {
	return int(min(uint64(netguard.DefaultMaxConns), nofile/4))
}

// firewallRules is the nftables table confining sandbox links: from a
// link, only TCP to the proxy port on an address of the range reaches
// the host (TCP elsewhere is reset, anything else dropped), and nothing
// is forwarded from or to a link. The leading add and delete make the
// load replace an older copy of the table in one transaction.
func (e *Egress) firewallRules() string {
	return fmt.Sprintf(`table inet %[1]s
delete table inet %[1]s
table inet %[1]s {
	chain input {
		type filter hook input priority filter - 10; policy accept;
		iifname "%[2]s*" ip daddr %[3]s tcp dport %[4]d accept
		iifname "%[2]s*" meta l4proto tcp reject with tcp reset
		iifname "%[2]s*" drop
	}
	chain forward {
		type filter hook forward priority filter - 10; policy accept;
		iifname "%[2]s*" drop
		oifname "%[2]s*" drop
	}
}
`, egressTable, EgressIfPrefix, e.cfg.Range, e.cfg.Port)
}

func (e *Egress) installFirewall(ctx context.Context) error {
	e.mu.Lock()
	nft := e.nft
	e.mu.Unlock()
	cmd := exec.CommandContext(ctx, nft, "-f", "-")
	cmd.Stdin = strings.NewReader(e.firewallRules())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("sandbox: egress firewall: %w: %s", err, strings.TrimSpace(string(out)))
	}
	want, err := e.listFirewall(ctx, nft)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.want = want
	e.mu.Unlock()
	return nil
}

// Port is the proxy's port on every link.
func (e *Egress) Port() int { return e.cfg.Port }

// slots is how many /30s the range holds.
func (e *Egress) slots() int { return 1 << (32 - e.cfg.Range.Bits() - 2) }

// linkAt returns the link of sandbox id at a slot of the range: the /30's
// first host address is the host end, the second the sandbox end.
func (e *Egress) linkAt(id string, slot int) Link {
	base := e.cfg.Range.Addr().As4()
	n := binary.BigEndian.Uint32(base[:]) + uint32(slot)*4
	var h, s [4]byte
	binary.BigEndian.PutUint32(h[:], n+1)
	binary.BigEndian.PutUint32(s[:], n+2)
	sum := sha256.Sum256([]byte(id))
	return Link{Slot: slot, HostIf: EgressIfPrefix + hex.EncodeToString(sum[:6]), NetNS: "bc-" + id,
		HostAddr: netip.AddrFrom4(h).String(), SandboxAddr: netip.AddrFrom4(s).String(), ProxyPort: e.cfg.Port}
}

// Plan picks sandbox id's link: the slot its id hashes to, or the next
// one free of the host's other links (taken) and of every address this
// machine already has (another bcd's sandboxes).
func (e *Egress) Plan(id string, taken map[int]bool) (Link, error) {
	used := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				used[p.Addr().String()] = true
			}
		}
	}
	sum := sha256.Sum256([]byte(id))
	n := e.slots()
	start := int(binary.BigEndian.Uint32(sum[:4]) % uint32(n))
	for i := range n {
		l := e.linkAt(id, (start+i)%n)
		if !taken[l.Slot] && !used[l.HostAddr] && !used[l.SandboxAddr] {
			return l, nil
		}
	}
	return Link{}, errors.New("sandbox: egress range exhausted")
}

// ip runs iproute2 with a fixed argument vector.
func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Setup makes l: the namespace, the veth pair with its addresses (no
// default route inside), and the proxy's listener on the host end. With
// nsPID > 0 the namespace is that process's network namespace (one the
// sandbox's user namespace owns, see UserNS), named for l; else a new
// one.
func (e *Egress) Setup(ctx context.Context, id string, l Link, nsPID int) error {
	if err := spec.ValidSandboxID(id); err != nil {
		return err
	}
	first := []string{"netns", "add", l.NetNS}
	if nsPID > 0 {
		first = []string{"netns", "attach", l.NetNS, strconv.Itoa(nsPID)}
	}
	steps := [][]string{
		first,
		{"link", "add", l.HostIf, "type", "veth", "peer", "name", sandboxIf, "netns", l.NetNS},
		{"addr", "add", l.HostAddr + "/30", "dev", l.HostIf},
		{"link", "set", l.HostIf, "up"},
		{"-n", l.NetNS, "link", "set", "lo", "up"},
		{"-n", l.NetNS, "addr", "add", l.SandboxAddr + "/30", "dev", sandboxIf},
		{"-n", l.NetNS, "link", "set", sandboxIf, "up"},
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			return fmt.Errorf("sandbox: egress link: %w", err)
		}
	}
	// No IPv6 on the host end: the firewall drops it anyway, and the
	// link-local address would be one more address of this machine.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+l.HostIf+"/disable_ipv6", []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sandbox: egress link ipv6: %w", err)
	}
	if err := e.Listen(ctx, id, l); err != nil {
		return err
	}
	if e.Stopped() {
		// Egress is stopped until the firewall is back: so is this link.
		e.setLinks(ctx, false)
	}
	return nil
}

// Listen serves the proxy on l's host end (at Setup, and again for a
// sandbox that survived a restart of bcd).
func (e *Egress) Listen(ctx context.Context, id string, l Link) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(l.HostAddr, strconv.Itoa(l.ProxyPort)))
	if err != nil {
		return fmt.Errorf("sandbox: egress proxy listen: %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ls := &listener{cancel: cancel, done: make(chan struct{}), link: l}
	e.mu.Lock()
	old := e.serve[id]
	e.serve[id] = ls
	e.mu.Unlock()
	if old != nil {
		old.stop()
	}
	go func() {
		defer close(ls.done)
		if err := e.proxy.Serve(sctx, ln); err != nil {
			e.cfg.Log.Warn("sandbox egress proxy stopped", "sandbox_id", id, "err", err)
		}
	}()
	e.cfg.Log.Info("sandbox egress proxy listening", "sandbox_id", id, "addr", ln.Addr().String())
	return nil
}

func (l *listener) stop() {
	l.cancel()
	<-l.done
}

// Teardown stops the sandbox's proxy listener and deletes its veth pair
// and namespace; what is already gone is no error.
func (e *Egress) Teardown(ctx context.Context, id string, l Link) error {
	e.mu.Lock()
	ls := e.serve[id]
	delete(e.serve, id)
	e.mu.Unlock()
	if ls != nil {
		ls.stop()
	}
	return RemoveLink(ctx, l)
}

// RemoveLink deletes a link's veth pair (both ends go together) and its
// namespace, whichever exist.
func RemoveLink(ctx context.Context, l Link) error {
	if l.HostIf == "" || !strings.HasPrefix(l.HostIf, EgressIfPrefix) || !strings.HasPrefix(l.NetNS, "bc-") {
		return fmt.Errorf("sandbox: not a sandbox link: %q %q", l.HostIf, l.NetNS)
	}
	if _, err := os.Stat("/sys/class/net/" + l.HostIf); err == nil {
		if err := ip(ctx, "link", "del", l.HostIf); err != nil {
			return fmt.Errorf("sandbox: egress link: %w", err)
		}
	}
	if _, err := os.Stat(l.NetNSPath()); err == nil {
		if err := ip(ctx, "netns", "del", l.NetNS); err != nil {
			return fmt.Errorf("sandbox: egress netns: %w", err)
		}
	}
	return nil
}

// Close stops the guard and every listener (links stay: their sandboxes
// outlive bcd).
func (e *Egress) Close() {
	e.stop()
	<-e.done
	e.mu.Lock()
	ls := e.serve
	e.serve = map[string]*listener{}
	e.mu.Unlock()
	for _, l := range ls {
		l.stop()
	}
}
