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
