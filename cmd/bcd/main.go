// Command bcd is the Better Compute node daemon. All logic lives in
// internal/bcdcli and internal/daemon.
package main

import (
	"os"

	"github.com/bettercompute/bettercompute/internal/bcdcli"
)

func main() { os.Exit(bcdcli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
