package bastions

import (
	"regexp"
	"testing"

	"github.com/bettercompute/bettercompute/internal/errs"
)

var refusedRE = regexp.MustCompile(`^the bastion refused the op \([a-z0-9-]{1,64}\)$`)

// FuzzReadAnswer: whatever a bastion answers, the control plane passes on
// only a success at 200, an approval request with a well-formed id at
// 409, a refusal of INVALID_INPUT, ACCESS_DENIED or NOT_FOUND whose
// message names a kebab-case reason, or "did not answer"; never the
// bastion's own message.
func FuzzReadAnswer(f *testing.F) {
	f.Add(200, []byte(`{"ok":true,"kind":"observe:disk","result":{}}`))
	f.Add(409, []byte(`{"ok":false,"code":"APPROVAL_REQUIRED","approval_request":"apr_abcdefghijklmnopqrst","approval_expires":"2026-12-02T10:05:00Z","summary":"s"}`))
	f.Add(403, []byte(`{"ok":false,"code":"ACCESS_DENIED","reason":"excluded","message":"secret path"}`))
	f.Add(400, []byte(`{"ok":false,"code":"INVALID_INPUT","reason":"\u001b[2J"}`))
	f.Add(500, []byte(`<html>`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		a, err := readAnswer(status, body)
		if err == nil {
			if !(a.OK && status == 200) && !(status == 409 && approvalRE.MatchString(a.ApprovalRequest) && len(a.Summary) <= MaxSummary) {
				t.Fatalf("passed on %d %q", status, body)
			}
			return
		}
		switch errs.CodeOf(err) {
		case errs.InvalidInput, errs.AccessDenied, errs.NotFound:
			if !refusedRE.MatchString(errs.SafeMessage(err)) {
				t.Fatalf("refusal message %q", errs.SafeMessage(err))
			}
		case errs.Unavailable:
			if err != errNoAnswer {
				t.Fatalf("unavailable %v", err)
			}
		default:
			t.Fatalf("code %s from %d %q", errs.CodeOf(err), status, body)
		}
	})
}
