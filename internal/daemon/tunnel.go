package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets"
	"github.com/bettercompute/bettercompute/internal/tickets/spentfile"
)

// DefaultTunnelPorts is the tunnel allow list of a node configured with
// none: only sshd.
var DefaultTunnelPorts = []uint32{22}

// MaxSpentTickets bounds the jtis the node keeps spent at once (tickets
// live 60 s; a node opening more tunnels than this a minute refuses
// ticket-spent-store-full rather than forget one).
const MaxSpentTickets = 10000

// tunnelDialTimeout bounds the node's dial of 127.0.0.1:<port>.
const tunnelDialTimeout = 5 * time.Second

// ReasonTicketBeforeStart: the ticket was issued before this bcd process
// started, by the node's clock as it stood then. The spent store outlives
// the process (spentfile), so this is a second line: a ticket spent
// before a restart is refused as spent whatever the clock; one issued
// before it and never used is refused here (a client whose ticket raced a
// restart asks for a new one).
const ReasonTicketBeforeStart = "ticket-before-start"

// tunnels is the node's side of tunnels: its allow list and spent jtis.
type tunnels struct {
	ports   []uint32
	spent   *spentfile.Store
	started time.Time // by the node's signed-time-corrected clock
	wg      sync.WaitGroup
}

// openTunnel answers a TunnelOpen: it verifies the ticket (signed by a
// worker under the pinned command-signing roots, for this node, the
// tunnel action, fresh, issued after this process started, a port on the
// allow list, a jti never seen) and only then dials 127.0.0.1:<port> and
// opens a Tunnel stream on conn, the session's connection. A refusal is
// also a Tunnel stream, whose hello carries the reason and nothing else.
func (n *Node) openTunnel(ctx context.Context, conn *grpc.ClientConn, m *nodev1.TunnelOpen) {
	if m.GetSandboxId() != "" && m.GetPort() != 0 {
		n.openPreview(ctx, conn, m)
		return
	}
	if m.GetSandboxId() != "" {
		n.openExec(ctx, conn, m)
		return
	}
	port, reason := n.checkTicket(ctx, m.GetTicket())
	var local net.Conn
	if reason == "" {
		d := net.Dialer{Timeout: tunnelDialTimeout}
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		if err != nil {
			n.cfg.Log.Info("tunnel dial failed", "node_id", n.rec.NodeID, "port", port, "err", err)
			reason = nodev1.TunnelDialFailed
		} else {
			local = c
			defer local.Close()
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, ok := n.answerTunnel(sctx, conn, m.GetTunnelId(), reason)
	if !ok {
		return
	}
	n.cfg.Log.Info("tunnel open", "node_id", n.rec.NodeID, "tunnel_id", m.GetTunnelId(), "port", port)
	pumpTunnel(stream, local.(*net.TCPConn), cancel)
	n.cfg.Log.Info("tunnel closed", "node_id", n.rec.NodeID, "tunnel_id", m.GetTunnelId())
}

// answerTunnel opens the Tunnel stream that answers tunnelID on conn, its
// hello carrying reason when the node refuses. It returns the stream and
// true when the tunnel goes on; after a refusal it waits for the gateway
// to end the call and returns false.
func (n *Node) answerTunnel(ctx context.Context, conn *grpc.ClientConn, tunnelID, reason string) (nodev1.Gateway_TunnelClient, bool) {
	stream, err := nodev1.NewGatewayClient(conn).Tunnel(ctx)
	if err != nil {
		n.cfg.Log.Info("tunnel stream failed", "node_id", n.rec.NodeID, "err", err)
		return nil, false
	}
	err = stream.Send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Hello{Hello: &nodev1.TunnelHello{TunnelId: tunnelID, Refused: reason}}})
	if reason != "" {
		n.countRefusal("tunnel:" + reason)
		n.cfg.Log.Info("tunnel refused", "node_id", n.rec.NodeID, "tunnel_id", tunnelID, "reason", reason)
		_ = stream.CloseSend()
		_, _ = stream.Recv() // wait for the gateway to end the call
		return nil, false
	}
	return stream, err == nil
}

