package api

import (
	"net/http"
	"testing"
)

func TestClientAddr(t *testing.T) {
	proxies, err := ParseProxies([]string{"10.0.0.0/8", "192.0.2.1"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"untrusted peer ignores XFF", "198.51.100.4:5000", []string{"203.0.113.9"}, "198.51.100.4"},
		{"trusted peer, one hop", "10.1.2.3:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		{"right to left, skipping trusted", "10.1.2.3:5000", []string{"203.0.113.9, 10.4.4.4, 192.0.2.1"}, "203.0.113.9"},
		{"spoofed leftmost is not the client", "10.1.2.3:5000", []string{"1.1.1.1, 203.0.113.9"}, "203.0.113.9"},
		{"several headers", "10.1.2.3:5000", []string{"203.0.113.9", "10.4.4.4"}, "203.0.113.9"},
		{"malformed hop", "10.1.2.3:5000", []string{"203.0.113.9, garbage"}, ""},
		{"missing header", "10.1.2.3:5000", nil, ""},
		{"all hops trusted", "10.1.2.3:5000", []string{"10.5.5.5"}, ""},
		{"mapped peer", "[::ffff:10.1.2.3]:5000", []string{"2001:db8::1"}, "2001:db8::1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: c.peer, Header: http.Header{}}
			for _, v := range c.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := proxies.ClientAddr(r); got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
	if _, err := ParseProxies([]string{"not-an-ip"}); err == nil {
		t.Fatal("bad proxy accepted")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"a":1}`))
	f.Add([]byte(`{"a":{"b":[1,{"c":2,"c":3}]}}`))
	f.Add([]byte(`{"a":1}{}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var v map[string]any
		if err := Decode(raw, &v); err != nil {
			return
		}
		if v == nil {
			t.Fatalf("accepted %q as no object", raw)
		}
	})
}
