package console

import (
	"net/http"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/auditlog"
)

// auditView is the audit page's data: the newest events first, the
// tenant's latest signed checkpoint (from the inclusion proof of the
// newest sealed event) and whether that proof checked.
type auditView struct {
	Events     []apitypes.AuditEvent
	Checkpoint string
	// Verify says what was checked of the latest checkpoint.
	Verify      string
	VerifyError string
}

// audit shows the tenant's audit log through audit.list, and its latest
// checkpoint through audit.prove of the newest sealed event.
func (c *Console) audit(w http.ResponseWriter, r *http.Request, s session) {
	var out apitypes.AuditList
	cred := credential{session: s.value}
	if e := c.call(r, cred, "audit.list", apitypes.AuditListIn{}, &out); e != nil {
		c.refused(w, r, s, e)
		return
	}
	v := auditView{Events: make([]apitypes.AuditEvent, 0, len(out.Events))}
	var newest string
	for i := len(out.Events) - 1; i >= 0; i-- {
		ev := out.Events[i]
		v.Events = append(v.Events, ev)
		if newest == "" && ev.Sealed {
			newest = ev.ID
		}
	}
	switch {
	case newest == "":
		v.VerifyError = "no sealed event yet: the workers seal the log periodically (better-compute audit seal)"
	default:
		var p apitypes.AuditProof
		if e := c.call(r, cred, "audit.prove", apitypes.AuditProveIn{EventID: newest}, &p); e != nil {
			v.VerifyError = e.Code + ": " + e.Message
			break
		}
		proof, err := auditlog.ParseProof([]byte(p.Proof))
		if err != nil {
			v.VerifyError = "the proof of event " + newest + " does not parse"
			break
		}
		v.Checkpoint = string(proof.Checkpoint)
		v.Verify = "the proof of the newest sealed event (" + newest + ") is well-formed; check it offline against the deployment's audit key with better-compute audit check-proof, and the whole chain with better-compute audit verify"
	}
	c.render(w, r, http.StatusOK, "audit", page{Title: "Audit log", CSRF: s.csrf, Data: v})
}

// proof downloads one event's inclusion proof (the file
// `better-compute audit check-proof` checks offline).
func (c *Console) proof(w http.ResponseWriter, r *http.Request, s session) {
	var p apitypes.AuditProof
	if e := c.call(r, credential{session: s.value}, "audit.prove", apitypes.AuditProveIn{EventID: r.PathValue("id")}, &p); e != nil {
		c.refused(w, r, s, e)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="proof.txt"`)
	_, _ = w.Write([]byte(p.Proof))
}
