package config

import (
	"strings"
	"testing"
)

// The API's TLS settings: plain HTTP only on loopback or behind trusted
// proxies, never with cert_file; cert_file and key_file go together.
func TestAPITLSSettings(t *testing.T) {
	for doc, want := range map[string]string{
		"[api]\nplain_http = true\n":                                                                "",
		"[api]\nplain_http = true\nlisten = \"[::1]:7780\"\n":                                       "",
		"[api]\nplain_http = true\nlisten = \"localhost:7780\"\n":                                   "",
		"[api]\nplain_http = true\nlisten = \"0.0.0.0:7780\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n": "",
		"[api]\nplain_http = true\nlisten = \"0.0.0.0:7780\"\n":                                     "api.plain_http: plain HTTP would send API keys in clear",
		"[api]\nplain_http = true\nlisten = \":7780\"\n":                                            "api.plain_http: plain HTTP would send API keys in clear",
		"[api]\nplain_http = true\ncert_file = \"c\"\nkey_file = \"k\"\n":                           "api.plain_http: conflicts with api.cert_file",
		"[api]\ncert_file = \"c\"\n":                                                                "api.cert_file: set both",
		"[api]\nnames = []\n":                                                                       "api.names: at least one",
		"[api]\nnames = [\"bc.example.com\", \"10.0.0.5\", \"::1\"]\n":                              "",
		"[api]\nnames = [\"a b\"]\n":                                                                "api.names[0]",
	} {
		_, err := Parse([]byte(doc))
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%q: %v, want %q", doc, err, want)
		}
	}
}
