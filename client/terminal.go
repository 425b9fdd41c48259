package client

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"io"
	"net/url"
)

// TerminalPath and TerminalProtocol are the bastion terminal endpoint and
// its Upgrade token (api.TerminalPath, api.TerminalProtocol).
const (
	TerminalPath     = "/api/v1/bastions/terminal"
	TerminalProtocol = "bc-term-v1"
)

var sessionB32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewTerminalSession returns a fresh terminal session id: ts_ and 20
// random base32 characters (100 bits). The person's approval is bound to
// it, so a repeated request after approval carries the same one.
func NewTerminalSession() string {
	var b [13]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("client: crypto/rand failed: " + err.Error())
	}
	return "ts_" + sessionB32.EncodeToString(b[:])[:20]
}

// BastionTerminal opens a terminal on a bastion (a root one when root),
// as session. Until the person approved it on the machine the answer is
// an *Error of code APPROVAL_REQUIRED whose message names the command to
// run there; then the same call with approval set opens it. The
// connection carries the PTY's bytes as they are; Close ends it.
func (c *Client) BastionTerminal(ctx context.Context, bastionID, session string, root bool, approval string) (io.ReadWriteCloser, error) {
	q := url.Values{"bastion": {bastionID}, "session": {session}, "root": {"0"}}
	if root {
		q.Set("root", "1")
	}
	if approval != "" {
		q.Set("approval", approval)
	}
	return c.upgrade(ctx, TerminalPath, q, TerminalProtocol, nil)
}
