package cli_test

import (
	"encoding/json"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestListJSONIsOneShape: every list command's --json prints the API's
// shape, {"<plural>": [...]}, an array even when empty (nodes list and
// batch list printed a bare array before).
func TestListJSONIsOneShape(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1})
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	t.Setenv("BC_API_KEY_FILE", "")
	for _, c := range []struct {
		args []string
		key  string
		min  int
	}{
		{[]string{"nodes", "list", "--json"}, "nodes", 1},
		{[]string{"batch", "list", "--json"}, "batches", 0},
		{[]string{"commands", "list", "--json"}, "commands", 0},
		{[]string{"tenants", "list", "--json"}, "tenants", 1},
		{[]string{"identities", "list", "--json"}, "identities", 1},
		{[]string{"roles", "list", "--json"}, "roles", 3},
		{[]string{"bindings", "list", "--json"}, "bindings", 1},
		{[]string{"api-keys", "list", "--json"}, "api_keys", 1},
		{[]string{"secrets", "list", "--json"}, "secrets", 0},
		{[]string{"revocations", "list", "--json"}, "revocations", 0},
		{[]string{"bastions", "list", "--json"}, "bastions", 0},
	} {
		code, out, errOut := run(t, c.args...)
		var m map[string]json.RawMessage
		if code != 0 || json.Unmarshal([]byte(out), &m) != nil || len(m) != 1 {
			t.Errorf("%v: exit %d: %s%s", c.args, code, out, errOut)
			continue
		}
		var rows []json.RawMessage
		if err := json.Unmarshal(m[c.key], &rows); err != nil || rows == nil || len(rows) < c.min {
			t.Errorf("%v: %q is not an array of at least %d: %s", c.args, c.key, c.min, out)
		}
	}
}
