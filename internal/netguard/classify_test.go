package netguard

import (
	"bufio"
	"net/netip"
	"os"
	"strings"
	"testing"
)

type goldenVector struct {
	line int
	addr netip.Addr
	want Reason
}

// loadGolden reads testdata/classify_golden.txt: "ADDRESS EXPECTED # note".
func loadGolden(t *testing.T) []goldenVector {
	t.Helper()
	f, err := os.Open("testdata/classify_golden.txt")
	if err != nil {
		t.Fatalf("open golden: %v", err)
	}
	defer f.Close()
	var out []goldenVector
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			t.Fatalf("golden line %d: want 2 fields, got %q", n, line)
		}
		a, err := netip.ParseAddr(fields[0])
		if err != nil {
			t.Fatalf("golden line %d: %v", n, err)
		}
		want := Reason(fields[1])
		if fields[1] == "allowed" {
			want = Allowed
		}
		out = append(out, goldenVector{line: n, addr: a, want: want})
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read golden: %v", err)
	}
	return out
}

// TestClassifyGolden checks every golden vector's exact reason.
func TestClassifyGolden(t *testing.T) {
	vectors := loadGolden(t)
	if len(vectors) < 200 {
		t.Fatalf("golden table has %d vectors, want at least 200", len(vectors))
	}
	for _, v := range vectors {
		if got := Classify(v.addr); got != v.want {
			t.Errorf("line %d: Classify(%s) = %q, want %q", v.line, v.addr, got.String(), v.want.String())
		}
	}
}

// TestGoldenCoversEveryRange makes sure the golden table holds the first
// and the last address of every range the classifier names, so a range can
// not be added, dropped or resized without a vector noticing.
func TestGoldenCoversEveryRange(t *testing.T) {
	have := make(map[netip.Addr]bool)
	for _, v := range loadGolden(t) {
		have[v.addr.WithZone("")] = true
	}
	var prefixes []netip.Prefix
	for _, r := range v4Rules {
		prefixes = append(prefixes, r.Prefix)
	}
	for _, r := range v6Rules {
		prefixes = append(prefixes, r.Prefix)
	}
	prefixes = append(prefixes, prefixNAT64, prefix6to4, prefixTeredo, prefixGlobal6, prefixCompat, prefixTransl, prefixMapped)
	for _, p := range prefixes {
		first := p.Masked().Addr()
		last := lastAddr(p)
		if !have[first] {
			t.Errorf("golden table lacks the first address %s of %s", first, p)
		}
		if !have[last] {
			t.Errorf("golden table lacks the last address %s of %s", last, p)
		}
		if before := first.Prev(); before.IsValid() && !have[before] {
			t.Errorf("golden table lacks %s, just before %s", before, p)
		}
		if after := last.Next(); after.IsValid() && !have[after] {
			t.Errorf("golden table lacks %s, just after %s", after, p)
		}
	}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// TestClassifyMetadataAddresses pins the cloud metadata endpoints.
func TestClassifyMetadataAddresses(t *testing.T) {
	for addr, want := range map[string]Reason{
		"169.254.169.254":        ReasonLinkLocal,
		"fd00:ec2::254":          ReasonULA,
		"100.100.100.200":        ReasonCGNAT,
		"168.63.129.16":          ReasonCloudMetadata,
		"::ffff:169.254.169.254": ReasonLinkLocal,
		"64:ff9b::a9fe:a9fe":     ReasonLinkLocal,
	} {
		if got := Classify(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Classify(%s) = %q, want %q", addr, got, want)
		}
	}
}

// TestClassifyInvalidIsUnknown: the zero Addr cannot be judged and is
// refused.
func TestClassifyInvalidIsUnknown(t *testing.T) {
	if got := Classify(netip.Addr{}); got != ReasonUnknown {
		t.Fatalf("Classify(zero) = %q, want %q", got, ReasonUnknown)
	}
}

func TestReasonString(t *testing.T) {
	if Allowed.String() != "allowed" || Allowed.Refused() {
		t.Errorf("Allowed: String %q Refused %v", Allowed.String(), Allowed.Refused())
	}
	if ReasonPrivate.String() != "private" || !ReasonPrivate.Refused() {
		t.Errorf("ReasonPrivate: String %q Refused %v", ReasonPrivate.String(), ReasonPrivate.Refused())
	}
}
