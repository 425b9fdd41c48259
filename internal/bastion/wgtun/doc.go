// Package wgtun is the scoped user-space WireGuard tunnel between a bastion
// (`bcd bastion`, on a person's own machine) and the control plane.
//
// The bastion dials out: its end has no fixed port and names the control
// plane's endpoint; the control plane's end listens on its configured port
// and learns each bastion's endpoint from that bastion's handshake. Inside
// the tunnel the control plane connects to a few gated TCP listeners on the
// bastion (ListenTCP on one end, DialContext on the other).
//
// Everything runs in this process: the WireGuard device is
// golang.zx2c4.com/wireguard with a gVisor netstack as its "interface", so no
// kernel module, no root and no route on the machine is needed, and the only
// thing the tunnel opens on the machine is its UDP socket(s).
//
// The tunnel is scoped. Every peer's only allowed address is that peer's
// single tunnel address (a /32 or /128); CheckScoped refuses anything wider
// with ReasonWideAllowedIP, and Up and AddPeer check every peer before they
// touch the device, so a configuration holding one wide peer brings nothing
// up. WireGuard's cryptokey routing then drops every decrypted packet whose
// source is not the sending peer's allowed address, and this package adds
// two checks of its own above it: a listener accepts a connection only from
// a current peer's address, and DialContext dials only a current peer's
// address. RemovePeer takes the peer out of the device and closes every
// connection this tunnel carried for it.
//
// Refusals are *RefusedError with a stable lowercase Reason (the Reason
// constants). Private keys never appear in logs or errors: Key.LogValue
// redacts a key to a fingerprint, and the device's configuration text (which
// holds the private key) is never logged or wrapped into an error.
package wgtun
