package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// Names and id prefixes.
//
// Wherever the CLI takes an id it also takes the object's name (nodes,
// tenants, templates, identities, roles, API keys), a secret's name within
// the caller's tenant (for its secret://TENANT/NAME reference), or a unique
// prefix of the id. The CLI resolves them itself, through the same list
// calls the caller could make (so it sees only what the caller may see,
// and other tenants' objects never enter the answer); the API still takes
// exact ids only. In order: an exact id; an exact name; a unique id
// prefix. A name or prefix that matches several objects is refused (exit
// 2) with the candidates; one that matches nothing is sent as it is, so the
// API answers it exactly as before (NOT_FOUND or ACCESS_DENIED). A full
// id is sent without a lookup. Commands are looked up among the newest
// 1,000 the caller sees.

// family is a kind of object the CLI takes by id, name or id prefix.
type family struct {
	noun   string         // "node"
	prefix string         // the id's prefix ("n"), for the full-id shortcut
	list   string         // the list method
	in     map[string]any // its input
	key    string         // the answer's array
	id     string         // the field the API takes
	name   string         // the name field ("" when none)
	// scoped families are listed in the tenant the input names, if any.
	scoped bool
}

var families = map[string]family{
	"node":     {noun: "node", prefix: "n", list: "nodes.list", key: "nodes", id: "id", name: "name", scoped: true},
	"command":  {noun: "command", prefix: "c", list: "commands.list", in: map[string]any{"limit": 1000}, key: "commands", id: "id"},
	"sandbox":  {noun: "sandbox", prefix: "sbx", list: "sandboxes.list", key: "sandboxes", id: "id", scoped: true},
	"tenant":   {noun: "tenant", prefix: "t", list: "tenants.list", key: "tenants", id: "id", name: "name"},
	"template": {noun: "template", prefix: "tpl", list: "templates.list", key: "templates", id: "id", name: "name", scoped: true},
	"identity": {noun: "identity", prefix: "i", list: "identities.list", key: "identities", id: "id", name: "name", scoped: true},
	"role":     {noun: "role", prefix: "r", list: "roles.list", key: "roles", id: "id", name: "name", scoped: true},
	"api-key":  {noun: "API key", prefix: "k", list: "apiKeys.list", key: "api_keys", id: "id", name: "name", scoped: true},
	"secret":   {noun: "secret", list: "secrets.list", key: "secrets", id: "ref", name: "name", scoped: true},
}

// inputFamilies maps an input field to the family of the id it holds.
var inputFamilies = map[string]string{
	"node_id": "node", "node_ids": "node", "tenant_id": "tenant", "parent_id": "tenant",
	"identity_id": "identity", "role_id": "role", "ref": "secret",
}

// idFamilies maps a method's service to the family of its "id" input.
var idFamilies = map[string]string{
	"nodes": "node", "commands": "command", "sandboxes": "sandbox", "tenants": "tenant",
	"templates": "template", "identities": "identity", "roles": "role", "apiKeys": "api-key",
}

// resolver looks names and prefixes up for one command line, listing each
// family at most once.
type resolver struct {
	cl     *client.Client
	tenant string // the input's tenant_id, once resolved
	rows   map[string][]row
}

// row is one listed object: the id the API takes and its name.
type row struct{ id, name string }

func newResolver(cl *client.Client) *resolver {
	return &resolver{cl: cl, rows: map[string][]row{}}
}

