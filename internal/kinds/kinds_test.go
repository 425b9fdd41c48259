package kinds

import "testing"

// TestOwner: every sandbox.* kind belongs to the sandboxes module and no
// other kind has an owner; an owned kind is still a known kind.
func TestOwner(t *testing.T) {
	for _, k := range []string{SandboxCreate, SandboxExec, SandboxUpdate, SandboxDelete, "sandbox.anything"} {
		if got := Owner(k); got != ModuleSandboxes {
			t.Errorf("Owner(%q) = %q, want %q", k, got, ModuleSandboxes)
		}
	}
	for _, k := range []string{NodePing, DiagRun, NodeReboot, DiskWipe, SecretDigest, "sandbox", "sandboxes.exec", ""} {
		if got := Owner(k); got != "" {
			t.Errorf("Owner(%q) = %q, want none", k, got)
		}
	}
	if !Known(SandboxExec) {
		t.Error("sandbox.exec is not known")
	}
}

// TestPermitted: a role runs only its row of the table, narrowed by an
// allowed list when one is given; an unknown role runs nothing.
func TestPermitted(t *testing.T) {
	for _, c := range []struct {
		role    string
		allowed []string
		kind    string
		want    bool
	}{
		{"node", nil, DiskWipe, true},
		{"node", []string{NodePing}, DiskWipe, false},
		{"node", []string{DiskWipe}, DiskWipe, true},
		{"ramdisk", nil, SecretDigest, false},
		{"site", nil, NodePing, true},
		{"site", nil, DiagRun, false},
		{"node-tenant", nil, DiagRun, true},
		{"node-tenant", nil, NodeReboot, false},
		{"nobody", nil, NodePing, false},
		{"node", []string{}, NodePing, false},
	} {
		if got := Permitted(c.role, c.allowed, c.kind); got != c.want {
			t.Errorf("Permitted(%q, %q, %q) = %v, want %v", c.role, c.allowed, c.kind, got, c.want)
		}
	}
	if !Destructive(DiskWipe) || !Destructive("bmc.power") || Destructive(DiagRun) {
		t.Error("destructive kinds")
	}
}
