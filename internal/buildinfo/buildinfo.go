// Package buildinfo says which build a binary is: its version, the commit
// it was built from and the Go toolchain, for `--version` on both
// binaries. The version and commit come from the module and VCS stamps Go
// writes into every binary (runtime/debug.ReadBuildInfo); a release build
// sets them instead with
//
//	go build -ldflags "-X github.com/bettercompute/bettercompute/internal/buildinfo.Version=v1.2.3 -X github.com/bettercompute/bettercompute/internal/buildinfo.Commit=abc123" ./cmd/...
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version and Commit, when set at link time (-ldflags -X), override what
// the build info says.
var (
	Version string
	Commit  string
)

// Info is one binary's build.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified"`
	GoVersion string `json:"go_version"`
}

// Read returns this binary's build: the -X values when set, else the
// module version and VCS stamps ("unknown" where the build has none, as
// under `go run` or `go test`).
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	return fromBuildInfo(bi, ok, Version, Commit)
}

// fromBuildInfo is Read over given build info and overrides.
func fromBuildInfo(bi *debug.BuildInfo, ok bool, version, commit string) Info {
	in := Info{Version: "unknown", Commit: "unknown", GoVersion: runtime.Version()}
	if ok && bi != nil {
		if bi.GoVersion != "" {
			in.GoVersion = bi.GoVersion
		}
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			in.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Commit = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if version != "" {
		in.Version = version
	}
	if commit != "" {
		in.Commit, in.Modified = commit, false
	}
	return in
}

// String is the one line `--version` prints for program.
func (in Info) String(program string) string {
	commit := in.Commit
	if in.Modified {
		commit += " (modified)"
	}
	return fmt.Sprintf("%s %s, commit %s, %s", program, in.Version, commit, in.GoVersion)
}

// AddVersionFlag gives root a --version flag that prints Read().String
// with root's name.
func AddVersionFlag(root *cobra.Command) {
	root.Version = Read().String(root.Name())
	root.SetVersionTemplate("{{.Version}}\n")
}
