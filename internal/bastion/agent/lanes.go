package agent

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"github.com/bettercompute/bettercompute/internal/bastion/egresslane"
	"github.com/bettercompute/bettercompute/internal/bastion/forward"
	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
)

// Refusal reasons of the lanes themselves (the forwards and the egress
// lane have their own).
const (
	ReasonForeignSource  = "tunnel-foreign-source" // a connection from an address other than the host's
	ReasonServicesDenied = "services-not-granted"  // no `services` family
	ReasonReachDenied    = "reach-not-granted"     // no reach grant naming the server
	ReasonBusy           = "busy"                  // the pairing's streams are all in use
	ReasonServiceDown    = "service-unreachable"   // the server's socket does not answer
)

// forwardPorts are the inference forwards' tunnel ports.
var forwardPorts = map[forward.Kind]uint16{forward.KindOllama: PortOllama, forward.KindLLM: PortLLM, forward.KindPII: PortPII}

// upTunnel brings the tunnel up with plan and starts every gated lane in
// it. On any failure nothing stays up.
func (a *Agent) upTunnel(ctx context.Context, plan tunnelPlan, fp string) error {
	tun, err := wgtun.Up(wgtun.Config{PrivateKey: a.wgKey, Address: plan.self, Peers: []wgtun.Peer{plan.host}, Log: a.cfg.Log})
	if err != nil {
		a.record("refuse", "tunnel", "tunnel-up-failed", "", "")
		return err
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	stop := func() {
		cancel()
		tun.Close()
		wg.Wait()
	}
	host := plan.host.AllowedIP.Addr()
	if err := a.startForwards(lctx, tun, host, &wg); err != nil {
		stop()
		return err
	}
	if err := a.startSlots(lctx, tun, host, &wg); err != nil {
		stop()
		return err
	}
	if err := a.startOps(lctx, tun, host, &wg); err != nil {
		stop()
		return err
	}
	a.startEgress(lctx, tun, netip.AddrPortFrom(host, plan.egress), &wg)
	a.mu.Lock()
	a.tun, a.tunCfg, a.stopTun = tun, fp, stop
	a.mu.Unlock()
	a.record("tunnel", "", "", "", "up on udp port "+strconv.Itoa(int(tun.Port())))
	return nil
}

// downTunnel takes the tunnel and its lanes down, if up.
func (a *Agent) downTunnel() {
	a.mu.Lock()
	stop := a.stopTun
	a.tun, a.tunCfg, a.stopTun = nil, "", nil
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// startForwards serves each configured inference forward on its port.
func (a *Agent) startForwards(ctx context.Context, tun *wgtun.Tunnel, host netip.Addr, wg *sync.WaitGroup) error {
	for k, addr := range a.cfg.Forwards {
		f, err := forward.New(ctx, forward.Config{Kind: k, Upstream: addr, Policy: func() forward.Policy { return a.Policy() },
			Streams: a.streams, Clock: a.cfg.Clock, Audit: a.auditForward, Local: a.cfg.Local, Resolver: a.cfg.Resolver, Log: a.cfg.Log})
		if err != nil {
			return err
		}
		ln, err := tun.ListenTCP(forwardPorts[k])
		if err != nil {
			return err
		}
		gl := &gatedListener{Listener: ln, host: host, lane: k.Lane(), a: a}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = f.Serve(ctx, gl)
		}()
	}
	return nil
}

func (a *Agent) auditForward(e forward.Event) { a.record(e.Kind, e.Lane, e.Reason, e.Peer, e.Detail) }

// startSlots serves each service slot on its port.
func (a *Agent) startSlots(ctx context.Context, tun *wgtun.Tunnel, host netip.Addr, wg *sync.WaitGroup) error {
	for i, s := range a.cfg.Services {
		ln, err := tun.ListenTCP(SlotPort(i))
		if err != nil {
			return err
		}
		gl := &gatedListener{Listener: ln, host: host, lane: "service/" + s.Name, a: a}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.serveSlot(ctx, gl, s)
		}()
	}
	return nil
}

// serveSlot accepts on one service slot until the listener closes.
func (a *Agent) serveSlot(ctx context.Context, ln net.Listener, s Service) {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go a.slotConn(ctx, c, s)
	}
}

// slotConn checks one connection to a service slot at accept (the
// `services` family, a reach grant naming the server, a free stream) and
// joins it to the server's socket.
func (a *Agent) slotConn(ctx context.Context, c net.Conn, s Service) {
	defer c.Close()
	lane, peer := "service/"+s.Name, c.RemoteAddr().String()
	pol := a.Policy()
	switch {
	case !pol.Allows(grant.FamilyServices):
		a.record("refuse", lane, ReasonServicesDenied, peer, "")
		return
	case !pol.Reaches(s.Name):
		a.record("refuse", lane, ReasonReachDenied, peer, "")
		return
	}
	release, ok := a.streams.Acquire()
	if !ok {
		a.record("refuse", lane, ReasonBusy, peer, "")
		return
	}
	defer release()
	var d net.Dialer
	up, err := d.DialContext(ctx, "unix", s.Path)
	if err != nil {
		a.record("refuse", lane, ReasonServiceDown, peer, "")
		return
	}
	defer up.Close()
	a.record("accept", lane, "", peer, "")
	splice(c, up)
}

// splice copies both ways until either side ends.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

// startEgress parks the egress lane's workers on the host's egress port.
func (a *Agent) startEgress(ctx context.Context, tun *wgtun.Tunnel, at netip.AddrPort, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = egresslane.RunWorkers(ctx, egresslane.WorkerConfig{
			Dial:    func(ctx context.Context) (net.Conn, error) { return tun.DialContext(ctx, "tcp", at.String()) },
			Guard:   a.cfg.Egress,
			Enabled: a.cfg.EgressEnabled,
			Allowed: func() bool { return a.Policy().Allows(grant.FamilyEgress) },
			Clock:   a.cfg.Clock,
			Audit:   func(e egresslane.Event) { a.record(e.Kind, e.Lane, e.Reason, e.Peer, e.Detail) },
			Log:     a.cfg.Log,
		})
	}()
}

// gatedListener accepts only connections from the host's single tunnel
// address; anything else is audited and closed before any lane sees it.
type gatedListener struct {
	net.Listener
	host netip.Addr
	lane string
	a    *Agent
}

// Accept returns the next connection from the host.
func (g *gatedListener) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if fromHost(c.RemoteAddr(), g.host) {
			return c, nil
		}
		g.a.record("refuse", g.lane, ReasonForeignSource, c.RemoteAddr().String(), "")
		c.Close()
	}
}

// fromHost reports whether addr is the host's tunnel address.
func fromHost(addr net.Addr, host netip.Addr) bool {
	ap, err := netip.ParseAddrPort(addr.String())
	return err == nil && ap.Addr().Unmap() == host.Unmap()
}
