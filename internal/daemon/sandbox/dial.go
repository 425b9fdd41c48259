package sandbox

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// previewDialTimeout bounds a preview's connect inside a sandbox.
const previewDialTimeout = 5 * time.Second

// Dialer is a runtime that connects to a port on a sandbox's own
// loopback, from inside the sandbox's network namespace.
type Dialer interface {
	// Dial connects to 127.0.0.1:port inside sandbox id.
	Dial(ctx context.Context, id string, port uint16) (net.Conn, error)
}

// DialSandbox connects to 127.0.0.1:port inside sandboxID for a preview
// tunnel the node verified: the sandbox must be running here and not past
// its deadline (driver.ErrPreviewSandboxGone), and its runtime must be
// reachable from the host (driver.ErrPreviewUnsupported: runsc, whose
// network is gVisor's netstack inside the sandbox process, and the sim
// runtime are not).
func (h *Host) DialSandbox(ctx context.Context, sandboxID string, port uint16) (net.Conn, error) {
	p, err := h.programFor(sandboxID)
	if err != nil {
		return nil, driver.ErrPreviewSandboxGone
	}
	d, ok := p.rt.(Dialer)
	if !ok {
		return nil, driver.ErrPreviewUnsupported
	}
	return d.Dial(ctx, sandboxID, port)
}

// DialSandbox connects to a port inside a sandbox on this host (see
// Host.DialSandbox).
func (d *Driver) DialSandbox(ctx context.Context, sandboxID string, port uint16) (net.Conn, error) {
	return d.Host.DialSandbox(ctx, sandboxID, port)
}

// Dial connects to 127.0.0.1:port inside runc sandbox id: it opens the
// network namespace of the sandbox's init (checked to be the sandbox's:
// alive and in the sandbox's own cgroup, before and after the open, so a
// reused pid never names another namespace) and dials from a thread
// moved into it. The socket belongs to the sandbox's namespace for its
// whole life. runsc is refused (driver.ErrPreviewUnsupported): its
// sandbox's loopback is gVisor's netstack, which no host namespace holds.
func (o *OCI) Dial(ctx context.Context, id string, port uint16) (net.Conn, error) {
	if o.name != spec.RuntimeRunc {
		return nil, driver.ErrPreviewUnsupported
	}
	if spec.ValidSandboxID(id) != nil || port == 0 {
		return nil, driver.ErrPreviewSandboxGone
	}
	pid, ok := o.initPID(id)
	if !ok {
		return nil, driver.ErrPreviewSandboxGone
	}
	ns, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "ns", "net"))
	if err != nil {
		return nil, driver.ErrPreviewSandboxGone
	}
	defer ns.Close()
	if again, ok := o.initPID(id); !ok || again != pid {
		return nil, driver.ErrPreviewSandboxGone
	}
	return dialInNetNS(ctx, ns, port)
}

// dialInNetNS dials 127.0.0.1:port from a goroutine locked to its own OS
// thread and moved into the network namespace ns. The thread is never
// unlocked, so the runtime ends it with the goroutine instead of running
// anything else in the sandbox's namespace.
func dialInNetNS(ctx context.Context, ns *os.File, port uint16) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("sandbox: enter network namespace: %w", err)}
			return
		}
		d := net.Dialer{Timeout: previewDialTimeout}
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		ch <- result{c: c, err: err}
	}()
	r := <-ch
	return r.c, r.err
}
