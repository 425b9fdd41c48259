package devenv

import (
	"slices"
	"strings"
	"testing"
)

// TestPlanPackages: dev installs what sandboxes need only as root, with
// apt-get and --install-packages; otherwise it says exactly what to run;
// with everything present it does and says nothing.
func TestPlanPackages(t *testing.T) {
	all := hostFacts{busybox: true, runc: true, root: true, apt: true, install: true}
	if p := planPackages(all); p.install != nil || p.hint != "" {
		t.Fatalf("nothing missing: %+v", p)
	}
	fresh := hostFacts{root: true, apt: true, install: true}
	if p := planPackages(fresh); !slices.Equal(p.install, []string{"busybox-static", "runc"}) || p.hint != "" {
		t.Fatalf("fresh machine as root: %+v", p)
	}
	noRunc := all
	noRunc.runc = false
	if p := planPackages(noRunc); !slices.Equal(p.install, []string{"runc"}) {
		t.Fatalf("runc missing: %+v", p)
	}
	for name, tc := range map[string]struct {
		f    hostFacts
		want string
	}{
		"not-root":   {hostFacts{apt: true, install: true}, "`sudo apt-get install -y busybox-static runc`"},
		"no-install": {hostFacts{root: true, apt: true}, "`apt-get install -y busybox-static runc`"},
		"no-apt":     {hostFacts{root: true, install: true}, "busybox-static and runc"},
	} {
		p := planPackages(tc.f)
		if p.install != nil || !strings.Contains(p.hint, tc.want) {
			t.Errorf("%s: %+v, want a hint with %q", name, p, tc.want)
		}
	}
}
