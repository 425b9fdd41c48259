package console

import (
	"net/http"
	"time"
)

// approval is a held-back agent request as approvals.list answers it:
// the fields the page shows. Text is the request's deterministic
// description (it names the agent and its person), the words the person
// approves, and Digest its SHA-256.
type approval struct {
	ID        string    `json:"id"`
	AgentID   string    `json:"agent_id"`
	PersonID  string    `json:"person_id"`
	Action    string    `json:"action"`
	Resource  string    `json:"resource"`
	Text      string    `json:"text"`
	Digest    string    `json:"digest"`
	State     string    `json:"state"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Pending reports whether the request still waits for its person (only
// then does the page offer approve and deny).
func (a approval) Pending() bool { return a.State == "pending" }

// approvalsView is the approvals page's data; Unavailable is set when
// the API has no approvals methods.
type approvalsView struct {
	Approvals   []approval
	Unavailable bool
}

// approvals shows the pending agent requests, each with approve and deny
// forms. An API without approvals.list (an unknown method answers
// NOT_FOUND) shows none.
func (c *Console) approvals(w http.ResponseWriter, r *http.Request, s session) {
	var out struct {
		Approvals []approval `json:"approvals"`
	}
	var v approvalsView
	switch e := c.call(r, credential{session: s.value}, "approvals.list", struct{}{}, &out); {
	case e != nil && e.Code == "NOT_FOUND":
		v.Unavailable = true
	case e != nil:
		c.refused(w, r, s, e)
		return
	default:
		v.Approvals = out.Approvals
	}
	c.render(w, r, http.StatusOK, "approvals", page{Title: "Pending approvals", CSRF: s.csrf, Data: v})
}

// decide approves or denies one pending request through approvals.approve
// or approvals.deny (mutation: the Origin and CSRF token are checked
// first).
func (c *Console) decide(w http.ResponseWriter, r *http.Request, s session) {
	method := ""
	switch r.PathValue("verdict") {
	case "approve":
		method = "approvals.approve"
	case "deny":
		method = "approvals.deny"
	default:
		c.render(w, r, http.StatusNotFound, "error", page{Title: "Not found", CSRF: s.csrf, Error: &apiError{Code: "NOT_FOUND", Message: "no such page"}})
		return
	}
	if e := c.call(r, credential{session: s.value}, method, idIn{ID: r.PathValue("id")}, nil); e != nil {
		c.refused(w, r, s, e)
		return
	}
	redirect(w, r, Prefix+"approvals")
}
