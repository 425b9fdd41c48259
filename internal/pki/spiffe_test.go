package pki

import (
	"net/url"
	"testing"
)

// TestSPIFFEIDForms: the formers give the canonical IDs the parsers accept,
// and an empty URL (which nothing accepts) for input that is no SPIFFE ID.
func TestSPIFFEIDForms(t *testing.T) {
	for got, want := range map[string]string{
		NodeSPIFFEID("dev.bc.local", "n-1").String():   "spiffe://dev.bc.local/node/n-1",
		WorkerSPIFFEID("dev.bc.local", "w-1").String(): "spiffe://dev.bc.local/worker/w-1",
		GatewaySPIFFEID("dev.bc.local").String():       "spiffe://dev.bc.local/gateway",
		ControlSPIFFEID("dev.bc.local").String():       "spiffe://dev.bc.local/control",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	for _, bad := range []*url.URL{NodeSPIFFEID("Dev.BC", "n-1"), NodeSPIFFEID("dev.bc.local", ""), NodeSPIFFEID("dev.bc.local", ".."), GatewaySPIFFEID("")} {
		if bad.String() != "" {
			t.Errorf("invalid input formed %s", bad)
		}
	}
	td, id, err := parseSPIFFEID(NodeSPIFFEID("dev.bc.local", "n-1"), "node")
	if err != nil || td != "dev.bc.local" || id != "n-1" {
		t.Fatalf("parse of a formed ID: %q %q %v", td, id, err)
	}
}

// FuzzParseSPIFFEID: whatever URI SAN a certificate carries, the parser
// accepts it only when the parsed URI (as crypto/x509 hands it over, the
// scheme folded to lower case by net/url) is exactly the canonical ID
// formed from the trust domain, kind and id it returns.
func FuzzParseSPIFFEID(f *testing.F) {
	f.Add("spiffe://dev.bc.local/node/n-1", "node")
	f.Add("spiffe://dev.bc.local/worker/w-1", "worker")
	f.Add("spiffe://u@dev.bc.local/node/a", "node")
	f.Add("spiffe://dev.bc.local/node/a%2Fb", "node")
	f.Add("spiffe://dev.bc.local:1/node/a", "node")
	f.Fuzz(func(t *testing.T, raw, kind string) {
		if kind != "node" && kind != "worker" {
			return
		}
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		td, id, err := parseSPIFFEID(u, kind)
		if err != nil {
			return
		}
		if ValidateTrustDomain(td) != nil || !ValidNodeID(id) || spiffeID(td, kind, id).String() != u.String() {
			t.Fatalf("accepted %q as %q %q", raw, td, id)
		}
	})
}
