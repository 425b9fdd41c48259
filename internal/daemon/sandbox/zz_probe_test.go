package sandbox

import (
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

func TestZZProbe(t *testing.T) {
	h, digest := testHost(t, runcRuntime(t), clock.Real{})
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	mustCreate(t, h, c)
	for _, argv := range [][]string{{"nope"}, {"/nope"}, {"/etc/passwd"}, {"/etc"}, {"sh", "-c", "echo hi >&2; exit 255"}, {"sh", "-c", "printf '#!/nonexist\\n' > /tmp/x; chmod +x /tmp/x"}, {"/tmp/x"}, {"sh", "-c", "printf 'garbage' > /tmp/y; chmod +x /tmp/y"}, {"/tmp/y"}} {
		r := execIn(t, h, c.SandboxID, 10*time.Second, argv...)
		t.Logf("%q: code=%d stdout=%q stderr=%q", argv, r.ExitCode, r.Stdout, r.Stderr)
	}
}
