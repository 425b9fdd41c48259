package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/tunnelwire"
)

// Tunnel is an open tunnel to a port on a node's loopback: Read returns
// what the node's port sends (io.EOF once it sent no more), Write sends to
// it, CloseWrite tells it the client sends no more, Wait reports how the
// tunnel ended (nil when in order, else an *Error with the code the
// control plane closed it with, such as ACCESS_DENIED for revoked access
// or UNAVAILABLE when the node disconnected).
type Tunnel struct {
	rwc io.ReadWriteCloser
	rd  *tunnelwire.Reader

	rmu     sync.Mutex
	pending []byte
	readEOF bool
	end     error // set once the stream ended: nil in order, else why
	exit    *int  // an exec's exit status, once read

	wmu  sync.Mutex
	wbuf []byte
}

// OpenTunnel asks tunnels.open for a ticket to port on nodeID and
// presents it once to the tunnel endpoint. A refusal comes back as an
// *Error with the server's code (the node's own reason in its message,
// such as a port not on its allow list).
func (c *Client) OpenTunnel(ctx context.Context, nodeID string, port int) (*Tunnel, error) {
	var tk apitypes.TunnelTicket
	if err := c.Call(ctx, "tunnels.open", apitypes.TunnelOpenIn{NodeID: nodeID, Port: int64(port)}, &tk); err != nil {
		return nil, err
	}
	return c.connect(ctx, tk, url.Values{"node": {nodeID}, "port": {strconv.Itoa(port)}})
}

// OpenShell asks sandboxes.execTicket for a ticket to run argv (no shell
// added) in sandboxID on a terminal, and presents it once to the tunnel
// endpoint. The Tunnel's reads are what the terminal shows, its writes
// what is typed; Resize sets the terminal's size, and once Read returns
// io.EOF, ExitCode gives the program's status.
func (c *Client) OpenShell(ctx context.Context, sandboxID string, argv []string) (*Tunnel, error) {
	var tk apitypes.TunnelTicket
	if err := c.Call(ctx, "sandboxes.execTicket", apitypes.ExecTicketIn{ID: sandboxID, Argv: argv}, &tk); err != nil {
		return nil, err
	}
	return c.connect(ctx, tk, url.Values{"sandbox": {sandboxID}})
}

// connect presents ticket tk to the tunnel endpoint with query q.
func (c *Client) connect(ctx context.Context, tk apitypes.TunnelTicket, q url.Values) (*Tunnel, error) {
	rwc, err := c.upgrade(ctx, tk.ConnectPath, q, tunnelwire.Protocol, http.Header{"Bc-Ticket": {tk.Ticket}})
	if err != nil {
		return nil, err
	}
	return &Tunnel{rwc: rwc, rd: tunnelwire.NewReader(rwc)}, nil
}

// upgrade asks path?q to switch to protocol (with the caller's credential
// and extra headers) and returns the connection once it answered 101, or
// the API's error in the usual shape.
func (c *Client) upgrade(ctx context.Context, path string, q url.Values, protocol string, extra http.Header) (io.ReadWriteCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, fmt.Errorf("client: %s request: %w", protocol, err)
	}
	for k, v := range extra {
		req.Header[k] = v
	}
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", protocol)
	hc := *c.HTTP
	hc.Timeout = 0 // the connection lasts as long as it is used
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: %s: %w", protocol, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var eb apitypes.ErrorBody
		if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
			return nil, &Error{Status: resp.StatusCode, Code: "INTERNAL_ERROR", Message: "unexpected answer " + resp.Status}
		}
		return nil, &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, RequestID: eb.Error.RequestID}
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, errors.New("client: the upgraded connection is not writable")
	}
	return rwc, nil
}

// errEndedUnexpectedly: the connection ended without an orderly end or a
// reason (the control plane went away).
var errEndedUnexpectedly = &Error{Code: "UNAVAILABLE", Message: "the tunnel's connection ended unexpectedly"}

// Read reads bytes the node's port sent.
func (t *Tunnel) Read(p []byte) (int, error) {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	for len(t.pending) == 0 {
		if t.readEOF {
			return 0, io.EOF
		}
		if err := t.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

// next reads one frame (rmu held).
func (t *Tunnel) next() error {
	f, err := t.rd.Next()
	if err != nil {
		if errors.Is(err, io.EOF) && t.readEOF {
			return io.EOF
		}
		t.end = errEndedUnexpectedly
		t.readEOF = true
		return t.end
	}
	switch f.Type {
	case tunnelwire.Data:
		t.pending = append(t.pending[:0], f.Payload...)
	case tunnelwire.EOF:
		t.readEOF = true
	case tunnelwire.Exit:
		code := int(tunnelwire.DecodeExit(f.Payload))
		t.exit, t.readEOF = &code, true
	case tunnelwire.Error:
		ref, _ := tunnelwire.DecodeRefusal(f.Payload)
		t.end = &Error{Code: ref.Code, Message: ref.Message}
		t.readEOF = true
		return t.end
	}
	return nil
}

// Write sends p to the node's port.
func (t *Tunnel) Write(p []byte) (int, error) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.wbuf = tunnelwire.Append(t.wbuf[:0], tunnelwire.Data, p)
	if _, err := t.rwc.Write(t.wbuf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseWrite tells the node's port the client sends no more.
func (t *Tunnel) CloseWrite() error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	_, err := t.rwc.Write(tunnelwire.Append(nil, tunnelwire.EOF, nil))
	return err
}

// Wait reads what is left of the stream after the node's io.EOF, until
// the control plane ends the connection, and returns why the tunnel
// ended: nil in order, else the *Error it was closed with. Call it after
// Read returned io.EOF (or an error) and CloseWrite.
func (t *Tunnel) Wait() error {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	if t.end != nil {
		return t.end
	}
	for {
		f, err := t.rd.Next()
		if err != nil {
			return nil // the connection ended after the node's eof: in order
		}
		if f.Type == tunnelwire.Error {
			ref, _ := tunnelwire.DecodeRefusal(f.Payload)
			t.end = &Error{Code: ref.Code, Message: ref.Message}
			return t.end
		}
	}
}

// Resize tells an exec's terminal its new size.
func (t *Tunnel) Resize(cols, rows uint16) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	_, err := t.rwc.Write(tunnelwire.ResizeFrame(cols, rows))
	return err
}

// ExitCode returns an exec's exit status once Read has returned io.EOF
// after it; ok is false before, and for a tunnel to a port.
func (t *Tunnel) ExitCode() (code int, ok bool) {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	if t.exit == nil {
		return 0, false
	}
	return *t.exit, true
}

// Close ends the tunnel at once.
func (t *Tunnel) Close() error { return t.rwc.Close() }
