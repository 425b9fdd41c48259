//go:build !linux

package netguard

// NewLocalChecker returns this OS's LocalChecker. Outside Linux there is no
// route lookup here, so only the addresses on this machine's interfaces are
// known to be local; a container or VM on a network made on this machine is
// not recognised (see docs/egress.md).
func NewLocalChecker() LocalChecker {
	return NewInterfaceAddrChecker()
}
