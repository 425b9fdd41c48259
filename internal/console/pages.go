package console

import (
	"bytes"
	"encoding/json"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"
)

// page is what every template renders: the title, the session's CSRF
// token for its forms (empty when signed out), an error, and the page's
// own data.
type page struct {
	Title string
	CSRF  string
	Error *apiError
	Data  any
}

// funcs are the helpers templates use; none returns template.HTML.
var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"json":   prettyJSON,
	"labels": labelText,
}

// prettyJSON indents a raw JSON value for display, with <, > and & as
// themselves (the template escapes the text it becomes).
func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return string(raw)
	}
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	e.SetIndent("", "  ")
	if e.Encode(v) != nil {
		return string(raw)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// labelText is a node's labels as sorted key=value pairs.
func labelText(l map[string]string) []string {
	out := make([]string, 0, len(l))
	for k, v := range l {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// render writes the named template with status. A template that fails
// is logged and answered with a plain error, never half a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	var b bytes.Buffer
	if err := c.tmpl.ExecuteTemplate(&b, name, p); err != nil {
		c.log.Error("console: render", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(b.Bytes())
	}
}

// refused renders an API refusal as an error page with its code and the
// status that code has in the API (NOT_FOUND is a 404, and so on). A
// session the API no longer accepts is signed out instead.
func (c *Console) refused(w http.ResponseWriter, r *http.Request, s session, e *apiError) {
	if e.Code == "UNAUTHENTICATED" {
		c.setCookie(w, r, "", time.Time{})
		redirect(w, r, Prefix+"signin")
		return
	}
	title := "Refused"
	if e.Code == "NOT_FOUND" {
		title = "Not found"
	}
	c.render(w, r, e.status(), "error", page{Title: title, CSRF: s.csrf, Error: e})
}

// fleetNode is a node with its latest commands.
type fleetNode struct {
	Node     node
	Commands []command
}

// lastCommands is how many recent commands the fleet page shows per node.
const lastCommands = 3

// fleet shows the nodes: id, name, connected, labels and last commands.
func (c *Console) fleet(w http.ResponseWriter, r *http.Request, s session) {
	var ns struct {
		Nodes []node `json:"nodes"`
	}
	var cs struct {
		Commands []command `json:"commands"`
	}
	cred := credential{session: s.value}
	if e := c.call(r, cred, "nodes.list", struct{}{}, &ns); e != nil {
		c.refused(w, r, s, e)
		return
	}
	if e := c.call(r, cred, "commands.list", commandListIn{Limit: 200}, &cs); e != nil {
		c.refused(w, r, s, e)
		return
	}
	slices.SortStableFunc(cs.Commands, func(a, b command) int { return b.CreatedAt.Compare(a.CreatedAt) })
	out := make([]fleetNode, len(ns.Nodes))
	for i, n := range ns.Nodes {
		out[i].Node = n
		for _, cmd := range cs.Commands {
			if cmd.NodeID == n.ID && len(out[i].Commands) < lastCommands {
				out[i].Commands = append(out[i].Commands, cmd)
			}
		}
	}
	c.render(w, r, http.StatusOK, "fleet", page{Title: "Fleet", CSRF: s.csrf, Data: out})
}

// commandView is a command with its attestation (nil when it has none).
type commandView struct {
	Command     command
	Attestation *attestation
	AttestError *apiError
}

// command shows one command, its result and the attestation of it.
func (c *Console) command(w http.ResponseWriter, r *http.Request, s session) {
	var v commandView
	in := idIn{ID: r.PathValue("id")}
	cred := credential{session: s.value}
	if e := c.call(r, cred, "commands.get", in, &v.Command); e != nil {
		c.refused(w, r, s, e)
		return
	}
	var a attestation
	if e := c.call(r, cred, "commands.attestation", in, &a); e != nil {
		v.AttestError = e
	} else {
		v.Attestation = &a
	}
	c.render(w, r, http.StatusOK, "command", page{Title: "Command " + v.Command.ID, CSRF: s.csrf, Data: v})
}

// batches lists destructive batches.
func (c *Console) batches(w http.ResponseWriter, r *http.Request, s session) {
	var bs struct {
		Batches []batch `json:"batches"`
	}
	if e := c.call(r, credential{session: s.value}, "batches.list", struct{}{}, &bs); e != nil {
		c.refused(w, r, s, e)
		return
	}
	c.render(w, r, http.StatusOK, "batches", page{Title: "Destructive batches", CSRF: s.csrf, Data: bs.Batches})
}

// batchView is a batch with the command an approver runs to sign it.
type batchView struct {
	Batch       batch
	ApproveLine string
}

// batch shows one batch: its leaves, root, approvals and proposer, and
// the exact `better-compute batch approve` line (approvers sign offline,
// with their own keys; the CLI recomputes the root, which they compare
// with the one shown here).
func (c *Console) batch(w http.ResponseWriter, r *http.Request, s session) {
	var v batchView
	if e := c.call(r, credential{session: s.value}, "batches.get", idIn{ID: r.PathValue("id")}, &v.Batch); e != nil {
		c.refused(w, r, s, e)
		return
	}
	v.ApproveLine = "better-compute batch approve " + v.Batch.ID + " --key APPROVER.key --deployment " + v.Batch.Deployment
	c.render(w, r, http.StatusOK, "batch", page{Title: "Batch " + v.Batch.ID, CSRF: s.csrf, Data: v})
}

// sandboxView is the sandboxes and templates page's data.
type sandboxView struct {
	Sandboxes []sandbox
	Templates []sandboxTemplate
}

// sandboxTemplate is a sandbox template as templates.list shows it (the fields
// the page shows).
type sandboxTemplate struct {
	ID              string `json:"id"`
	Name            string `json:"name"`
	Image           string `json:"image"`
	Runtime         string `json:"runtime"`
	Network         string `json:"network"`
	LifetimeSeconds int64  `json:"lifetime_seconds"`
	Warm            int    `json:"warm"`
}

// sandboxes shows the tenant's sandboxes and templates.
func (c *Console) sandboxes(w http.ResponseWriter, r *http.Request, s session) {
	var sb struct {
		Sandboxes []sandbox `json:"sandboxes"`
	}
	var tp struct {
		Templates []sandboxTemplate `json:"templates"`
	}
	cred := credential{session: s.value}
	if e := c.call(r, cred, "sandboxes.list", struct{}{}, &sb); e != nil {
		c.refused(w, r, s, e)
		return
	}
	if e := c.call(r, cred, "templates.list", struct{}{}, &tp); e != nil {
		c.refused(w, r, s, e)
		return
	}
	c.render(w, r, http.StatusOK, "sandboxes", page{Title: "Sandboxes and templates", CSRF: s.csrf, Data: sandboxView{sb.Sandboxes, tp.Templates}})
}
