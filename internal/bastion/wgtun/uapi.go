package wgtun

import (
	"bufio"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// The device is configured with WireGuard's cross-platform configuration
// protocol (UAPI): key=value lines, keys in hex. The text written by
// deviceConfig holds the private key: it goes to IpcSet and nowhere else
// (never a log line, never an error).

// deviceConfig is the whole device configuration for cfg (already checked).
func deviceConfig(cfg Config) string {
	var b strings.Builder
	b.WriteString("private_key=" + cfg.PrivateKey.hex() + "\n")
	b.WriteString("listen_port=" + strconv.Itoa(int(cfg.ListenPort)) + "\n")
	b.WriteString("replace_peers=true\n")
	for _, p := range cfg.Peers {
		b.WriteString(peerConfig(p))
	}
	return b.String()
}

// peerConfig adds or replaces peer p (already checked): its allowed
// addresses are replaced by its one address.
func peerConfig(p Peer) string {
	var b strings.Builder
	b.WriteString("public_key=" + p.PublicKey.hex() + "\n")
	b.WriteString("replace_allowed_ips=true\n")
	b.WriteString("allowed_ip=" + p.AllowedIP.Masked().String() + "\n")
	if p.Endpoint.IsValid() {
		b.WriteString("endpoint=" + p.Endpoint.String() + "\n")
	}
	b.WriteString("persistent_keepalive_interval=" + strconv.Itoa(int(p.Keepalive/time.Second)) + "\n")
	return b.String()
}

// removePeerConfig removes peer k from the device.
func removePeerConfig(k Key) string {
	return "public_key=" + k.hex() + "\nremove=true\n"
}

// deviceState is what this package reads back from the device's IpcGet.
type deviceState struct {
	port      uint16
	handshake map[Key]time.Time // zero time: no handshake yet
}

// parseDeviceState reads IpcGet output. It skips every line it does not
// need, the private_key line among them, and never echoes a line into an
// error. A peer section starts at its public_key line.
func parseDeviceState(text string) deviceState {
	st := deviceState{handshake: map[Key]time.Time{}}
	var cur *Key
	var sec, nsec int64
	flush := func() {
		if cur != nil && sec != 0 {
			st.handshake[*cur] = time.Unix(sec, nsec)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		switch key {
		case "listen_port":
			if n, err := strconv.ParseUint(value, 10, 16); err == nil {
				st.port = uint16(n)
			}
		case "public_key":
			flush()
			cur, sec, nsec = nil, 0, 0
			var k Key
			if b, err := hex.DecodeString(value); err == nil && len(b) == KeyLen {
				copy(k[:], b)
				cur = &k
				st.handshake[k] = time.Time{}
			}
		case "last_handshake_time_sec":
			sec, _ = strconv.ParseInt(value, 10, 64)
		case "last_handshake_time_nsec":
			nsec, _ = strconv.ParseInt(value, 10, 64)
		}
	}
	flush()
	return st
}