// resolveInput rewrites the names and prefixes in a map input (the fields
// of inputFamilies, and "id" by the method's service) into ids.
func resolveInput(ctx context.Context, cl *client.Client, method string, in any) (any, error) {
	m, ok := in.(map[string]any)
	if !ok {
		return in, nil
	}
	r := newResolver(cl)
	out := make(map[string]any, len(m))
	if t, ok := m["tenant_id"].(string); ok {
		var err error
		if r.tenant, err = r.resolve(ctx, "tenant", t); err != nil {
			return nil, err
		}
	}
	for k, v := range m {
		fam := inputFamilies[k]
		if k == "id" {
			service, _, _ := strings.Cut(method, ".")
			fam = idFamilies[service]
		}
		var err error
		switch x := v.(type) {
		case string:
			if fam != "" {
				v, err = r.resolve(ctx, fam, x)
			}
		case []string:
			if fam != "" {
				v, err = r.resolveAll(ctx, fam, x)
			}
		}
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

func (r *resolver) resolveAll(ctx context.Context, fam string, args []string) ([]string, error) {
	out := make([]string, len(args))
	for i, a := range args {
		id, err := r.resolve(ctx, fam, a)
		if err != nil {
			return nil, err
		}
		out[i] = id
	}
	return out, nil
}

// resolve returns the id arg stands for; see the package comment above.
func (r *resolver) resolve(ctx context.Context, fam, arg string) (string, error) {
	f := families[fam]
	if arg == "" || f.prefix != "" && ids.Valid(f.prefix, arg) || fam == "secret" && strings.HasPrefix(arg, "secret://") {
		return arg, nil
	}
	rows, ok := r.load(ctx, f)
	if !ok {
		return arg, nil
	}
	return pick(f, rows, arg)
}

// pick chooses among rows: an exact id, then an exact name, then a unique
// id prefix; arg itself when nothing matches.
func pick(f family, rows []row, arg string) (string, error) {
	var byName, byPrefix []row
	for _, x := range rows {
		switch {
		case x.id == arg:
			return x.id, nil
		case f.name != "" && x.name == arg:
			byName = append(byName, x)
		case f.prefix != "" && strings.HasPrefix(x.id, arg):
			byPrefix = append(byPrefix, x)
		}
	}
	for _, found := range [][]row{byName, byPrefix} {
		switch {
		case len(found) == 1:
			return found[0].id, nil
		case len(found) > 1:
			return "", ambiguous(f, arg, found)
		}
	}
	return arg, nil
}

// ambiguous refuses a name or prefix that matches several objects, listing
// them (all of them the caller's to see).
func ambiguous(f family, arg string, found []row) error {
	sort.Slice(found, func(i, j int) bool { return found[i].id < found[j].id })
	var b strings.Builder
	fmt.Fprintf(&b, "%q matches %d %ss; give one of their ids (or a longer prefix):", arg, len(found), f.noun)
	for i, x := range found {
		if i == 10 {
			fmt.Fprintf(&b, "\n  ... and %d more", len(found)-10)
			break
		}
		b.WriteString("\n  " + x.id)
		if x.name != "" && x.name != x.id {
			b.WriteString("  " + x.name)
		}
	}
	return &ExitError{Code: 2, Err: fmt.Errorf("%s", b.String())}
}

// load lists family f once; false when the list cannot be had (the caller
// may not list, or the API is down), so the argument goes to the API as
// it is.
func (r *resolver) load(ctx context.Context, f family) ([]row, bool) {
	if rows, ok := r.rows[f.list]; ok {
		return rows, true
	}
	in := map[string]any{}
	for k, v := range f.in {
		in[k] = v
	}
	if f.scoped && r.tenant != "" {
		in["tenant_id"] = r.tenant
	}
	var out map[string][]map[string]any
	if err := r.cl.Call(ctx, f.list, in, &out); err != nil {
		return nil, false
	}
	var rows []row
	for _, m := range out[f.key] {
		id, _ := m[f.id].(string)
		name, _ := m[f.name].(string)
		if f.list == "secrets.list" {
			name = secretName(id)
		}
		rows = append(rows, row{id: id, name: name})
	}
	r.rows[f.list] = rows
	return rows, true
}

// secretName is NAME of secret://TENANT/NAME.
func secretName(ref string) string {
	rest, ok := strings.CutPrefix(ref, "secret://")
	if !ok {
		return ""
	}
	_, name, _ := strings.Cut(rest, "/")
	return name
}

// resolveArg replaces *arg, a name or id prefix of family fam, with its id.
func resolveArg(cmd *cobra.Command, cl *client.Client, fam string, arg *string) error {
	id, err := newResolver(cl).resolve(contextOf(cmd), fam, *arg)
	if err == nil {
		*arg = id
	}
	return err
}
