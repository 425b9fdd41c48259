package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/store"
)

// The generated regions of docs/iam.md, each between its begin and end
// marker lines.
const (
	actionsRegion = "actions"
	rolesRegion   = "builtin-roles"
	kindsRegion   = "resource-kinds"
)

func beginMarker(region string) string {
	return "<!-- BEGIN GENERATED " + region + " (go run ./internal/api/cmd/actiondoc) -->"
}
func endMarker(region string) string { return "<!-- END GENERATED " + region + " -->" }

// allMethods returns every method the API server registers (api.Methods
// with the optional modules present, and api.BatchMethods), as
// server.startAPI registers them. No handler runs: the modules are empty.
func allMethods() []api.Method {
	mods := api.Modules{Sandboxes: &sandboxes.Service{}, Quotas: &quota.Service{}, BreakGlass: &breakglass.Service{}, Bastions: &bastions.Service{}, Previews: &previews.Service{}}
	ms := append(api.Methods(mods), api.BatchMethods(api.BatchModules{})...)
	ms = append(ms, api.AuditMethods(&auditlog.Log{})...)
	slices.SortFunc(ms, func(a, b api.Method) int { return strings.Compare(a.Name, b.Name) })
	return ms
}

// furtherActions are actions a handler decides beyond its method's own
// (api.Caller.Allowed), with the method and the resource they are decided on.
var furtherActions = []struct{ action, method, resource string }{
	{api.ActionKeysForOthers, "apiKeys.create", "`identity/<id>`, when the key is for another identity than the caller's"},
	{api.ActionSecretsManage, "templates.create", "`secret/<ref>`, for each secret reference the template's env names"},
	{api.ActionSecretsManage, "templates.update", "`secret/<ref>`, for each reference the new env names and, when the update changes what the guest runs, each the template names now"},
	{"compute:templates:update", "templates.get", "`template/<id>`, when the env has plain values: a caller refused sees them redacted"},
}

// renderActions is the action table: every action, the methods decided on
// it and whether they change state.
func renderActions(ms []api.Method) string {
	byAction := map[string][]string{}
	mutates := map[string]bool{}
	for _, m := range ms {
		byAction[m.Action] = append(byAction[m.Action], "`"+m.Name+"`")
		mutates[m.Action] = mutates[m.Action] || m.Mutates
	}
	for _, f := range furtherActions {
		byAction[f.action] = append(byAction[f.action], "`"+f.method+"` (further check on "+f.resource+")")
		mutates[f.action] = true
	}
	actions := make([]string, 0, len(byAction))
	for a := range byAction {
		actions = append(actions, a)
	}
	slices.Sort(actions)
	var b strings.Builder
	b.WriteString("| Action | Methods decided on it | Changes state |\n|---|---|---|\n")
	for _, a := range actions {
		yes := "no"
		if mutates[a] {
			yes = "yes"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", a, strings.Join(byAction[a], ", "), yes)
	}
	return b.String()
}

// renderKinds lists the resource kinds a statement's resources can name.
func renderKinds() string {
	kinds := []string{}
	for k := range (api.Modules{}).Resolvers() {
		kinds = append(kinds, "`"+k+"/<id>`")
	}
	slices.Sort(kinds)
	return strings.Join(kinds, ", ") + "\n"
}

// renderRoles is the built-in roles as a fresh database holds them (the
// iam migrations), with their statements as JSON.
func renderRoles(roles []iam.Role) string {
	var b strings.Builder
	for _, r := range roles {
		fmt.Fprintf(&b, "- `%s` (id `%s`):\n\n  ```json\n", r.Name, r.ID)
		for _, st := range r.Statements {
			fmt.Fprintf(&b, "  {\"effect\": %q, \"actions\": [%s], \"resources\": [%s]}\n", st.Effect, quoteAll(st.Actions), quoteAll(st.Resources))
		}
		b.WriteString("  ```\n")
	}
	return b.String()
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// builtinRoles migrates a new SQLite database in a temporary directory and
// reads the root tenant's roles from it.
func builtinRoles(ctx context.Context) ([]iam.Role, error) {
	dir, err := os.MkdirTemp("", "actiondoc")
	if err != nil {
		return nil, fmt.Errorf("actiondoc: %w", err)
	}
	defer os.RemoveAll(dir)
	db, err := store.Open(ctx, "sqlite:"+filepath.Join(dir, "control.db"))
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if err := db.Migrate(ctx); err != nil {
		return nil, err
	}
	roles, err := iam.New(db, clock.Real{}).ListRoles(ctx, iam.RootTenant)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(roles, func(a, b iam.Role) int { return strings.Compare(a.Name, b.Name) })
	return roles, nil
}

// regions returns the generated text of every region.
func regions(ctx context.Context) (map[string]string, error) {
	roles, err := builtinRoles(ctx)
	if err != nil {
		return nil, err
	}
	return map[string]string{
		actionsRegion: renderActions(allMethods()),
		rolesRegion:   renderRoles(roles),
		kindsRegion:   renderKinds(),
	}, nil
}

// rewrite returns doc with each region's text between its markers replaced.
func rewrite(doc string, regions map[string]string) (string, error) {
	names := make([]string, 0, len(regions))
	for n := range regions {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		begin, end := beginMarker(n), endMarker(n)
		i := strings.Index(doc, begin)
		j := strings.Index(doc, end)
		if i < 0 || j < i {
			return "", errors.New("actiondoc: docs/iam.md lacks the markers of region " + n)
		}
		doc = doc[:i+len(begin)] + "\n" + regions[n] + doc[j:]
	}
	return doc, nil
}
