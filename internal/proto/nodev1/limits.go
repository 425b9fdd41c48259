package nodev1

// MaxMessageBytes bounds every message of the node protocol, in both
// directions, on the gateway and on bcd. The largest legitimate message is
// a CommandUpdate carrying a sandbox exec result: two streams of up to
// 8 MiB each, base64 inside the result's JSON (about 21.4 MiB), plus the
// signature and ids. 32 MiB holds that with room and still bounds what one
// authenticated node can make the gateway buffer.
const MaxMessageBytes = 32 << 20
