package forward

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// policyKey carries the policy a request was filtered under to its
// response, so the model list is rewritten under the same grant.
type policyKey struct{}

// ServeHTTP filters one request on an admitted connection and proxies it.
func (f *Forward) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pol := f.policy()
	if pol == nil || !pol.Allows(FamilyInference) {
		f.refuse(w, r, ReasonInferenceNotGranted, "")
		return
	}
	if encoded(r.Header) {
		f.refuse(w, r, ReasonMalformedBody, "content-encoded body")
		return
	}
	body, reason := readBody(w, r)
	if reason != "" {
		f.refuse(w, r, reason, "")
		return
	}
	if reason, detail := filter(f.cfg.Kind, r.Method, r.URL.Path, body, pol); reason != "" {
		f.refuse(w, r, reason, detail)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	ctx := context.WithValue(r.Context(), policyKey{}, pol)
	f.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// encoded reports a content-encoded request body, which the filter could
// not read (the upstream might decode it).
func encoded(h http.Header) bool {
	for _, v := range h.Values("Content-Encoding") {
		if !strings.EqualFold(strings.TrimSpace(v), "identity") {
			return true
		}
	}
	return false
}

// readBody reads the whole request body, at most MaxBodyBytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, Reason) {
	if r.ContentLength > MaxBodyBytes {
		return nil, ReasonBodyTooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, ReasonBodyTooLarge
	case err != nil:
		return nil, ReasonMalformedBody
	}
	return body, ""
}

// refuse audits and answers one refused request.
func (f *Forward) refuse(w http.ResponseWriter, r *http.Request, reason Reason, detail string) {
	what := r.Method + " " + clip(r.URL.Path)
	if detail != "" {
		what += ": " + detail
	}
	f.audit(EventRefuse, reason, r.RemoteAddr, what)
	f.log.Info("forward refused request", "peer", r.RemoteAddr, "reason", string(reason), "detail", what)
	body := refusalBody(reason)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(reason.status())
	_, _ = w.Write(body)
}

// refusalBody is the JSON error every refusal is answered with.
func refusalBody(reason Reason) []byte {
	type detail struct {
		Code   string `json:"code"`
		Reason string `json:"reason"`
	}
	b, _ := json.Marshal(struct {
		Error detail `json:"error"`
	}{detail{Code: "ACCESS_DENIED", Reason: string(reason)}})
	return b
}

// Bounds on answering a connection refused at accept: the request head
// read before answering, and the rest drained after, so the client reads
// the answer rather than a reset.
const (
	lingerBytes = 1 << 20
	lingerTime  = 2 * time.Second
)

// answerRefused reads one request head from a connection refused at
// accept, answers the refusal and lets the client read it before closing.
// Nothing is forwarded. A client that sends nothing is closed by the idle
// watchdog.
func (f *Forward) answerRefused(c *idleConn, reason Reason) {
	req, err := http.ReadRequest(bufio.NewReader(io.LimitReader(c, maxHeaderBytes)))
	if err != nil {
		return
	}
	_ = req
	body := refusalBody(reason)
	st := reason.status()
	head := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		st, http.StatusText(st), len(body))
	if _, err := c.Write(append([]byte(head), body...)); err != nil {
		return
	}
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	t := f.clk.NewTimer(lingerTime)
	defer t.Stop()
	go func() {
		select {
		case <-t.C():
			_ = c.Close()
		case <-c.done:
		}
	}()
	_, _ = io.Copy(io.Discard, io.LimitReader(c, lingerBytes))
}
