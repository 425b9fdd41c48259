// Package wire holds the signature contexts of commands and updates, the
// constants both the control plane and bcd must agree on byte for byte.
package wire

import "github.com/bettercompute/bettercompute/internal/proto/nodev1"

// CommandSigContext prefixes the bytes a worker signs for a command:
// Ed25519(worker key, CommandSigContext || body).
const CommandSigContext = "bc-command-v1\x00"

// UpdateSigContext prefixes the bytes a node signs for an update:
// ECDSA-P256(node key, SHA-256(UpdateSigContext || body)), ASN.1.
const UpdateSigContext = "bc-update-v1\x00"

// TimeSigContext prefixes the bytes a worker signs for a time statement:
// Ed25519(worker key, TimeSigContext || body). It differs from
// CommandSigContext, so a statement can never pass as a command.
const TimeSigContext = "bc-time-v1\x00"

// DesiredStateSigContext prefixes the bytes a worker signs for a node's
// desired state: Ed25519(worker key, DesiredStateSigContext || body). Its
// own context, so a desired state can never pass as a command, a time
// statement or a ticket, nor any of them as a desired state.
const DesiredStateSigContext = "bc-desired-state-v1\x00"

// SecretRequestSigContext prefixes the bytes a node signs for a secret
// request: ECDSA-P256(node key, SHA-256(context || body)).
const SecretRequestSigContext = "bc-secret-request-v1\x00"

// SandboxReportSigContext prefixes the bytes a node signs for a sandbox
// report: ECDSA-P256(node key, SHA-256(context || body)). It differs from
// UpdateSigContext, so a report's signature can never pass as an
// update's, nor an update's as a report's.
const SandboxReportSigContext = "bc-sandbox-report-v1\x00"

// RenewSigContext prefixes the bytes a node signs to prove that it asks
// for a renewal: Sign(current node key, SHA-256(RenewSigContext ||
// csr_der)). Its own context, so no other statement's signature passes
// as a renewal proof.
const RenewSigContext = "bc-renew-v1\x00"

// UpdateItem is one signed update received on NodeID's session; the
// gateway hands batches of them to the command queue.
type UpdateItem struct {
	NodeID string
	Update *nodev1.CommandUpdate
}

// Sent is one command a gateway session wrote to its node's stream: the
// command and the session, so that the command goes back to the queue
// when that session ends before the node reported anything on it.
type Sent struct {
	CommandID string
	SessionID string
}

// UpdateResult is what the queue recorded for one item: the command's
// state (to ack), or why the update was refused.
type UpdateResult struct {
	CommandID string
	State     string
	Err       error
}
