package api

// docs/iam.md's action list, resource kinds and built-in roles are
// generated from this package's method table (and iam's migrations);
// cmd/actiondoc's test fails when they are stale.
//go:generate go run ./cmd/actiondoc -doc ../../docs/iam.md
