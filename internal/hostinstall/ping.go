package hostinstall

import (
	"context"
	"encoding/json"
	"fmt"
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

// Ping makes one ping exchange with the helper at socket
// (helperwire.Client: one strict request, one strict response).
func Ping(ctx context.Context, socket string) (helperwire.Ping, error) {
	var p helperwire.Ping
	res, err := (&helperwire.Client{Socket: socket}).Call(ctx, &helperwire.Request{Op: helperwire.OpPing})
	if err != nil {
		return p, fmt.Errorf("ping: %w", err)
	}
	if err := json.Unmarshal(res, &p); err != nil {
		return p, fmt.Errorf("ping: result: %w", err)
	}
	return p, nil
}
