// Package integration holds the end-to-end tests of the security chain:
// a real control plane and real bcd agents over mutual TLS on loopback,
// on SQLite and on PostgreSQL.
package integration
