package api_test

import (
	"encoding/json"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestAgentCommandsOfHeldKindsWait: once the tenant holds a kind back, an
// agent's commands.create, commands.fanout and commands.createInBatch of
// that kind answer CONFIRMATION_REQUIRED before the method runs, while a
// kind not held back goes on to the method (here the command is made);
// a kind its own tenant holds back holds its calls in a tenant below too.
func TestAgentCommandsOfHeldKindsWait(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1})
	node := e.Nodes[0].NodeID()
	post := func(key, method, body string, status int, code string) map[string]any {
		t.Helper()
		r := do(t, e, "POST", "/api/v1/"+method, key, nil, body)
		expectCode(t, r, status, code)
		var out map[string]any
		_ = json.Unmarshal(r.body, &out)
		return out
	}
	agent, _ := post(e.AdminKey, "identities.create", `{"name":"kinds-agent","kind":"agent","for":"admin"}`, 200, "")["id"].(string)
	post(e.AdminKey, "bindings.create", `{"identity_id":"`+agent+`","role_id":"admin"}`, 200, "")
	key, _ := post(e.AdminKey, "apiKeys.create", `{"identity_id":"`+agent+`","name":"kinds-agent"}`, 200, "")["key"].(string)
	post(e.AdminKey, "approvals.setKinds", `{"kinds":["node.ping"]}`, 200, "")
	post(key, "commands.create", `{"node_id":"`+node+`","kind":"node.ping"}`, 409, "CONFIRMATION_REQUIRED")
	post(key, "commands.fanout", `{"node_ids":["`+node+`"],"kind":"node.ping"}`, 409, "CONFIRMATION_REQUIRED")
	post(key, "commands.createInBatch", `{"node_id":"`+node+`","kind":"node.ping","batch_id":"bat_none"}`, 409, "CONFIRMATION_REQUIRED")
	post(key, "commands.create", `{"node_id":"`+node+`","kind":"diag.run"}`, 200, "")
	// Acting in a tenant below its own, which holds nothing back, the
	// agent is still held by its own tenant's list.
	child, _ := post(e.AdminKey, "tenants.create", `{"name":"kinds-child"}`, 200, "")["id"].(string)
	post(key, "commands.fanout", `{"tenant_id":"`+child+`","labels":{"none":"x"},"kind":"node.ping"}`, 409, "CONFIRMATION_REQUIRED")
}
