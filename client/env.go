package client

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"net/url"
	"strings"
)

// CheckBaseURL refuses an API address the client cannot use, saying how to
// write it: it needs the http:// or https:// scheme and a host.
func CheckBaseURL(addr string) error {
	u, err := url.Parse(addr)
	if err != nil || u.Scheme == "" || u.Opaque != "" || u.Host == "" {
		if !strings.Contains(addr, "://") {
			return fmt.Errorf("BC_ADDR %q has no scheme: write it as https://%s (or http://%s for a plain-HTTP loopback API)", addr, addr, addr)
		}
		return fmt.Errorf("BC_ADDR %q is not a URL: write it as https://HOST:PORT", addr)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("BC_ADDR %q: the scheme must be https:// (or http:// for a plain-HTTP loopback API), not %s://", addr, u.Scheme)
	}
	return nil
}

// checkKeyFile refuses a key file that holds something other than an API
// key, naming what it holds (never its contents).
func checkKeyFile(path string, b []byte) error {
	if blk, _ := pem.Decode(b); blk != nil || bytes.HasPrefix(bytes.TrimSpace(b), []byte("-----BEGIN ")) {
		what := "a PEM file"
		if blk != nil {
			what = "a PEM " + blk.Type
		}
		return fmt.Errorf("BC_API_KEY_FILE %s holds %s, not an API key (an API key is one line starting bck_): point it at the file `better-compute api-keys create --out FILE` wrote, or at DATA/admin.key from `better-compute dev`", path, what)
	}
	return nil
}
