package api

import (
	"context"
	"net"
	"net/http"
	"net/url"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// TerminalPath is the bastion terminal endpoint: GET with Upgrade:
// bc-term-v1, Connection: Upgrade, X-Better-Compute: 1, the query
// bastion=<id>&session=ts_<20 base32>&root=0|1[&approval=apr_<20 base32>]
// and the caller's credential as for every call. It passes the same
// stages as the lane endpoint, deciding compute:bastions:terminal on the
// bastion; then the bastion's ops server is asked for the terminal
// through its tunnel. The bastion's person approves it on the machine:
// until then the answer is APPROVAL_REQUIRED (409) naming the command to
// run there. On success it answers 101 Switching Protocols and the
// connection carries the PTY's bytes as they are.
const TerminalPath = "/api/v1/bastions/terminal"

// TerminalProtocol is the Upgrade token of the terminal endpoint (and of
// the bastion's own).
const TerminalProtocol = bastions.TerminalProtocol

// TerminalOpener opens a terminal on a bastion the scope sees and records
// the request and its answer in the audit log (the bastions module, with
// the lanes role's DialOps).
type TerminalOpener interface {
	OpenTerminal(ctx context.Context, actor audit.Entry, scope iam.Scope, bastionID string, req bastions.TerminalRequest) (net.Conn, error)
}

// ServeBastionTerminals enables the terminal endpoint with o behind it.
func (s *Server) ServeBastionTerminals(o TerminalOpener) { s.terminals = o }

// terminalUpgrade is the terminal endpoint.
func (s *Server) terminalUpgrade() bastionUpgrade {
	var req bastions.TerminalRequest
	return bastionUpgrade{method: "bastions.terminal", action: ActionBastionsTerminal, protocol: TerminalProtocol,
		query: func(qv url.Values) (string, error) {
			id, root := qv.Get("bastion"), qv.Get("root") // archtest:not-tenant (the query's root flag)
			req = bastions.TerminalRequest{Session: qv.Get("session"), Root: root == "1", Approval: qv.Get("approval")}
			if id == "" || len(id) > 64 || root != "0" && root != "1" || bastions.CheckTerminal(req) != nil {
				return "", errs.New(errs.InvalidInput, "bastion=ID, session=ts_<20 base32>, root=0|1 and optionally approval=apr_<20 base32> are required")
			}
			return id, nil
		},
		open: func(q *call, id string) (net.Conn, error) {
			return s.terminals.OpenTerminal(q.ctx, q.c.Actor(), q.c.Scope(), id, req)
		},
	}
}

// serveTerminalHTTP answers a request to the terminal endpoint.
func (s *Server) serveTerminalHTTP(w http.ResponseWriter, r *http.Request) {
	s.serveBastionUpgrade(w, r, s.terminalUpgrade())
}
