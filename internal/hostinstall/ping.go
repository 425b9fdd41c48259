package hostinstall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// pingTimeout bounds the whole ping exchange, so doctor ends on a helper
// that accepts and never answers.
const pingTimeout = 5 * time.Second

// checkSocket checks the helper's socket, when it exists: a socket, root's,
// group bcd, 0660. A missing socket is the ping's finding.
func (d *doctor) checkSocket(path string, gid int) {
	st, err := os.Lstat(path)
	if err != nil {
		return
	}
	own := owner(st)
	if st.Mode().Type() != os.ModeSocket || own != [2]int{0, gid} || st.Mode().Perm() != 0o660 {
		d.add(FindSocketMode, path, "%s mode %04o owner %d:%d, want a socket 0660 0:%d", st.Mode().Type(), st.Mode().Perm(), own[0], own[1], gid)
	}
}

// checkPing asks the helper for its version on its socket.
func (d *doctor) checkPing(ctx context.Context, socket string) {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	p, err := Ping(ctx, socket)
	if err != nil {
		d.add(FindHelperUnreachable, socket, "%v", err)
		return
	}
	if p.Version != helperwire.Version {
		d.add(FindHelperUnreachable, socket, "helper speaks version %d, bcd speaks %d", p.Version, helperwire.Version)
	}
}

// Ping makes one ping exchange with the helper at socket, by the wire
// contract: one JSON request, the write half shut, one JSON response.
// (helperwire has no client yet; when it has, this should call it.)
func Ping(ctx context.Context, socket string) (helperwire.Ping, error) {
	var p helperwire.Ping
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", socket)
	if err != nil {
		return p, fmt.Errorf("ping: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	req, err := json.Marshal(helperwire.Request{Version: helperwire.Version, Op: helperwire.OpPing})
	if err != nil {
		return p, fmt.Errorf("ping: %w", err)
	}
	if _, err := c.Write(req); err != nil {
		return p, fmt.Errorf("ping: %w", err)
	}
	if uc, ok := c.(*net.UnixConn); ok {
		if err := uc.CloseWrite(); err != nil {
			return p, fmt.Errorf("ping: %w", err)
		}
	}
	b, err := io.ReadAll(io.LimitReader(c, helperwire.MaxResponse+1))
	if err != nil {
		return p, fmt.Errorf("ping: %w", err)
	}
	if len(b) > helperwire.MaxResponse {
		return p, errors.New("ping: response over the size bound")
	}
	var resp helperwire.Response
	if err := json.Unmarshal(b, &resp); err != nil {
		return p, fmt.Errorf("ping: response: %w", err)
	}
	if resp.Code != "" {
		return p, &helperwire.Refusal{Code: resp.Code, Reason: resp.Reason}
	}
	if err := json.Unmarshal(resp.Result, &p); err != nil {
		return p, fmt.Errorf("ping: result: %w", err)
	}
	return p, nil
}
