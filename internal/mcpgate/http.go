package mcpgate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// Path is where the api role serves the gate over streamable HTTP.
const Path = "/mcp"

// Route sends requests of exactly Path to gate and every other to next.
func Route(next, gate http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == Path {
			gate.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// maxRequestBytes bounds one MCP request's body: a tool's input is at
// most an API body (64 KiB) with the JSON-RPC framing around it.
const maxRequestBytes = 256 << 10

// inProcessBase is the base URL of the in-process API client; the host is
// never dialled.
const inProcessBase = "http://api.in-process"

// HTTP returns the gate over streamable HTTP, each request made as the
// caller whose API key it carries (Authorization: Bearer KEY). Each tool
// call becomes requests to the API envelope apiHandler, in process but
// exactly as a client sends them (POST /api/v1/<method>, the JSON content
// type, X-Better-Compute: 1 and the caller's own Authorization header,
// from the caller's address), so they are authenticated, limited, decided
// and audited as any API call; nothing else of the MCP request (no
// cookie) reaches the envelope. A request without a bearer key, or whose
// key the envelope does not authenticate, is refused 401 UNAUTHENTICATED
// before the MCP server sees it. Sessions are stateless: no MCP session
// carries authority from one request to the next.
func (g *Gate) HTTP(apiHandler http.Handler) http.Handler {
	cache := mcp.NewSchemaCache()
	sdk := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		rc, ok := r.Context().Value(requestCallerKey{}).(*requestCaller)
		if !ok {
			return nil
		}
		rc.once.Do(func() {
			who := rc.who
			rc.srv = g.serverWith(cache, func(context.Context, *mcp.CallToolRequest) (Caller, error) { return who, nil })
		})
		return rc.srv
	}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, MaxRequestBodyBytes: maxRequestBytes,
		// The SDK's DNS-rebinding guard refuses a loopback listener's
		// request for another host name, which is every request through a
		// TLS proxy on the same machine. Rebinding gains a page nothing
		// here: every request needs the bearer key, which a browser never
		// adds by itself (no cookie is read).
		DisableLocalhostProtection: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		key, ok := bearer(r)
		if !ok {
			refuse(w, http.StatusUnauthorized, string(errs.Unauthenticated), "the MCP gate needs an API key: Authorization: Bearer KEY")
			return
		}
		api := inProcessClient(apiHandler, key, r)
		id, err := callerID(r.Context(), api, key)
		if err != nil {
			var e *client.Error
			if errors.As(err, &e) {
				refuse(w, e.Status, e.Code, e.Message)
				return
			}
			refuse(w, http.StatusInternalServerError, string(errs.Internal), "the API could not be asked who the caller is")
			return
		}
		rc := &requestCaller{who: Caller{API: api, ID: id}}
		sdk.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestCallerKey{}, rc)))
	})
}

// requestCaller is the caller of one HTTP request and the server made for
// it (the SDK asks for the server more than once per request).
type requestCaller struct {
	who  Caller
	once sync.Once
	srv  *mcp.Server
}

type requestCallerKey struct{}

// serverWith is server with a shared schema cache.
func (g *Gate) serverWith(cache *mcp.SchemaCache, resolve resolver) *mcp.Server {
	s := mcp.NewServer(implementation(), &mcp.ServerOptions{Instructions: instructions, SchemaCache: cache})
	checks := argsChecks{}
	g.addTools(s, checks, resolve)
	s.AddReceivingMiddleware(strictArguments(checks))
	return s
}

// bearer returns the API key of an Authorization: Bearer header.
func bearer(r *http.Request) (string, bool) {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	key = strings.TrimSpace(key)
	return key, ok && key != ""
}

// callerID asks the envelope who key speaks for (identities.whoami): the
// in-flight limit counts per identity. A key the envelope authenticates
// but whose roles do not allow whoami counts under its own digest.
func callerID(ctx context.Context, api *client.Client, key string) (string, error) {
	me, err := api.Whoami(ctx)
	switch {
	case err == nil:
		return "identity/" + me.IdentityID, nil
	case client.CodeOf(err) == string(errs.AccessDenied):
		sum := sha256.Sum256([]byte(key))
		return "key/" + hex.EncodeToString(sum[:16]), nil
	}
	return "", err
}

// securityHeaders are the headers every API answer carries (as
// api.SecurityHeaders sets them).
func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}

// refuse answers in the API's JSON error shape.
func refuse(w http.ResponseWriter, status int, code, msg string) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="better-compute"`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Code, body.Error.Message = code, msg
	_ = json.NewEncoder(w).Encode(body)
}

// inProcessClient is an API client for key whose requests are served by
// the envelope h in this process, from the address of the MCP request r
// (its socket peer and X-Forwarded-For, which the envelope reads only
// from a trusted proxy).
func inProcessClient(h http.Handler, key string, r *http.Request) *client.Client {
	c := client.New(inProcessBase, key)
	c.HTTP = &http.Client{Transport: &inProcess{h: h, remote: r.RemoteAddr, forwarded: r.Header.Values("X-Forwarded-For")},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c
}

// inProcess is an http.RoundTripper that serves a request with a handler.
type inProcess struct {
	h         http.Handler
	remote    string
	forwarded []string
}

// RoundTrip serves req with the envelope and answers what it wrote.
func (t *inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	in.RemoteAddr = t.remote
	in.RequestURI = req.URL.RequestURI()
	in.Host = ""
	in.Header.Del("X-Forwarded-For")
	for _, v := range t.forwarded {
		in.Header.Add("X-Forwarded-For", v)
	}
	if in.Body == nil {
		in.Body = http.NoBody
	}
	rec := &recorder{header: http.Header{}}
	t.h.ServeHTTP(rec, in)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return &http.Response{Status: http.StatusText(rec.status), StatusCode: rec.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rec.header, Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()), Request: req}, nil
}

// recorder is the http.ResponseWriter of one in-process request.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}

// Flush is a no-op: the answer is read once the handler returns.
func (r *recorder) Flush() {}
