package store

import (
	apikeysmig "github.com/bettercompute/bettercompute/internal/apikeys/migrations"
	auditmig "github.com/bettercompute/bettercompute/internal/audit/migrations"
	auditlogmig "github.com/bettercompute/bettercompute/internal/auditlog/migrations"
	bastionsmig "github.com/bettercompute/bettercompute/internal/bastions/migrations"
	breakglassmig "github.com/bettercompute/bettercompute/internal/breakglass/migrations"
	commandsmig "github.com/bettercompute/bettercompute/internal/commands/migrations"
	iammig "github.com/bettercompute/bettercompute/internal/iam/migrations"
	idempotencymig "github.com/bettercompute/bettercompute/internal/idempotency/migrations"
	nodesmig "github.com/bettercompute/bettercompute/internal/nodes/migrations"
	quorummig "github.com/bettercompute/bettercompute/internal/quorum/migrations"
	quotamig "github.com/bettercompute/bettercompute/internal/quota/migrations"
	revocationsmig "github.com/bettercompute/bettercompute/internal/revocations/migrations"
	sandboxesmig "github.com/bettercompute/bettercompute/internal/sandboxes/migrations"
	secretsmig "github.com/bettercompute/bettercompute/internal/secrets/migrations"
	signingmig "github.com/bettercompute/bettercompute/internal/signing/migrations"
	ticketsmig "github.com/bettercompute/bettercompute/internal/tickets/migrations"
)

// Modules lists every module's migrations in the order their parts of one
// version are applied: a module after the modules whose tables its tables
// reference (every tenant-scoped table references iam's tenants). The
// migrations packages are data only (an embedded FS each), so the store
// imports no module code.
func Modules() []Source {
	return []Source{
		{Module: "iam", FS: iammig.FS},
		{Module: "apikeys", FS: apikeysmig.FS},
		{Module: "audit", FS: auditmig.FS},
		{Module: "auditlog", FS: auditlogmig.FS},
		{Module: "nodes", FS: nodesmig.FS},
		{Module: "commands", FS: commandsmig.FS},
		{Module: "signing", FS: signingmig.FS},
		{Module: "quorum", FS: quorummig.FS},
		{Module: "secrets", FS: secretsmig.FS},
		{Module: "sandboxes", FS: sandboxesmig.FS},
		{Module: "quota", FS: quotamig.FS},
		{Module: "tickets", FS: ticketsmig.FS},
		{Module: "breakglass", FS: breakglassmig.FS},
		{Module: "revocations", FS: revocationsmig.FS},
		{Module: "bastions", FS: bastionsmig.FS},

		{Module: "idempotency", FS: idempotencymig.FS},
	}
}
