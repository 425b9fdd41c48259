package ops

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// TermProtocol is the Upgrade token of GET /v1/terminal.
const TermProtocol = "bc-term-v1"

// queryRoot is the terminal query's root flag.
const queryRoot = "root" // archtest:not-tenant (a query parameter)

// Handler serves POST /v1/op and GET /v1/terminal as b19-wire.md says.
// Anything else is refused NOT_FOUND no-such-endpoint.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/op" && r.Method == http.MethodPost:
			s.serveOp(w, r)
		case r.URL.Path == "/v1/terminal" && r.Method == http.MethodGet:
			s.serveTerminal(w, r)
		default:
			writeJSON(w, http.StatusNotFound, answer{Code: CodeNotFound, Reason: ReasonNoSuchEndpoint,
				Message: "POST /v1/op or GET /v1/terminal"})
		}
	})
}

// answer is the JSON body of every reply.
type answer struct {
	OK              bool   `json:"ok"`
	Kind            string `json:"kind,omitempty"`
	Result          any    `json:"result,omitempty"`
	Code            string `json:"code,omitempty"`
	Reason          string `json:"reason,omitempty"`
	Message         string `json:"message,omitempty"`
	ApprovalRequest string `json:"approval_request,omitempty"`
	ApprovalExpires string `json:"approval_expires,omitempty"`
	Summary         string `json:"summary,omitempty"`
}

// serveOp decodes, does and answers one op.
func (s *Server) serveOp(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			s.writeError(w, invalid(ReasonBodyTooLarge, "the body is over 256 KiB"))
			return
		}
		s.writeError(w, invalid(ReasonMalformed, "the body could not be read"))
		return
	}
	op, err := Decode(body)
	if err != nil {
		s.writeError(w, err)
		return
	}
	res, err := s.Do(r.Context(), op)
	if err != nil {
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, answer{OK: true, Kind: op.Kind, Result: res})
}

// writeError answers a refusal with its code's status and body, and any
// other error as INTERNAL_ERROR with the detail only in the log.
func (s *Server) writeError(w http.ResponseWriter, err error) {
	var re *RefusedError
	if !errors.As(err, &re) {
		s.log.Error("op handler failed", "err", err)
		writeJSON(w, http.StatusInternalServerError, answer{Code: CodeInternal, Reason: ReasonInternal})
		return
	}
	a := answer{Code: re.Code, Reason: re.Reason, Message: cleanClip(re.Detail, maxDetail)}
	if re.Code == CodeApprovalRequired {
		a.ApprovalRequest, a.Summary = re.ApprovalRequest, re.Summary
		a.ApprovalExpires = re.ApprovalExpires.UTC().Format(time.RFC3339)
	}
	writeJSON(w, statusOf(re.Code), a)
}

// statusOf maps a refusal code to its HTTP status.
func statusOf(code string) int {
	switch code {
	case CodeInvalidInput:
		return http.StatusBadRequest
	case CodeNotFound:
		return http.StatusNotFound
	case CodeApprovalRequired:
		return http.StatusConflict
	case CodeAccessDenied:
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}

func writeJSON(w http.ResponseWriter, status int, a answer) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(a)
}

// serveTerminal checks a terminal request, decides it like an op, then
// switches protocols and hands the connection to Terminals.Serve.
func (s *Server) serveTerminal(w http.ResponseWriter, r *http.Request) {
	op, err := terminalOp(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if _, err := s.Do(r.Context(), op); err != nil {
		s.writeError(w, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		s.writeError(w, errors.New("ops: the connection cannot be upgraded"))
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		s.log.Error("terminal hijack failed", "err", err)
		return
	}
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + TermProtocol + "\r\n\r\n")
	if err := brw.Flush(); err != nil {
		_ = conn.Close()
		return
	}
	a := op.Args.(TerminalArgs)
	if err := s.cfg.Terminals.Serve(r.Context(), upgraded{conn, brw.Reader}, a.Session, a.Root); err != nil {
		s.log.Warn("terminal ended with an error", "session", a.Session, "err", err)
	}
	_ = conn.Close()
}

// upgraded is the hijacked connection, read through the server's buffer
// (which may hold bytes the client sent after its request).
type upgraded struct {
	net.Conn
	r *bufio.Reader
}

func (u upgraded) Read(p []byte) (int, error) { return u.r.Read(p) }

// terminalOp checks a terminal request's upgrade headers and query
// (exactly session, root and an optional approval, each once) and builds
// its op. Every error is INVALID_INPUT malformed-op.
func terminalOp(r *http.Request) (Op, error) {
	if !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), TermProtocol) {
		return Op{}, invalid(ReasonMalformed, "Connection: Upgrade and Upgrade: "+TermProtocol+" are required")
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return Op{}, invalid(ReasonMalformed, "the query does not parse")
	}
	for k, v := range q {
		if (k != "session" && k != queryRoot && k != "approval") || len(v) != 1 {
			return Op{}, invalid(ReasonMalformed, "query: session, root and approval, each once")
		}
	}
	root := q.Get(queryRoot)
	if root != "0" && root != "1" {
		return Op{}, invalid(ReasonMalformed, "root: 0 or 1")
	}
	approval := q.Get("approval")
	if _, ok := q["approval"]; ok && !validID("apr_", 20, approval) {
		return Op{}, invalid(ReasonMalformed, "approval: apr_ and 20 base32 characters")
	}
	args := TerminalArgs{Session: q.Get("session"), Root: root == "1"}
	op, err := newOp(args.Session, KindTerminal, args, approval)
	if err != nil {
		return Op{}, invalid(ReasonMalformed, err.Error())
	}
	return op, nil
}

// headerHas reports token among the comma-separated values of h[name].
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
