//go:build !linux

package plugin

import "errors"

// ShimCommand is the hidden bcd subcommand that becomes a plugin (Linux
// only).
const ShimCommand = "__bcx-exec"

// ShimMain refuses: confined plugins need Linux.
func ShimMain(argv, env []string) error {
	return refuse(CodeShim, errors.New("plugins run confined on Linux only"))
}
