// Package hostops is what the root helper (bcd helper) does on the host
// once a request has passed its caller and intent checks: typed
// operations only. A file is named by kind and id and lands where the
// helper's own table says (never a path the node chose), through
// root-owned directories and never through a symlink; a firewall ruleset
// may touch only bcd's own nftables tables; a GPU reset names a GPU of
// the host's own inventory and resets it by the address that inventory
// holds; a reboot carries only a short, cleaned reason. Every refusal is a
// *helperwire.Refusal with one of helperwire's codes, so the node, the
// tests and operators match on the code.
//
// This is library code without a socket: internal/hosthelper's server
// decodes a request and calls these methods.
package hostops

import (
	"fmt"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// Ops is the helper's host operations and their configuration. The zero
// value refuses every file kind, checks rulesets against DefaultOwned(),
// runs DefaultNFT, and refuses GPU resets and reboots (no GPU and
// Rebooter set).
type Ops struct {
	// Files maps a file kind to where its files go (DefaultFiles gives
	// bcd's). A kind not in it is refused with CodeFileKind.
	Files map[string]FileKind
	// Owned are the nftables tables a ruleset may touch; nil means
	// DefaultOwned().
	Owned []Table
	// NFT is the nft binary ApplyRuleset runs; "" means DefaultNFT.
	NFT string
	// GPU resets a GPU (SysfsResetter on a real host).
	GPU GPUResetter
	// Rebooter reboots the host (SystemctlRebooter on a real host).
	Rebooter Rebooter
}

// refuse returns a refusal with code and a reason safe to show the
// caller (it names no secret: ids, kinds and tokens of the request).
func refuse(code, format string, args ...any) *helperwire.Refusal {
	return &helperwire.Refusal{Code: code, Reason: fmt.Sprintf(format, args...)}
}
