package netguard

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// MaxRedirects is how many redirects a client from NewHTTPClient follows
// before it gives up.
const MaxRedirects = 5

// ErrTooManyRedirects is wrapped by the error a NewHTTPClient client
// returns after MaxRedirects redirects.
var ErrTooManyRedirects = errors.New("too many redirects")

// newTransport returns an http.Transport that dials only through d, never
// through an environment proxy, with bounded header sizes and timeouts.
func newTransport(d *Dialer) *http.Transport {
	return &http.Transport{
		Proxy:                  nil, // never an environment proxy: it would dial for us
		DialContext:            d.DialContext,
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  30 * time.Second,
		ExpectContinueTimeout:  1 * time.Second,
		IdleConnTimeout:        90 * time.Second,
		MaxIdleConns:           100,
		MaxResponseHeaderBytes: 64 << 10,
	}
}

// NewHTTPClient returns an http.Client for fetching on someone else's
// behalf. Every connection is dialed through d (so every address is
// checked, and the address checked is the one dialed), and every redirect
// is checked before it is followed: its scheme must be http or https, its
// host is resolved and judged by d.Check and refused with *RefusedError
// (wrapped in *url.Error by net/http), and at most MaxRedirects are
// followed. The dial re-checks anyway, so a name that changes its answer
// between the two lookups is still caught.
func NewHTTPClient(d *Dialer) *http.Client {
	return &http.Client{
		Transport: newTransport(d),
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > MaxRedirects {
				return fmt.Errorf("netguard: stopped after %d redirects: %w", MaxRedirects, ErrTooManyRedirects)
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("netguard: redirect to scheme %q: %w", req.URL.Scheme, ErrBadTarget)
			}
			dec, err := d.Check(req.Context(), "tcp", req.URL.Hostname())
			if err != nil {
				return fmt.Errorf("netguard: redirect: %w", err)
			}
			return dec.Err()
		},
	}
}