// checkTicket verifies a TunnelOpen's ticket and spends its jti; it
// returns the port, or why the tunnel is refused. A ticket for a port not
// on the allow list is refused tunnel-port-not-allowed.
func (n *Node) checkTicket(ctx context.Context, st *nodev1.SignedTicket) (uint32, string) {
	body, r := n.redeemTicket(ctx, st, tickets.Want{NodeID: n.rec.NodeID, Ports: n.tunnels.ports, Actions: []string{tickets.ActionNodeTunnel}})
	switch {
	case r == string(tickets.ReasonWrongPort):
		return 0, nodev1.TunnelPortNotAllowed
	case r != "":
		return 0, r
	}
	return body.Port, ""
}

// redeemTicket verifies a ticket for want (signed by a worker under the
// pinned command-signing roots, for this node, fresh, issued after this
// process started) and spends its jti; it returns the ticket's body, or
// why it is refused. Every kind of tunnel (node port, exec, preview)
// checks its ticket here.
func (n *Node) redeemTicket(ctx context.Context, st *nodev1.SignedTicket, want tickets.Want) (*nodev1.TicketBody, string) {
	now := n.now()
	v := &tickets.Verifier{Roots: n.verify.commandRoots, TrustDomain: n.verify.TrustDomain, WorkerChains: n.verify.WorkerChains}
	body, r := v.VerifySigned(st, now, want)
	switch {
	case r != "":
		return nil, string(r)
	case time.UnixMilli(body.IssuedAtMs).Before(n.tunnels.started):
		return nil, ReasonTicketBeforeStart
	}
	if _, r := v.RedeemSigned(ctx, st, now, want, n.tunnels.spent); r != "" {
		return nil, string(r)
	}
	return body, ""
}

// halfCloser is a local connection a tunnel carries: a TCP connection
// (on the node's loopback, or inside a sandbox's network namespace).
type halfCloser interface {
	io.ReadWriteCloser
	CloseWrite() error
}

// pumpTunnel copies bytes between the Tunnel stream and the local
// connection both ways, half-closing each side on the other's eof, until
// both ways ended or either failed; then it ends the stream (cancel).
func pumpTunnel(stream nodev1.Gateway_TunnelClient, local halfCloser, cancel context.CancelFunc) {
	var sendMu sync.Mutex
	send := func(f *nodev1.TunnelFrame) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(f)
	}
	done := make(chan struct{}, 2)
	// local -> gateway
	go func() {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, nodev1.MaxTunnelData)
		for {
			k, err := local.Read(buf)
			if k > 0 {
				if send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Data{Data: buf[:k]}}) != nil {
					cancel()
					return
				}
			}
			if errors.Is(err, io.EOF) {
				_ = send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Eof{Eof: true}})
				return
			}
			if err != nil {
				_ = send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Error{Error: "local-read-failed"}})
				cancel()
				return
			}
		}
	}()
	// gateway -> local
	go func() {
		defer func() { done <- struct{}{} }()
		for {
			f, err := stream.Recv()
			if err != nil {
				cancel()
				_ = local.Close()
				return
			}
			switch x := f.Frame.(type) {
			case *nodev1.TunnelFrame_Data:
				if len(x.Data) > nodev1.MaxTunnelData {
					cancel()
					_ = local.Close()
					return
				}
				if _, err := local.Write(x.Data); err != nil {
					_ = send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Error{Error: "local-write-failed"}})
					cancel()
					return
				}
			case *nodev1.TunnelFrame_Eof:
				_ = local.CloseWrite()
			default: // an error frame (the control plane closed it) or anything else
				cancel()
				_ = local.Close()
				return
			}
		}
	}()
	<-done
	<-done
}

// newTunnels is the node's tunnel state: cfg's allow list (or the
// default) and the spent store read back from the data folder; tickets
// issued before started are refused.
func newTunnels(cfg Config, spent *spentfile.Store, started time.Time) *tunnels {
	ports := cfg.TunnelPorts
	if ports == nil {
		ports = DefaultTunnelPorts
	}
	return &tunnels{ports: ports, spent: spent, started: started}
}

// ParseTunnelPorts checks a tunnel allow list given as flag (for errors):
// each port 1 to 65535, at least one, duplicates dropped.
func ParseTunnelPorts(flag string, in []uint) ([]uint32, error) {
	if len(in) == 0 {
		return nil, fmt.Errorf("%s: at least one port is required", flag)
	}
	var out []uint32
	for _, p := range in {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("%s %d: a port is 1 to 65535", flag, p)
		}
		if !slices.Contains(out, uint32(p)) {
			out = append(out, uint32(p))
		}
	}
	return out, nil
}

