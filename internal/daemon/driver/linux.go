package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"runtime"
	"time"

	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Linux drives a real Linux host. diag.run runs a fixed list of argument
// vectors (no shell, nothing from the payload reaches an argv); kinds that
// change the machine are not implemented here yet and fail as
// unsupported-kind rather than doing something approximate.
type Linux struct{}

// NewLinux returns the linux driver.
func NewLinux() *Linux { return &Linux{} }

// Name returns "linux".
func (*Linux) Name() string { return "linux" }

// diagArgv is the fixed diagnostics: each entry is run as is.
var diagArgv = [][]string{
	{"uname", "-srm"},
	{"nproc"},
	{"uptime"},
}

// Inventory reports what the host says of itself: its CPUs, its memory
// (MemTotal of /proc/meminfo) and its mounted block devices, each sized by
// statfs of where it is mounted.
func (*Linux) Inventory() *nodev1.Inventory {
	h, _ := os.Hostname()
	return &nodev1.Inventory{Driver: "linux", Hostname: h, Cpus: int32(runtime.NumCPU()), MemoryBytes: hostMemory(), Disks: hostDisks()}
}

// Run executes kind on the host.
func (*Linux) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	switch kind {
	case kinds.NodePing:
		h, _ := os.Hostname()
		return json.Marshal(map[string]any{"pong": true, "hostname": h})
	case kinds.SecretDigest:
		return secretDigest(ctx, payload)
	case kinds.DiagRun:
		type out struct {
			Argv   []string `json:"argv"`
			Exit   int      `json:"exit"`
			Stdout string   `json:"stdout"`
		}
		var res []out
		healthy := true
		for _, argv := range diagArgv {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
			var so bytes.Buffer
			cmd.Stdout = &so
			err := cmd.Run()
			cancel()
			code := 0
			if err != nil {
				healthy = false
				code = -1
				if ee, ok := err.(*exec.ExitError); ok {
					code = ee.ExitCode()
				}
			}
			s := so.String()
			if len(s) > 4096 {
				s = s[:4096]
			}
			res = append(res, out{Argv: argv, Exit: code, Stdout: s})
		}
		return json.Marshal(map[string]any{"driver": "linux", "healthy": healthy, "checks": res})
	default:
		return nil, ErrUnsupported
	}
}
