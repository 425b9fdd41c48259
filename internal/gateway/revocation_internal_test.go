package gateway

import (
	"context"
	"io"
	"log/slog"
	"testing"
)

// A session whose certificate a renewal superseded closes like an ended
// session (UNAUTHENTICATED, the node reconnects and a copy still holding
// the old certificate is counted); any other revocation closes it as
// revoked (wire.RevokedMessage, which bcd stops on). Closing a superseded
// certificate's session as revoked stopped the original node before the
// copy was quarantined.
func TestRevokedSessionsCloseByReason(t *testing.T) {
	g := &Gateway{cfg: Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, reg: &authRegistry{certs: map[string]CertInfo{
		"s-old":  {NodeID: "n-1", Revoked: true, RevokeReason: reasonSuperseded},
		"s-gone": {NodeID: "n-1", Revoked: true, RevokeReason: "operator"},
	}}}
	ctx := context.Background()
	// A reason that cannot be read (here an unknown serial) closes as
	// superseded: the node reconnects and its handshake is judged afresh.
	for serial, want := range map[string]error{"s-old": errCertSuperseded, "s-gone": errRevoked, "s-unknown": errCertSuperseded} {
		if got := g.revocationCause(ctx, serial); got != want {
			t.Errorf("%s: cause %v, want %v", serial, got, want)
		}
	}
	if sessionStatus(errCertSuperseded) == errCertRevoked || sessionStatus(errRevoked) != errCertRevoked {
		t.Errorf("statuses: superseded %v, revoked %v", sessionStatus(errCertSuperseded), sessionStatus(errRevoked))
	}
}
