package apitypes

import "time"

// TunnelOpenIn is tunnels.open's input: the node and the port on its
// loopback the tunnel goes to.
type TunnelOpenIn struct {
	NodeID string `json:"node_id" api:"max=64"`
	Port   int64  `json:"port" api:"min=1,max=65535"`
}

// TunnelTicket is tunnels.open's answer: a single-use ticket, valid until
// ExpiresAt (60 s), that the client presents once to the tunnel endpoint
// (GET ConnectPath?node=…&port=… with the Bc-Ticket header).
type TunnelTicket struct {
	Ticket      string    `json:"ticket"`
	JTI         string    `json:"jti"`
	NodeID      string    `json:"node_id"`
	Port        uint32    `json:"port"`
	ExpiresAt   time.Time `json:"expires_at"`
	ConnectPath string    `json:"connect_path"`
}
