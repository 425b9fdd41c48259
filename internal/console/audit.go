package console

import (
	"fmt"
	"net/http"

	"github.com/bettercompute/bettercompute/internal/auditlog"
)

// auditView is the audit page's data: the newest events first, the
// tenant's latest signed checkpoint (from the inclusion proof of the
// newest sealed event) and what checking it found.
type auditView struct {
	Events     []auditEvent
	Checkpoint string
	// Verified says what was checked of the latest checkpoint;
	// VerifyError why it was not (or failed).
	Verified    string
	VerifyError string
}

// audit shows the tenant's audit log through audit.list, and its latest
// checkpoint through audit.prove of the newest sealed event.
func (c *Console) audit(w http.ResponseWriter, r *http.Request, s session) {
	var out struct {
		Events []auditEvent `json:"events"`
	}
	cred := credential{session: s.value}
	if e := c.call(r, cred, "audit.list", struct{}{}, &out); e != nil {
		c.refused(w, r, s, e)
		return
	}
	v := auditView{Events: make([]auditEvent, 0, len(out.Events))}
	var newest string
	for i := len(out.Events) - 1; i >= 0; i-- {
		ev := out.Events[i]
		v.Events = append(v.Events, ev)
		if newest == "" && ev.Sealed {
			newest = ev.ID
		}
	}
	if newest == "" {
		v.VerifyError = "no sealed event yet: the workers seal the log periodically (better-compute audit seal)"
	} else {
		c.checkLatest(r, cred, newest, &v)
	}
	c.render(w, r, http.StatusOK, "audit", page{Title: "Audit log", CSRF: s.csrf, Data: v})
}

// checkLatest fetches the inclusion proof of the newest sealed event,
// shows its checkpoint, and checks the proof (the checkpoint's signature
// under the deployment's audit key, its origin, and the event's
// inclusion) when the console has the audit keys.
func (c *Console) checkLatest(r *http.Request, cred credential, event string, v *auditView) {
	var p auditProof
	if e := c.call(r, cred, "audit.prove", auditProveIn{EventID: event}, &p); e != nil {
		v.VerifyError = e.Code + ": " + e.Message
		return
	}
	proof, err := auditlog.ParseProof([]byte(p.Proof))
	if err != nil {
		v.VerifyError = "the proof of event " + event + " does not parse"
		return
	}
	v.Checkpoint = string(proof.Checkpoint)
	if c.auditKeys == nil {
		v.VerifyError = "this console has no audit key to check the checkpoint with; check a downloaded proof with better-compute audit check-proof"
		return
	}
	got, err := auditlog.CheckProof([]byte(p.Proof), c.auditKeys)
	if err != nil {
		v.VerifyError = "the checkpoint or the proof of event " + event + " does not check: " + err.Error()
		return
	}
	v.Verified = fmt.Sprintf("verified: signed by %s, tree size %d; event %s (seq %d) is included", c.auditKeys.Name(), got.Checkpoint.Size, event, got.Row.Seq)
}

// proof downloads one event's inclusion proof (the file
// `better-compute audit check-proof` checks offline).
func (c *Console) proof(w http.ResponseWriter, r *http.Request, s session) {
	var p auditProof
	if e := c.call(r, credential{session: s.value}, "audit.prove", auditProveIn{EventID: r.PathValue("id")}, &p); e != nil {
		c.refused(w, r, s, e)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="proof.txt"`)
	_, _ = w.Write([]byte(p.Proof))
}
