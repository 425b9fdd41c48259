package commands

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// FuzzCheckCreate: no input makes admission panic, and whatever it admits
// keeps the queue's invariants: a known kind of the creating module that
// the node's role runs, on a node visible in the scope, a valid JSON
// payload of at most MaxPayload, a TTL in (0, MaxTTL], and no secret
// reference in a module's command.
func FuzzCheckCreate(f *testing.F) {
	f.Add("diag.run", "", []byte(`{"x":1}`), int64(0), "acme", "acme", "node", true)
	f.Add("sandbox.exec", "sandboxes", []byte(`{"argv":["secret://root/x"]}`), int64(time.Hour), iam.RootTenant, "acme", "node", true)
	f.Add("secret.digest", "", []byte(`{"ref":"secret://acme/db"}`), int64(-1), "other", "acme", "ramdisk", true)
	f.Fuzz(func(t *testing.T, kind, module string, payload []byte, ttl int64, scope, tenant, role string, found bool) {
		node := nodes.TenantRole{Tenant: tenant, Role: role}
		plan, err := checkCreate(createRequest{scope: iam.ScopeOf(scope), module: module, kind: kind, payload: payload, ttl: time.Duration(ttl)}, node, found)
		if err != nil {
			return
		}
		switch {
		case !kinds.Known(kind) || kinds.Owner(kind) != module:
			t.Fatalf("admitted kind %q for module %q", kind, module)
		case !kinds.AllowedForRole(role, kind):
			t.Fatalf("admitted kind %q on role %q", kind, role)
		case !found || !iam.ScopeOf(scope).Sees(tenant) || plan.tenant != tenant:
			t.Fatalf("admitted a node of %q (found %v) for scope %q as %q", tenant, found, scope, plan.tenant)
		case len(plan.payload) > MaxPayload || !json.Valid(plan.payload):
			t.Fatalf("admitted payload %q", plan.payload)
		case plan.ttl <= 0 || plan.ttl > MaxTTL:
			t.Fatalf("admitted ttl %v", plan.ttl)
		case module != "" && len(plan.refs) > 0:
			t.Fatalf("module command admitted with references %q", plan.refs)
		}
	})
}

// FuzzCheckUpdate: no bytes make the update check panic, and an accepted
// update names the session's node and a state a node may report.
func FuzzCheckUpdate(f *testing.F) {
	for _, b := range []*nodev1.UpdateBody{
		{CommandId: "c1", NodeId: "n1", State: "running"},
		{CommandId: "c1", NodeId: "n1", State: "succeeded", Result: []byte(`{"ok":true}`)},
		{CommandId: "c1", NodeId: "n2", State: "queued"},
	} {
		raw, err := proto.Marshal(b)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, "n1")
	}
	f.Fuzz(func(t *testing.T, raw []byte, nodeID string) {
		body, err := checkUpdate(nodeID, &nodev1.CommandUpdate{Body: raw})
		if err != nil {
			return
		}
		if body.NodeId != nodeID || !reportable(wire.State(body.State)) {
			t.Fatalf("accepted %v for node %q", body, nodeID)
		}
	})
}

// FuzzAttest: for any update body, a signature by the node's key attests
// exactly when the body names the command row (id, node, kind, payload
// digest), and the same update with its signature altered never does.
func FuzzAttest(f *testing.F) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	fx := newAttestFixture(f, key)
	sum := fx.rows["c1"].payloadSHA
	for _, b := range []*nodev1.UpdateBody{
		{CommandId: "c1", NodeId: "n1", Kind: kinds.DiagRun, PayloadSha256: sum[:], State: "succeeded"},
		{CommandId: "c1", NodeId: "n1", Kind: kinds.NodePing, PayloadSha256: sum[:], State: "failed"},
		{CommandId: "c2", NodeId: "n1", Kind: kinds.DiagRun, State: "running"},
	} {
		raw, err := proto.Marshal(b)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, uint(0))
	}
	f.Fuzz(func(t *testing.T, raw []byte, flip uint) {
		var body nodev1.UpdateBody
		if proto.Unmarshal(raw, &body) != nil {
			return
		}
		sig, err := wire.SignNode(key, wire.UpdateSigContext, raw)
		if err != nil {
			t.Fatal(err)
		}
		upd := &nodev1.CommandUpdate{Body: raw, NodeSig: sig, CertSerial: "s1"}
		row, ok := fx.rows[body.CommandId]
		names := ok && row.nodeID == "n1" && body.Kind == row.kind && bytes.Equal(body.PayloadSha256, row.payloadSHA[:])
		if got, why := attest(fx.states, fx.rows, fx.now, "n1", upd, &body); got != names {
			t.Fatalf("attested %v (%s), body names the row: %v", got, why, names)
		}
		bad := bytes.Clone(sig)
		bad[int(flip%uint(len(bad)))] ^= 1 << (flip % 8)
		upd.NodeSig = bad
		if got, _ := attest(fx.states, fx.rows, fx.now, "n1", upd, &body); got {
			t.Fatal("an altered signature attested")
		}
	})
}

// FuzzUpdateRounds: rounds keep every update once, in arrival order, at
// most size to a round and no command twice in one.
func FuzzUpdateRounds(f *testing.F) {
	f.Add("a,b,a,c", 2)
	f.Add("a,a,a", 10)
	f.Fuzz(func(t *testing.T, list string, size int) {
		if size <= 0 || size > 1000 {
			return
		}
		var todo []updateTodo
		for i, id := range strings.Split(list, ",") {
			todo = append(todo, updateTodo{i: i, body: &nodev1.UpdateBody{CommandId: id}})
		}
		next := 0
		for _, r := range updateRounds(todo, size) {
			if len(r) == 0 || len(r) > size {
				t.Fatalf("round of %d (size %d)", len(r), size)
			}
			seen := map[string]bool{}
			for _, u := range r {
				if u.i != next || seen[u.body.CommandId] {
					t.Fatalf("update %d out of order or repeated in its round", u.i)
				}
				seen[u.body.CommandId] = true
				next++
			}
		}
		if next != len(todo) {
			t.Fatalf("%d of %d updates in rounds", next, len(todo))
		}
	})
}
