package buildinfo

import (
	"runtime/debug"
	"testing"
)

// The version and commit come from the module and VCS stamps, and the
// -ldflags -X values win over them; a build without stamps says unknown.
func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	if got := fromBuildInfo(bi, true, "", "").String("bcd"); got != "bcd v1.2.3, commit abc123 (modified), go1.99" {
		t.Fatalf("stamped: %q", got)
	}
	if got := fromBuildInfo(bi, true, "v2.0.0", "def456").String("bcd"); got != "bcd v2.0.0, commit def456, go1.99" {
		t.Fatalf("overridden: %q", got)
	}
	dev := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "(devel)"}}
	if got := fromBuildInfo(dev, true, "", "").String("bcd"); got != "bcd unknown, commit unknown, go1.99" {
		t.Fatalf("unstamped: %q", got)
	}
}
