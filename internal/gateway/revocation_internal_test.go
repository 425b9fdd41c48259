package gateway

import (
	"context"
	"testing"
)

// A session whose certificate a renewal superseded closes like an ended
// session (UNAUTHENTICATED, the node reconnects and a copy still holding
// the old certificate is counted); any other revocation closes it as
// revoked (wire.RevokedMessage, which bcd stops on). Closing a superseded
// certificate's session as revoked stopped the original node before the
// copy was quarantined.
func TestRevokedSessionsCloseByReason(t *testing.T) {
	g := &Gateway{reg: &authRegistry{certs: map[string]CertInfo{
		"s-old":  {NodeID: "n-1", Revoked: true, RevokeReason: reasonSuperseded},
		"s-gone": {NodeID: "n-1", Revoked: true, RevokeReason: "operator"},
	}}}
	ctx := context.Background()
	for serial, want := range map[string]error{"s-old": errCertSuperseded, "s-gone": errRevoked, "s-unknown": errRevoked} {
		if got := g.revocationCause(ctx, serial); got != want {
			t.Errorf("%s: cause %v, want %v", serial, got, want)
		}
	}
	if sessionStatus(errCertSuperseded) == errCertRevoked || sessionStatus(errRevoked) != errCertRevoked {
		t.Errorf("statuses: superseded %v, revoked %v", sessionStatus(errCertSuperseded), sessionStatus(errRevoked))
	}
}
