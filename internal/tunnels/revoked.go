package tunnels

import "github.com/bettercompute/bettercompute/internal/audit"

// CloseFor closes, with why, every tunnel this process serves whose
// caller (the audit entry Connect was given) match selects, and returns
// how many it closed. The revocation feed's follower calls it for a
// revoked key, session or identity, so a tunnel closes when the
// revocation commits rather than at its next re-decision.
func (s *Service) CloseFor(match func(actor audit.Entry) bool, why error) int {
	s.mu.Lock()
	var hit []*Tunnel
	for t := range s.open {
		if match(t.actor) {
			hit = append(hit, t)
		}
	}
	s.mu.Unlock()
	for _, t := range hit {
		t.close(why)
	}
	return len(hit)
}
