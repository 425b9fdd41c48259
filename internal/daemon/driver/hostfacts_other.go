//go:build !linux

package driver

import "github.com/bettercompute/bettercompute/internal/proto/nodev1"

// hostMemory is unknown off Linux.
func hostMemory() int64 { return 0 }

// hostDisks is unknown off Linux.
func hostDisks() []*nodev1.Disk { return nil }
