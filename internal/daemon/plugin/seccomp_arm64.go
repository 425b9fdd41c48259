//go:build linux && arm64

package plugin

import "golang.org/x/sys/unix"

const (
	nativeAuditArch = unix.AUDIT_ARCH_AARCH64
	cloneFlagsArg   = 0
)
