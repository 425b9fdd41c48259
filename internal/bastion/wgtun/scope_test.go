package wgtun

import (
	"net/netip"
	"testing"
	"time"
)

func TestCheckScoped(t *testing.T) {
	key := mustKey(t).Public()
	ok := Peer{PublicKey: key, AllowedIP: single(cpAddr)}
	if err := CheckScoped(ok); err != nil {
		t.Fatalf("a /32 peer refused: %v", err)
	}
	v6 := Peer{PublicKey: key, AllowedIP: netip.MustParsePrefix("fd7a:115c:a1e0::2/128"),
		Endpoint: netip.MustParseAddrPort("[2001:db8::1]:51820"), Keepalive: 25 * time.Second}
	if err := CheckScoped(v6); err != nil {
		t.Fatalf("a /128 peer refused: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(*Peer)
		reason string
	}{
		{"/24", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("100.100.0.0/24") }, ReasonWideAllowedIP},
		{"/31", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("100.100.0.0/31") }, ReasonWideAllowedIP},
		{"0.0.0.0/0", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("0.0.0.0/0") }, ReasonWideAllowedIP},
		{"::/0", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("::/0") }, ReasonWideAllowedIP},
		{"/127", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("fd00::/127") }, ReasonWideAllowedIP},
		{"mapped /128", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("::ffff:100.100.0.1/128") }, ReasonBadAllowedIP},
		{"mapped /120", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("::ffff:100.100.0.0/120") }, ReasonWideAllowedIP},
		{"unset", func(p *Peer) { p.AllowedIP = netip.Prefix{} }, ReasonBadAllowedIP},
		{"0.0.0.0/32", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("0.0.0.0/32") }, ReasonBadAllowedIP},
		{"::/128", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("::/128") }, ReasonBadAllowedIP},
		{"multicast", func(p *Peer) { p.AllowedIP = netip.MustParsePrefix("224.0.0.1/32") }, ReasonBadAllowedIP},
		{"zero key", func(p *Peer) { p.PublicKey = Key{} }, ReasonBadPeerKey},
		{"endpoint port 0", func(p *Peer) { p.Endpoint = netip.MustParseAddrPort("127.0.0.1:0") }, ReasonBadEndpoint},
		{"endpoint unspecified", func(p *Peer) { p.Endpoint = netip.MustParseAddrPort("0.0.0.0:51820") }, ReasonBadEndpoint},
		{"endpoint no address", func(p *Peer) { p.Endpoint = netip.AddrPortFrom(netip.Addr{}, 51820) }, ReasonBadEndpoint},
		{"keepalive negative", func(p *Peer) { p.Keepalive = -time.Second }, ReasonBadKeepalive},
		{"keepalive fraction", func(p *Peer) { p.Keepalive = 1500 * time.Millisecond }, ReasonBadKeepalive},
		{"keepalive too long", func(p *Peer) { p.Keepalive = 65536 * time.Second }, ReasonBadKeepalive},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := ok
			tc.mutate(&p)
			wantRefused(t, CheckScoped(p), tc.reason)
		})
	}
}

func TestParseDeviceState(t *testing.T) {
	k1, k2 := mustKey(t).Public(), mustKey(t).Public()
	text := "private_key=" + mustKey(t).hex() + "\nlisten_port=51820\n" +
		"public_key=" + k1.hex() + "\nlast_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\nallowed_ip=100.100.0.2/32\n" +
		"public_key=" + k2.hex() + "\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\n"
	st := parseDeviceState(text)
	if st.port != 51820 {
		t.Fatalf("port %d", st.port)
	}
	if got := st.handshake[k1]; !got.Equal(time.Unix(1700000000, 5)) {
		t.Fatalf("k1 handshake %v", got)
	}
	if got, ok := st.handshake[k2]; !ok || !got.IsZero() {
		t.Fatalf("k2 handshake %v, %v; want known with no handshake", got, ok)
	}
}
