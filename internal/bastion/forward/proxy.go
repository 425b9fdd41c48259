package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// upstreamDialTimeout bounds dialling one checked upstream address.
const upstreamDialTimeout = 10 * time.Second

// reasonError is a proxy failure with the reason it is refused with.
type reasonError struct {
	reason Reason
	err    error
}

func (e *reasonError) Error() string { return fmt.Sprintf("forward: %s: %v", e.reason, e.err) }
func (e *reasonError) Unwrap() error { return e.err }

// newProxy builds the reverse proxy to the checked upstream: no proxy
// from the environment, no protocol upgrade, the exact filtered path, and
// responses streamed as they come (FlushInterval -1) except model lists.
func (f *Forward) newProxy() *httputil.ReverseProxy {
	target := &url.URL{Scheme: "http", Host: f.cfg.Upstream}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         f.dialUpstream,
		DisableCompression:  true,
		MaxIdleConnsPerHost: DefaultStreams,
		IdleConnTimeout:     90 * time.Second,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path, pr.Out.URL.RawPath = pr.In.URL.Path, ""
			pr.Out.Header.Del("Upgrade")
			pr.Out.Header.Del("Connection")
			if listShapeOf(f.cfg.Kind, pr.In.URL.Path) != shapeNone {
				pr.Out.Header.Del("Accept-Encoding")
			}
		},
		Transport:      tr,
		FlushInterval:  -1,
		ModifyResponse: f.modifyResponse,
		ErrorHandler:   f.proxyError,
		ErrorLog:       slog.NewLogLogger(f.log.Handler(), slog.LevelDebug),
	}
}

// dialUpstream dials the checked addresses in order, whatever address
// the transport asks for, and only while each is still this machine.
func (f *Forward) dialUpstream(ctx context.Context, _, _ string) (net.Conn, error) {
	d := net.Dialer{Timeout: upstreamDialTimeout}
	var errs []error
	for _, ap := range f.addrs {
		if problem, err := checkLocal(ctx, ap.Addr(), f.local); problem != "" {
			errs = append(errs, fmt.Errorf("forward: %s %s: %w", ap, problem, err))
			continue
		}
		c, err := d.DialContext(ctx, "tcp", ap.String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("forward: dial upstream: %w", errors.Join(errs...))
}

// modifyResponse refuses a protocol switch and rewrites a model list to
// the models in scope.
func (f *Forward) modifyResponse(res *http.Response) error {
	if res.StatusCode == http.StatusSwitchingProtocols {
		return &reasonError{ReasonUpstreamResponseRefused, errors.New("protocol switch")}
	}
	req := res.Request
	shape := listShapeOf(f.cfg.Kind, req.URL.Path)
	if shape == shapeNone || req.Method == http.MethodHead || res.StatusCode/100 != 2 {
		return nil
	}
	if res.StatusCode != http.StatusOK {
		return &reasonError{ReasonUpstreamResponseRefused, fmt.Errorf("model list status %d", res.StatusCode)}
	}
	pol, _ := req.Context().Value(policyKey{}).(Policy)
	if pol == nil {
		return &reasonError{ReasonInferenceNotGranted, errors.New("no policy")}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, MaxListBytes+1))
	switch {
	case err != nil:
		return &reasonError{ReasonUpstreamUnreachable, err}
	case len(body) > MaxListBytes:
		return &reasonError{ReasonModelListTooLarge, fmt.Errorf("over %d bytes", MaxListBytes)}
	case encoded(res.Header):
		return &reasonError{ReasonUpstreamResponseRefused, errors.New("content-encoded model list")}
	}
	out, err := RewriteModelList(f.cfg.Kind, req.URL.Path, body, pol)
	if err != nil {
		return &reasonError{ReasonUpstreamResponseRefused, err}
	}
	res.Body = io.NopCloser(bytes.NewReader(out))
	res.ContentLength = int64(len(out))
	res.Header.Set("Content-Length", strconv.Itoa(len(out)))
	res.Header.Del("Content-Encoding")
	res.Header.Del("Etag")
	return nil
}

// proxyError answers a request the proxy could not complete: a refused
// response, or an upstream that did not answer. A client that went away
// gets nothing.
func (f *Forward) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	reason := ReasonUpstreamUnreachable
	var re *reasonError
	if errors.As(err, &re) {
		reason = re.reason
	}
	f.log.Warn("forward upstream failed", "reason", string(reason), "err", oneLine(strings.TrimSpace(err.Error())))
	f.refuse(w, r, reason, "")
}
