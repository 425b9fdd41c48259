package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// credential is what one API call presents: a bearer API key (sign-in
// only) or the session cookie's value.
type credential struct {
	bearer  string
	session string
}

// apiError is a refusal of the API (or of the console, in the same
// shape): its code and message.
type apiError struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	RequestID string `json:"request_id"`
}

// status is the HTTP status of the error's code.
func (e *apiError) status() int { return errs.HTTPStatus(errs.Code(e.Code)) }

// clientAddrHeaders are the headers the envelope reads the caller's
// address from behind a trusted proxy; they are passed on as received, so
// the envelope sees the address it would see for a direct call (and
// ignores them unless the peer is a trusted proxy).
var clientAddrHeaders = []string{"X-Forwarded-For", "Forwarded", "X-Real-Ip"}

// call invokes method through the API's envelope in process: a POST
// /api/v1/<method> with the JSON body in, the credential, the
// deployment's Origin, X-Better-Compute: 1 and the caller's address, the
// same request the API's own clients send. The answer decodes into out
// (nil: ignored); a refusal is returned as the API's code and message.
func (c *Console) call(r *http.Request, cred credential, method string, in, out any) *apiError {
	body, err := json.Marshal(in)
	if err != nil {
		return &apiError{Code: "INTERNAL_ERROR", Message: "internal error"}
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "/api/v1/"+method, bytes.NewReader(body))
	if err != nil {
		return &apiError{Code: "INTERNAL_ERROR", Message: "internal error"}
	}
	req.RemoteAddr, req.TLS, req.Host = r.RemoteAddr, r.TLS, r.Host
	for _, h := range clientAddrHeaders {
		if v, ok := r.Header[h]; ok {
			req.Header[h] = v
		}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Better-Compute", "1")
	if id := r.Header.Get("X-Request-Id"); id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	switch {
	case cred.bearer != "":
		req.Header.Set("Authorization", "Bearer "+cred.bearer)
	default:
		req.Header.Set("Origin", c.origin)
		req.AddCookie(&http.Cookie{Name: SessionCookie, Value: cred.session})
	}
	rec := &recorder{header: http.Header{}, status: http.StatusOK}
	c.api.ServeHTTP(rec, req)
	if rec.status != http.StatusOK {
		var eb struct {
			Error apiError `json:"error"`
		}
		if json.Unmarshal(rec.body.Bytes(), &eb) != nil || eb.Error.Code == "" {
			return &apiError{Code: "INTERNAL_ERROR", Message: fmt.Sprintf("the API answered %d", rec.status)}
		}
		return &eb.Error
	}
	if out != nil {
		if err := json.Unmarshal(rec.body.Bytes(), out); err != nil {
			c.log.Warn("console: decode API answer", "method", method, "err", err)
			return &apiError{Code: "INTERNAL_ERROR", Message: "internal error"}
		}
	}
	return nil
}

// recorder is the http.ResponseWriter an in-process API call answers
// into.
type recorder struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

// Header returns the answer's headers.
func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the status (the first one only).
func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
}

// Write appends to the body.
func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}
