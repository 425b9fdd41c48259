package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// listKey is the member a list method's answer holds its array in: the
// service's name in snake case (apiKeys.list: "api_keys").
func listKey(method string) string {
	svc, _, _ := strings.Cut(method, ".")
	if svc == "audit" {
		return "events" // the audit log's list is of events
	}
	var b strings.Builder
	for _, r := range svc {
		if unicode.IsUpper(r) {
			b.WriteByte('_')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// takesTenant reports whether a method's input has a tenant_id member.
func takesTenant(in reflect.Type) bool {
	if in == nil || in.Kind() != reflect.Struct {
		return false
	}
	for _, f := range reflect.VisibleFields(in) {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name == "tenant_id" {
			return true
		}
	}
	return false
}

var timestampRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

// checkTimes fails for every *_at string member of v that is not RFC 3339
// in UTC with milliseconds, and counts those that are.
func checkTimes(t *testing.T, where string, v any, n *int) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && strings.HasSuffix(k, "_at") {
				if !timestampRE.MatchString(s) {
					t.Errorf("%s: %s = %q, want RFC 3339 UTC with milliseconds", where, k, s)
				}
				*n++
			}
			checkTimes(t, where, e, n)
		}
	case []any:
		for _, e := range x {
			checkTimes(t, where, e, n)
		}
	}
}

// TestListsAndTimesHaveOneShape: every list method of the API (found in
// the registered method table, so a new one is checked too) answers
// {"<plural>": [...]}, an array even when empty (in a new tenant), and
// every *_at timestamp of those answers and of the gets is RFC 3339 in UTC
// with milliseconds.
func TestListsAndTimesHaveOneShape(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		cm, err := e.Client.CreateCommand(ctx, e.Nodes[0].NodeID(), "diag.run", nil)
		if err != nil {
			t.Fatal(err)
		}
		e.WaitCommand(t, cm.ID)
		bt := mustBatch(t, e, leavesFor("disk.wipe", nil, false, e.Nodes[0].NodeID()))
		child, _ := e.TenantAdmin(t, "shapes")
		fresh, err := e.Client.CreateTenant(ctx, child, "empty")
		if err != nil {
			t.Fatal(err)
		}
		stamps, lists := 0, 0
		for _, m := range e.CP.API.Methods() {
			if !strings.HasSuffix(m.Name, ".list") {
				continue
			}
			lists++
			for _, tenant := range []string{"", fresh.ID} {
				in := map[string]any{}
				if takesTenant(m.Input()) {
					in["tenant_id"] = tenant
				} else if tenant != "" {
					continue
				}
				var raw json.RawMessage
				if err := e.Client.Call(ctx, m.Name, in, &raw); err != nil {
					t.Errorf("%s in %q: %v", m.Name, tenant, err)
					continue
				}
				var out map[string]any
				dec := json.NewDecoder(bytes.NewReader(raw))
				dec.UseNumber()
				if err := dec.Decode(&out); err != nil {
					t.Fatalf("%s: %v", m.Name, err)
				}
				if _, isArray := out[listKey(m.Name)].([]any); len(out) != 1 || !isArray {
					t.Errorf("%s in %q answers %s, want {%q: [...]}", m.Name, tenant, raw, listKey(m.Name))
				}
				checkTimes(t, m.Name, out, &stamps)
			}
		}
		for _, get := range []struct{ method, id string }{{"commands.get", cm.ID}, {"batches.get", bt.ID}, {"nodes.get", e.Nodes[0].NodeID()}} {
			var out map[string]any
			if err := e.Client.Call(ctx, get.method, map[string]any{"id": get.id}, &out); err != nil {
				t.Fatalf("%s: %v", get.method, err)
			}
			checkTimes(t, get.method, out, &stamps)
		}
		if lists < 10 || stamps < 10 {
			t.Fatalf("checked %d lists and %d timestamps: the test checks nothing", lists, stamps)
		}
	})
}
