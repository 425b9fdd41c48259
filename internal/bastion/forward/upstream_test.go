package forward

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// fakeResolver answers every name with fixed addresses.
type fakeResolver []netip.Addr

func (r fakeResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return r, nil
}

// localSet is a LocalChecker that knows a fixed set of this machine's
// addresses, or fails when err is set.
type localSet struct {
	addrs []netip.Addr
	err   error
}

func (l localSet) IsLocal(_ context.Context, a netip.Addr) (bool, string, error) {
	return slices.Contains(l.addrs, a), "test", l.err
}

func TestCheckUpstreamLoopback(t *testing.T) {
	got, err := CheckUpstream(context.Background(), KindOllama, "127.0.0.1:11434", netguard.NewLocalChecker(), net.DefaultResolver)
	if err != nil || !slices.Equal(got, []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:11434")}) {
		t.Fatalf("127.0.0.1: %v %v", got, err)
	}
	got, err = CheckUpstream(context.Background(), KindOllama, "localhost:11434", netguard.NewLocalChecker(), net.DefaultResolver)
	if err != nil || len(got) == 0 {
		t.Fatalf("localhost: %v %v", got, err)
	}
	for _, ap := range got {
		if !ap.Addr().IsLoopback() || ap.Port() != 11434 {
			t.Fatalf("localhost checked as %v", got)
		}
	}
}

func TestCheckUpstreamRefusesAnotherMachine(t *testing.T) {
	_, err := CheckUpstream(context.Background(), KindOllama, "192.0.2.7:11434", netguard.NewLocalChecker(), net.DefaultResolver)
	var ue *UpstreamError
	if !errors.As(err, &ue) {
		t.Fatalf("192.0.2.7: %v, want *UpstreamError", err)
	}
	want := "OLLAMA_ADDR points at 192.0.2.7:11434, which is not this machine; set OLLAMA_ADDR to a loopback or local address"
	if err.Error() != want {
		t.Fatalf("message\n got %q\nwant %q", err, want)
	}
	_, err = New(context.Background(), Config{Kind: KindLLM, Upstream: "192.0.2.7:8000", Policy: newPolicyBox(inference()).get, Streams: NewStreams(1)})
	if !errors.As(err, &ue) || ue.EnvVar != "BC_LLM_ADDR" {
		t.Fatalf("New with a remote upstream: %v, want a refusal naming BC_LLM_ADDR", err)
	}
}

func TestCheckUpstreamEveryAddress(t *testing.T) {
	r := fakeResolver{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.0.2.7")}
	_, err := CheckUpstream(context.Background(), KindPII, "models.example:8010", netguard.NewLocalChecker(), r)
	want := "BC_PII_ADDR points at models.example:8010 (192.0.2.7:8010), which is not this machine; set BC_PII_ADDR to a loopback or local address"
	if err == nil || err.Error() != want {
		t.Fatalf("one of two addresses remote:\n got %v\nwant %s", err, want)
	}
	// Both this machine's (the second by the LocalChecker): checked in order.
	local := localSet{addrs: []netip.Addr{netip.MustParseAddr("10.9.8.7")}}
	r = fakeResolver{netip.MustParseAddr("::1"), netip.MustParseAddr("10.9.8.7")}
	got, err := CheckUpstream(context.Background(), KindPII, "models.example:8010", local, r)
	wantAddrs := []netip.AddrPort{netip.MustParseAddrPort("[::1]:8010"), netip.MustParseAddrPort("10.9.8.7:8010")}
	if err != nil || !slices.Equal(got, wantAddrs) {
		t.Fatalf("all local: %v %v, want %v", got, err, wantAddrs)
	}
}

func TestCheckUpstreamFailsClosed(t *testing.T) {
	broken := localSet{err: errors.New("netlink unavailable")}
	for _, tc := range []struct {
		upstream string
		local    netguard.LocalChecker
	}{
		{"10.9.8.7:11434", broken},             // cannot tell
		{"0.0.0.0:11434", localSet{}},          // unspecified
		{"[ff02::1]:11434", localSet{}},        // multicast
		{"http://127.0.0.1:11434", localSet{}}, // a URL, not host:port
		{"127.0.0.1", localSet{}},              // no port
		{"127.0.0.1:0", localSet{}},            // port 0
		{":11434", localSet{}},                 // no host
		{"empty.example:11434", localSet{}},    // resolves to nothing
	} {
		_, err := CheckUpstream(context.Background(), KindOllama, tc.upstream, tc.local, fakeResolver{})
		var ue *UpstreamError
		if !errors.As(err, &ue) {
			t.Errorf("%s: %v, want *UpstreamError", tc.upstream, err)
		}
	}
}
