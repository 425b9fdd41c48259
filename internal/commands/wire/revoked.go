package wire

// RevokedMessage is the status message of the gateway's UNAUTHENTICATED
// refusal of a session whose certificate the control plane revoked (by an
// operator, or quarantined as a duplicate identity). The gateway sends it
// only to a caller that completed mutual TLS with that certificate's key,
// so it tells the node's holder nothing it could not learn otherwise; bcd
// reads it to stop reconnecting and say how to re-join.
const RevokedMessage = "UNAUTHENTICATED: certificate revoked"
