package apikeys

import (
	"database/sql"
	"time"

	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
)

// The reasons of this module's revocation-feed entries.
const (
	ReasonRevoked         = "revoked"          // revoked by its own id (apikeys.revoke, sessions.revoke)
	ReasonMadeBy          = "maker-revoked"    // made by a credential that was revoked
	ReasonIdentityDeleted = "identity-deleted" // its identity was deleted
	ReasonTenantDeleted   = "tenant-deleted"   // its tenant was deleted
)

// cred is a credential's id and tenant.
type cred struct{ id, tenant string }

// scanCreds reads an (id, tenant_id) result.
func scanCreds(rows *sql.Rows) ([]cred, error) {
	defer rows.Close()
	var out []cred
	for rows.Next() {
		var c cred
		if err := rows.Scan(&c.id, &c.tenant); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

func credIDs(cs []cred) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.id
	}
	return out
}

// credEntries are the feed entries of credentials cs of kind, revoked at
// at (unix ms) for reason.
func credEntries(kind string, cs []cred, at int64, reason string) []revwire.Entry {
	out := make([]revwire.Entry, len(cs))
	for i, c := range cs {
		out[i] = revwire.Entry{Kind: kind, Subject: c.id, TenantID: c.tenant, At: time.UnixMilli(at).UTC(), Reason: reason}
	}
	return out
}

// countKinds counts the keys and sessions among entries.
func countKinds(entries []revwire.Entry) (keys, sessions int64) {
	for _, e := range entries {
		switch e.Kind {
		case revwire.KindAPIKey:
			keys++
		case revwire.KindSession:
			sessions++
		}
	}
	return keys, sessions
}

// OnRevoked sets f, called after each revocation this service commits
// (the server pokes the revocation followers with it), so that they need
// not wait for their poll. Set it before serving.
func (s *Service) OnRevoked(f func()) { s.onRevoked = f }

func (s *Service) revoked() {
	if s.onRevoked != nil {
		s.onRevoked()
	}
}
