package server

import (
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
)

// previewBase returns the public base URL of preview URLs: o.PreviewURL,
// else the preview role's own address in this process ("" when there is
// none: sandboxes.preview then answers UNAVAILABLE).
func (cp *ControlPlane) previewBase(o Options) func() string {
	return func() string {
		if o.PreviewURL != "" {
			return o.PreviewURL
		}
		if cp.PreviewAddr == "" {
			return ""
		}
		if o.APIPlainHTTP {
			return "http://" + cp.PreviewAddr
		}
		return "https://" + cp.PreviewAddr
	}
}

// startPreview starts the preview role: the proxy of preview URLs on its
// own listener, with TLS under the API's certificate (plain HTTP only
// when the API is), opening each request's stream through this process's
// gateway with a ticket from the api's ticket signer.
func (cp *ControlPlane) startPreview(o Options, k keys, now time.Time) error {
	if cp.Previews == nil || cp.Gateway == nil || cp.intentSigner == nil {
		return errs.New(errs.InvalidConfig, "the preview role needs the api and gateway roles and the sandboxes module")
	}
	proxy := previews.NewProxy(previews.ProxyDeps{Keys: cp.Previews.Keys(), Sandboxes: cp.Sandboxes, Signer: cp.intentSigner,
		Opener: tunnelOpener{cp.Gateway}, Clock: o.Clock, Log: o.Log})
	lis, err := net.Listen("tcp", orDefault(o.PreviewListen, "127.0.0.1:0"))
	if err != nil {
		return errs.Wrap(errs.InvalidConfig, "the preview role cannot listen on its address", err)
	}
	cp.PreviewAddr = lis.Addr().String()
	if !o.APIPlainHTTP {
		getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return o.APICert, nil }
		if o.APICert == nil {
			src, err := newCertSource("preview", o.Clock, o.Log, now, apiCert(o, k))
			if err != nil {
				lis.Close()
				return err
			}
			getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return src.get() }
		}
		lis = tls.NewListener(lis, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert, NextProtos: []string{"http/1.1"}})
	}
	cp.serveHTTP("preview", &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		DisableGeneralOptionsHandler: true}, lis)
	return nil
}
