package bastions_test

import (
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// TestCheckGrant: every refusal of a grant request by its reason, the
// unknown family named in the message, and the default lifetime.
func TestCheckGrant(t *testing.T) {
	for name, c := range map[string]struct {
		req    bastions.GrantRequest
		reason string
	}{
		"unknown allow": {bastions.GrantRequest{Allow: []string{"inference", "shell"}}, bastions.ReasonUnknownFamily},
		"unknown deny":  {bastions.GrantRequest{Allow: []string{"inference"}, Deny: []string{"Inference"}}, bastions.ReasonUnknownFamily},
		"empty":         {bastions.GrantRequest{Models: []string{"m"}}, bastions.ReasonEmptyGrant},
		"duplicate":     {bastions.GrantRequest{Allow: []string{"egress", "egress"}}, bastions.ReasonDuplicate},
		"dup model":     {bastions.GrantRequest{Allow: []string{"inference"}, Models: []string{"a", "a"}}, bastions.ReasonDuplicate},
		"model space":   {bastions.GrantRequest{Allow: []string{"inference"}, Models: []string{"llama 3"}}, bastions.ReasonBadModel},
		"model long":    {bastions.GrantRequest{Allow: []string{"inference"}, Models: []string{strings.Repeat("m", 129)}}, bastions.ReasonBadModel},
		"reach upper":   {bastions.GrantRequest{Allow: []string{"services"}, Reach: []string{"DB"}}, bastions.ReasonBadReach},
		"reach dash":    {bastions.GrantRequest{Allow: []string{"services"}, Reach: []string{"-db"}}, bastions.ReasonBadReach},
		"models cap":    {bastions.GrantRequest{Allow: []string{"inference"}, Models: make([]string, 17)}, bastions.ReasonTooMany},
		"ttl over":      {bastions.GrantRequest{Allow: []string{"egress"}, TTL: 30*24*time.Hour + time.Second}, bastions.ReasonBadTTL},
		"ttl negative":  {bastions.GrantRequest{Allow: []string{"egress"}, TTL: -time.Second}, bastions.ReasonBadTTL},
	} {
		_, err := bastions.CheckGrant(c.req)
		if bastions.ReasonOf(err) != c.reason || errs.CodeOf(err) != errs.InvalidInput {
			t.Errorf("%s: %v, want %s", name, err, c.reason)
		}
	}
	_, err := bastions.CheckGrant(bastions.GrantRequest{Allow: []string{"inference", "shell"}})
	if errs.SafeMessage(err) != `grant-unknown-family: allow: unknown family "shell" (known: inference, models, services, egress)` {
		t.Errorf("message %q", errs.SafeMessage(err))
	}
	r, err := bastions.CheckGrant(bastions.GrantRequest{Allow: []string{"inference", "models"}, Deny: []string{"egress"}, Models: []string{"llama3:8b"}, Reach: []string{"db-1"}})
	if err != nil || r.TTL != bastions.DefaultGrantTTL {
		t.Fatalf("valid request: %+v %v", r, err)
	}
	if r, err := bastions.CheckGrant(bastions.GrantRequest{Deny: []string{"egress"}, TTL: bastions.MaxGrantTTL}); err != nil || r.TTL != bastions.MaxGrantTTL {
		t.Fatalf("deny-only grant at the longest lifetime: %v", err)
	}
}

// FuzzCheckLaneEvents: lane events come from the bastion, a machine the
// control plane does not control. Whatever the fields, CheckLaneEvents
// never panics, and what it accepts has a kind of [a-z.-]{1,32} and no
// control character or space in any field (what reaches the audit log).
func FuzzCheckLaneEvents(f *testing.F) {
	f.Add("accept", "inference/ollama", "", "100.100.0.1:40000", strings.Repeat("a", 64))
	f.Add("refuse", "egress", "egress-private", "100.100.0.1:1", "")
	f.Add("Accept", "x\n", "has space", "\x00", "zz")
	f.Fuzz(func(t *testing.T, kind, lane, reason, peer, hash string) {
		err := bastions.CheckLaneEvents([]bastions.LaneEvent{{Seq: 1, Kind: kind, Lane: lane, Reason: reason, Peer: peer, Hash: hash}})
		if err != nil {
			if bastions.ReasonOf(err) == "" || errs.CodeOf(err) != errs.InvalidInput {
				t.Fatalf("refusal without a reason: %v", err)
			}
			return
		}
		if len(kind) < 1 || len(kind) > 32 || strings.Trim(kind, "abcdefghijklmnopqrstuvwxyz.-") != "" {
			t.Fatalf("accepted kind %q", kind)
		}
		for _, v := range []string{lane, reason, peer, hash} {
			if strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f }) || len(v) > 64 {
				t.Fatalf("accepted field %q", v)
			}
		}
	})
}