// openExec answers a TunnelOpen for an interactive exec: it verifies the
// ticket (as openTunnel does, for the exec action and the sandbox the
// TunnelOpen names, which the signed ticket must name too) and starts the
// ticket's own program in that sandbox on a terminal (driver.Shells);
// the stream then carries the terminal until the process exits (its
// status is the last frame) or the stream ends, which kills it.
func (n *Node) openExec(ctx context.Context, conn *grpc.ClientConn, m *nodev1.TunnelOpen) {
	argv, reason := n.checkExecTicket(ctx, m.GetTicket(), m.GetSandboxId())
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sh driver.Shell
	if reason == "" {
		shells, ok := n.cfg.Driver.(driver.Shells)
		if !ok {
			reason = nodev1.ExecUnsupported
		} else {
			var err error
			switch sh, err = shells.OpenShell(sctx, m.GetSandboxId(), argv); {
			case err == nil:
				defer sh.Close()
			case errors.Is(err, driver.ErrSandboxGone):
				reason = nodev1.ExecSandboxGone
			case errors.Is(err, driver.ErrShellUnsupported):
				reason = nodev1.ExecUnsupported
			default:
				n.cfg.Log.Info("exec failed", "node_id", n.rec.NodeID, "sandbox_id", m.GetSandboxId(), "err", err)
				reason = nodev1.ExecFailed
			}
		}
	}
	stream, ok := n.answerTunnel(sctx, conn, m.GetTunnelId(), reason)
	if !ok {
		return
	}
	n.cfg.Log.Info("exec open", "node_id", n.rec.NodeID, "tunnel_id", m.GetTunnelId(), "sandbox_id", m.GetSandboxId())
	pumpShell(stream, sh, cancel)
	n.cfg.Log.Info("exec closed", "node_id", n.rec.NodeID, "tunnel_id", m.GetTunnelId())
}

// checkExecTicket verifies an exec's ticket for sandboxID and spends its
// jti; it returns the program the ticket names, or why it is refused.
func (n *Node) checkExecTicket(ctx context.Context, st *nodev1.SignedTicket, sandboxID string) ([]string, string) {
	body, r := n.redeemTicket(ctx, st, tickets.Want{NodeID: n.rec.NodeID, SandboxID: sandboxID, Actions: []string{tickets.ActionSandboxExec}})
	if r != "" {
		return nil, r
	}
	return body.Argv, ""
}

// pumpShell carries a terminal over the Tunnel stream: what the process
// shows goes out as data, then its exit status; data in is typed, a
// resize sets the terminal's size; the stream's end or an error frame
// kills the process (the deferred Close of openExec).
func pumpShell(stream nodev1.Gateway_TunnelClient, sh driver.Shell, cancel context.CancelFunc) {
	var sendMu sync.Mutex
	send := func(f *nodev1.TunnelFrame) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(f)
	}
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		defer cancel()
		for {
			f, err := stream.Recv()
			if err != nil {
				_ = sh.Close()
				return
			}
			switch x := f.Frame.(type) {
			case *nodev1.TunnelFrame_Data:
				if len(x.Data) > nodev1.MaxTunnelData {
					_ = sh.Close()
					return
				}
				if _, err := sh.Write(x.Data); err != nil {
					return
				}
			case *nodev1.TunnelFrame_Resize:
				r := x.Resize
				if r.GetCols() > 0 && r.GetRows() > 0 && r.GetCols() <= 0xffff && r.GetRows() <= 0xffff {
					_ = sh.Resize(uint16(r.GetCols()), uint16(r.GetRows()))
				}
			case *nodev1.TunnelFrame_Eof:
				// A terminal has no half-close: input ends with the process.
			default: // an error frame (the control plane closed it) or anything else
				_ = sh.Close()
				return
			}
		}
	}()
	buf := make([]byte, nodev1.MaxTunnelData)
	for {
		k, err := sh.Read(buf)
		if k > 0 {
			if send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Data{Data: buf[:k]}}) != nil {
				_ = sh.Close()
				return
			}
		}
		if err != nil {
			break
		}
	}
	code, err := sh.Wait()
	if err != nil {
		code = -1
	}
	_ = send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_ExitCode{ExitCode: int32(code)}})
	_ = stream.CloseSend()
	<-recvDone // until the gateway ends the call
}
