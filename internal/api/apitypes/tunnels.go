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
	Port        uint32    `json:"port,omitempty"`
	SandboxID   string    `json:"sandbox_id,omitempty"`
	ExpiresAt   time.Time `json:"expires_at"`
	ConnectPath string    `json:"connect_path"`
}

// ExecTicketIn is sandboxes.execTicket's input: the sandbox and the
// program to run in it interactively, on a terminal (no shell added).
type ExecTicketIn struct {
	ID   string   `json:"id" api:"max=64"`
	Argv []string `json:"argv" api:"items=32,max=256"`
}
