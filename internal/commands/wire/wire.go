// Package wire holds the signature contexts of commands and updates, the
// constants both the control plane and bcd must agree on byte for byte.
package wire

// CommandSigContext prefixes the bytes a worker signs for a command:
// Ed25519(worker key, CommandSigContext || body).
const CommandSigContext = "bc-command-v1\x00"

// UpdateSigContext prefixes the bytes a node signs for an update:
// ECDSA-P256(node key, SHA-256(UpdateSigContext || body)), ASN.1.
const UpdateSigContext = "bc-update-v1\x00"

// SecretRequestSigContext prefixes the bytes a node signs for a secret
// request: ECDSA-P256(node key, SHA-256(context || body)).
const SecretRequestSigContext = "bc-secret-request-v1\x00"
