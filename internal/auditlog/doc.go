// Package auditlog seals the audit rows written by internal/audit into one
// tamper-evident, append-only Merkle log per tenant, and proves and verifies
// that log.
//
// Why: an operator must be able to show someone who does not trust the
// database's operators what happened. Audit rows live in that database, so
// the database alone proves nothing. A sealing job gives each tenant's new
// rows a dense sequence number in the order it finds them committed, appends
// their RFC 6962 leaf hashes to the tenant's log, and stores a checkpoint
// (C2SP tlog-checkpoint) signed as a signed note with the deployment's
// Ed25519 audit key, whose private half never enters the database. After
// that, an edited, deleted or inserted row no longer hashes to a signed
// root, and one row can be proven to a third party offline with an
// inclusion proof (C2SP tlog-proof).
//
// Hashing, tree building and proofs come from github.com/transparency-dev/merkle
// (rfc6962, compact, proof); notes from golang.org/x/mod/sumdb/note. What is
// written here is only the row encoding, the storage, and the two small text
// formats' strict parsers. The design is documented in docs/audit.md.
package auditlog
