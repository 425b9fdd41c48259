package ops

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// Observe limits.
const (
	// MaxProcs bounds the processes observe:procs lists.
	MaxProcs = 500
	// ProbeTimeout bounds one observe:net probe.
	ProbeTimeout = 5 * time.Second
)

// procRoot is where observe:procs reads processes.
const procRoot = "/proc"

// Filesystem is one observe:disk entry.
type Filesystem struct {
	Path       string `json:"path"`
	TotalBytes uint64 `json:"total_bytes"`
	FreeBytes  uint64 `json:"free_bytes"`
}

// observeDisk reports "/" and every shared folder's filesystem. A share
// that cannot be read is left out (and logged).
func (s *Server) observeDisk() (any, error) {
	root, err := statDisk("/")
	if err != nil {
		return nil, fmt.Errorf("ops: statfs /: %w", err)
	}
	out := []Filesystem{root}
	for _, p := range s.cfg.Shares() {
		fs, err := statDisk(p)
		if err != nil {
			s.log.Warn("observe disk skipped a share", "err", err)
			continue
		}
		out = append(out, fs)
	}
	return map[string]any{"filesystems": out}, nil
}

// Process is one observe:procs entry.
type Process struct {
	PID  int    `json:"pid"`
	Name string `json:"name"`
}

// observeProcs reads every process's name (root/<pid>/comm), at most
// MaxProcs of them by pid, and counts them all. A process that ends while
// it is read is left out.
func observeProcs(root string) (any, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("ops: read %s: %w", root, err)
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 && e.IsDir() {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	procs := []Process{}
	for _, pid := range pids {
		if len(procs) == MaxProcs {
			break
		}
		b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "comm"))
		if err != nil {
			continue
		}
		procs = append(procs, Process{PID: pid, Name: cleanClip(strings.TrimSuffix(string(b), "\n"), 64)})
	}
	return map[string]any{"count": len(pids), "processes": procs}, nil
}

// probeResult is observe:net's answer.
type probeResult struct {
	Reachable bool   `json:"reachable"`
	Address   string `json:"address"`
	Millis    int64  `json:"millis"`
}

// observeNet opens one TCP connection to the host through the egress
// guard and closes it. A guard refusal is ACCESS_DENIED with netguard's
// reason; a target that does not answer is reachable false.
func (s *Server) observeNet(ctx context.Context, a ObserveNetArgs) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	start := s.cfg.Clock.Now()
	conn, err := s.cfg.Dialer.DialContext(ctx, "tcp", net.JoinHostPort(a.Host, strconv.Itoa(a.Port)))
	res := probeResult{Millis: s.cfg.Clock.Now().Sub(start).Milliseconds()}
	var gr *netguard.RefusedError
	switch {
	case errors.As(err, &gr):
		return nil, denied(string(gr.Reason), "the egress guard refused the host")
	case errors.Is(err, netguard.ErrBadTarget):
		return nil, invalid(ReasonBadArgs, "host: not a name or address")
	case err != nil:
		s.log.Info("observe net probe failed", "err", err)
		return res, nil
	}
	defer func() { _ = conn.Close() }()
	res.Reachable, res.Address = true, conn.RemoteAddr().String()
	return res, nil
}
