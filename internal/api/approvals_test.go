package api_test

import (
	"encoding/json"
	"regexp"
	"testing"

	"github.com/bettercompute/bettercompute/internal/testenv"
)

var heldRE = regexp.MustCompile(`^request (ap_[A-Za-z0-9_-]+) waits`)

// heldForAdmin makes, through the API, an agent acting for the root
// admin (bound to admin, with a key) and two of its held-back requests
// (batches of node that differ in lifetime), for the walk of every
// mutation: it returns the agent and the two requests' ids.
func heldForAdmin(t *testing.T, e *testenv.Env, node string) (agent, first, second string) {
	t.Helper()
	post := func(key, method, body string) map[string]any {
		t.Helper()
		r := do(t, e, "POST", "/api/v1/"+method, key, nil, body)
		expectCode(t, r, 200, "")
		var out map[string]any
		_ = json.Unmarshal(r.body, &out)
		return out
	}
	agent, _ = post(e.AdminKey, "identities.create", `{"name":"walk-agent","kind":"agent","for":"admin"}`)["id"].(string)
	post(e.AdminKey, "bindings.create", `{"identity_id":"`+agent+`","role_id":"admin"}`)
	key, _ := post(e.AdminKey, "apiKeys.create", `{"identity_id":"`+agent+`","name":"walk-agent"}`)["key"].(string)
	held := func(seconds string) string {
		t.Helper()
		r := do(t, e, "POST", "/api/v1/batches.create", key, nil, `{"leaves":[{"node_id":"`+node+`","kind":"node.reboot"}],"expires_seconds":`+seconds+`}`)
		expectCode(t, r, 409, "CONFIRMATION_REQUIRED")
		m := heldRE.FindStringSubmatch(r.message())
		if m == nil {
			t.Fatalf("no request id in %q", r.message())
		}
		return m[1]
	}
	return agent, held("3600"), held("7200")
}
