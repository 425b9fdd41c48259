// Command better-compute is the control plane (dev, serve, pki) and the
// operator CLI. All logic lives in internal/cli.
package main

import (
	"os"

	"github.com/bettercompute/bettercompute/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
