//go:build linux && amd64

package plugin

import "golang.org/x/sys/unix"

const (
	nativeAuditArch = unix.AUDIT_ARCH_X86_64
	cloneFlagsArg   = 0
)
