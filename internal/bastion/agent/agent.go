// Package agent is the bastion: bcd on a person's own machine that pairs
// with the control plane as role bastion, dials out, and lets the control
// plane use a few gated lanes on it, without ever opening the machine to
// the control plane or anyone else.
//
// The bastion holds a mutual-TLS Bastion stream to the gateway (it dials
// out; see internal/gateway/bastion.go). Over it, it sends the public half
// of a WireGuard key it made here, and gets the tunnel's configuration and
// the signed grants. It brings up a user-space WireGuard tunnel
// (internal/bastion/wgtun) whose only peer is the control plane, at one
// allowed address; a configuration offering anything wider is refused and
// no tunnel comes up. Inside the tunnel only gated listeners accept, each
// connection checked at accept against the grants (verified here under the
// key pinned on first use; deny beats allow): the inference forwards
// (internal/bastion/forward), the service slots, and the egress lane's
// parked workers (internal/bastion/egresslane). Every accept and refusal
// goes to an append-only hash-chained log here (internal/bastion/chainlog)
// and, while connected, to the control plane's audit log.
//
// The bastion needs no root: the tunnel is in user space and every socket
// it opens outside the tunnel binds loopback, except the tunnel's one UDP
// port.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/bastion/forward"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/netguard"
)

// Tunnel ports of the lanes (the control plane dials them inside the
// tunnel; the egress port is the control plane's, where workers park).
const (
	PortOllama    = 11434
	PortLLM       = 18001
	PortPII       = 18002
	SlotFirstPort = 18100
	SlotLastPort  = 18199
	MaxServices   = SlotLastPort - SlotFirstPort + 1
)

// MaxStreams is the most live streams one pairing holds (forwards and
// service slots together); the next is refused as busy.
const MaxStreams = 16

// Errors Run returns.
var (
	// ErrUnpaired: the control plane unpaired this bastion; its keys
	// are deleted and it does not reconnect.
	ErrUnpaired = errors.New("bastion: unpaired by the control plane; keys deleted")
	// ErrRevoked: the bastion's certificate was revoked.
	ErrRevoked         = errors.New("bastion: certificate revoked; pair again with a new pairing token")
	errGrantKeyChanged = errors.New("bastion: the control plane offered a grant key other than the one pinned at pairing")
)

// Service is one server the person exposes in a service slot: reached
// only through its Unix socket.
type Service struct {
	Name string // [a-z0-9][a-z0-9-]{0,62}
	Path string // the server's Unix socket
}

var serviceName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ParseService parses NAME=unix:PATH (bcd bastion run --service).
func ParseService(s string) (Service, error) {
	name, target, ok := strings.Cut(s, "=")
	path, isUnix := strings.CutPrefix(target, "unix:")
	if !ok || !isUnix || !serviceName.MatchString(name) || !filepath.IsAbs(path) {
		return Service{}, fmt.Errorf("bastion: --service %q: want NAME=unix:/absolute/socket/path with NAME of a-z, 0-9 and -", s)
	}
	return Service{Name: name, Path: path}, nil
}

// Config configures Run.
type Config struct {
	DataDir  string
	Gateway  string    // overrides the join record's gateway when set
	Services []Service // service slots, in slot order after sorting by name
	// Forwards maps each inference forward to its upstream host:port
	// (from OLLAMA_ADDR, BC_LLM_ADDR, BC_PII_ADDR, or the kind's default);
	// a kind missing from the map is not served.
	Forwards map[forward.Kind]string
	// EgressEnabled is the owner's consent to the egress lane (bcd bastion
	// run --egress); without it the lane refuses every job
	// (egresslane.ReasonNotEnabled), whatever the grants hold.
	EgressEnabled bool
	// Egress judges the egress lane's targets; nil: netguard's rules with
	// no exception.
	Egress   *netguard.Dialer
	Local    netguard.LocalChecker
	Resolver netguard.Resolver
	Clock    clock.Clock
	Log      *slog.Logger
	Version  string
	// ActionRuntime runs action ops' dry runs: runc (default) or runsc.
	ActionRuntime string
	// Shell is the terminals' shell (default $SHELL, else /bin/sh).
	Shell string
	// IsRoot tells whether the bastion runs as root (default: its
	// effective uid is 0); root terminals and root commands need it.
	IsRoot func() bool
	// MinBackoff, MaxBackoff bound reconnect delays (200ms to 30s).
	MinBackoff, MaxBackoff time.Duration
}

// Pair joins as role bastion with a one-time pairing token (the checks of
// a node join: pin, signed bundle, verified TLS), then makes the bastion's
// WireGuard key here. It needs no root.
func Pair(ctx context.Context, dataDir, gateway, token, name string) (string, error) {
	if _, err := os.Stat(filepath.Join(dataDir, unpairedFile)); err == nil {
		return "", fmt.Errorf("bastion: %s was unpaired; pair with a new data folder", dataDir)
	}
	rec, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dataDir, Gateway: gateway, Token: token, Name: name})
	if err != nil {
		return "", err
	}
	if err := makeWGKey(dataDir); err != nil {
		return "", err
	}
	if err := atomicfile.Write(filepath.Join(dataDir, pairedFile), []byte(rec.NodeID+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("bastion: %w", err)
	}
	return rec.NodeID, nil
}

// withDefaults fills cfg's zero fields and checks the services.
func withDefaults(cfg Config) (Config, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 200 * time.Millisecond
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.Local == nil {
		cfg.Local = netguard.NewLocalChecker()
	}
	if cfg.IsRoot == nil {
		cfg.IsRoot = func() bool { return os.Geteuid() == 0 }
	}
	if len(cfg.Services) > MaxServices {
		return cfg, fmt.Errorf("bastion: at most %d services", MaxServices)
	}
	sort.Slice(cfg.Services, func(i, j int) bool { return cfg.Services[i].Name < cfg.Services[j].Name })
	for i := 1; i < len(cfg.Services); i++ {
		if cfg.Services[i].Name == cfg.Services[i-1].Name {
			return cfg, fmt.Errorf("bastion: service %q named twice", cfg.Services[i].Name)
		}
	}
	if cfg.Egress == nil {
		d, err := netguard.NewDialer(netguard.Config{Local: cfg.Local, Resolver: cfg.Resolver})
		if err != nil {
			return cfg, fmt.Errorf("bastion: egress guard: %w", err)
		}
		cfg.Egress = d
	}
	return cfg, nil
}

// SlotPort is the tunnel port of the i-th service (sorted by name).
func SlotPort(i int) uint16 { return uint16(SlotFirstPort + i) }
