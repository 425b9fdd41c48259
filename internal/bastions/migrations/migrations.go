// Package migrations holds the bastions module's part of each schema
// version, embedded: the tables it creates are the bastions module's, and
// only its SQL names them (internal/archtest enforces this). The store
// applies every module's parts of a version together
// (internal/store/modules.go).
package migrations

import "embed"

// FS holds the module's migration files, named NNNN_description.sql, where
// NNNN is the global schema version the part belongs to.
//
//go:embed *.sql
var FS embed.FS
