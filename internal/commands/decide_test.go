package commands

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// refusal is what a test expects of an error: its code and the start of
// its message ("" code: no error).
type refusal struct {
	code   errs.Code
	prefix string
}

func (r refusal) check(t *testing.T, name string, err error) {
	t.Helper()
	switch {
	case r.code == "" && err != nil:
		t.Errorf("%s: refused %v, want admitted", name, err)
	case r.code != "" && err == nil:
		t.Errorf("%s: admitted, want %s %q", name, r.code, r.prefix)
	case r.code != "" && (errs.CodeOf(err) != r.code || !strings.HasPrefix(errs.SafeMessage(err), r.prefix)):
		t.Errorf("%s: refused %s %q, want %s %q", name, errs.CodeOf(err), errs.SafeMessage(err), r.code, r.prefix)
	}
}

// TestCheckCreate: a single command's admission, refusal by refusal, in
// the documented order, and what an admitted one stores.
func TestCheckCreate(t *testing.T) {
	acme := iam.ScopeOf("acme")
	node := nodes.TenantRole{Tenant: "acme", Role: pki.RoleNode}
	site := nodes.TenantRole{Tenant: "acme", Role: pki.RoleSite}
	big := json.RawMessage(`"` + strings.Repeat("a", MaxPayload) + `"`)
	for _, c := range []struct {
		name  string
		req   createRequest
		node  nodes.TenantRole
		found bool
		want  refusal
	}{
		{"admitted", createRequest{scope: acme, kind: kinds.DiagRun}, node, true, refusal{}},
		{"unknown kind", createRequest{scope: acme, kind: "nope"}, node, true, refusal{errs.InvalidInput, "kind: unknown"}},
		{"module kind on generic path", createRequest{scope: acme, kind: kinds.SandboxExec}, node, true, refusal{errs.InvalidInput, ReasonKindOwned}},
		{"generic kind from a module", createRequest{scope: acme, module: kinds.ModuleSandboxes, kind: kinds.DiagRun}, node, true, refusal{errs.InvalidInput, "kind: diag.run is not a kind of"}},
		{"module's own kind", createRequest{scope: acme, module: kinds.ModuleSandboxes, kind: kinds.SandboxExec}, node, true, refusal{}},
		{"payload too large", createRequest{scope: acme, kind: kinds.DiagRun, payload: big}, node, true, refusal{errs.PayloadTooLarge, "payload: larger"}},
		{"payload not JSON", createRequest{scope: acme, kind: kinds.DiagRun, payload: json.RawMessage(`{`)}, node, true, refusal{errs.InvalidInput, "payload: not valid JSON"}},
		{"ttl too long", createRequest{scope: acme, kind: kinds.DiagRun, ttl: MaxTTL + time.Second}, node, true, refusal{errs.InvalidInput, "ttl: at most"}},
		{"payload before node", createRequest{scope: acme, kind: kinds.DiagRun, payload: json.RawMessage(`[`)}, node, false, refusal{errs.InvalidInput, "payload"}},
		{"no such node", createRequest{scope: acme, kind: kinds.DiagRun}, node, false, refusal{errs.NotFound, "node not found"}},
		{"another tenant's node", createRequest{scope: iam.ScopeOf("other"), kind: kinds.DiagRun}, node, true, refusal{errs.NotFound, "node not found"}},
		{"zero scope", createRequest{kind: kinds.DiagRun}, node, true, refusal{errs.NotFound, "node not found"}},
		{"root sees every node", createRequest{scope: iam.RootScope(), kind: kinds.DiagRun}, node, true, refusal{}},
		{"role does not run kind", createRequest{scope: acme, kind: kinds.DiagRun}, site, true, refusal{errs.InvalidInput, ReasonKindNotAllowedForRole}},
		{"module command with a reference", createRequest{scope: acme, module: kinds.ModuleSandboxes, kind: kinds.SandboxExec,
			payload: json.RawMessage(`{"argv":["secret://acme/x"]}`)}, node, true, refusal{errs.InvalidInput, "payload: secret references are not allowed"}},
		{"subject command with a reference", createRequest{scope: acme, module: kinds.ModuleSandboxes, kind: kinds.SandboxCreate, subject: "tabc",
			payload: json.RawMessage(`{"env":{"A":"secret://tabc/x"}}`)}, node, true, refusal{}},
		{"subject on an exec", createRequest{scope: acme, module: kinds.ModuleSandboxes, kind: kinds.SandboxExec, subject: "tabc",
			payload: json.RawMessage(`{"env_refs":["secret://tabc/x"]}`)}, node, true, refusal{}},
		{"subject on a delete", createRequest{scope: acme, module: kinds.ModuleSandboxes, kind: kinds.SandboxDelete, subject: "tabc",
			payload: json.RawMessage(`{"sandbox_id":"x"}`)}, node, true, refusal{errs.InvalidInput, ReasonSubjectNotAllowed}},
		{"subject on the generic path", createRequest{scope: acme, kind: kinds.SecretDigest, subject: "tabc"}, node, true, refusal{errs.InvalidInput, ReasonSubjectNotAllowed}},
		{"generic command with a reference", createRequest{scope: acme, kind: kinds.SecretDigest, payload: json.RawMessage(`{"ref":"secret://acme/x"}`)}, node, true, refusal{}},
	} {
		plan, err := checkCreate(c.req, c.node, c.found)
		c.want.check(t, c.name, err)
		if err != nil {
			continue
		}
		if plan.tenant != c.node.Tenant || !json.Valid(plan.payload) || plan.ttl <= 0 || plan.ttl > MaxTTL {
			t.Errorf("%s: plan %+v", c.name, plan)
		}
	}
	plan, err := checkCreate(createRequest{scope: acme, kind: kinds.SecretDigest, payload: json.RawMessage(`{"ref":"secret://acme/x"}`)}, node, true)
	if err != nil || !slices.Equal(plan.refs, []string{"secret://acme/x"}) || plan.ttl != DefaultTTL {
		t.Errorf("refs %q ttl %v (%v), want the reference and the default TTL", plan.refs, plan.ttl, err)
	}
	plan, err = checkCreate(createRequest{scope: acme, kind: kinds.DiagRun, ttl: time.Hour}, node, true)
	if err != nil || string(plan.payload) != "{}" || plan.ttl != time.Hour {
		t.Errorf("empty payload %q ttl %v (%v), want {} and 1h", plan.payload, plan.ttl, err)
	}
}

// TestCheckFanout: what a fan-out is refused for before its nodes are
// read, with the fan-out's own messages.
func TestCheckFanout(t *testing.T) {
	big := json.RawMessage(`"` + strings.Repeat("a", MaxPayload) + `"`)
	for _, c := range []struct {
		name    string
		kind    string
		n       int
		payload json.RawMessage
		ttl     time.Duration
		want    refusal
	}{
		{"admitted", kinds.DiagRun, 3, nil, 0, refusal{}},
		{"module kind", kinds.SandboxCreate, 3, nil, 0, refusal{errs.InvalidInput, ReasonKindOwned}},
		{"kind before count", "nope", 0, nil, 0, refusal{errs.InvalidInput, "kind: unknown"}},
		{"no node", kinds.DiagRun, 0, nil, 0, refusal{errs.InvalidInput, "node_ids: between 1 and 10000"}},
		{"too many nodes", kinds.DiagRun, MaxFanout + 1, nil, 0, refusal{errs.InvalidInput, "node_ids: between 1 and 10000"}},
		{"payload too large", kinds.DiagRun, 1, big, 0, refusal{errs.InvalidInput, "payload: valid JSON of at most 64 KiB"}},
		{"payload not JSON", kinds.DiagRun, 1, json.RawMessage(`{`), 0, refusal{errs.InvalidInput, "payload: valid JSON of at most 64 KiB"}},
		{"ttl too long", kinds.DiagRun, 1, nil, 25 * time.Hour, refusal{errs.InvalidInput, "ttl: at most 24 hours"}},
	} {
		_, err := checkFanout(c.kind, c.n, c.payload, c.ttl)
		c.want.check(t, c.name, err)
	}
}

// TestCheckFanoutNodes: nodes are checked in order, a node named twice
// gets one target, and the tenants whose references are checked are
// those of the nodes before the first refused one.
func TestCheckFanoutNodes(t *testing.T) {
	records := map[string]nodes.TenantRole{
		"n1": {Tenant: "acme", Role: pki.RoleNode},
		"n2": {Tenant: "beta", Role: pki.RoleNode},
		"n3": {Tenant: "acme", Role: pki.RoleNode},
		"s1": {Tenant: "beta", Role: pki.RoleSite},
	}
	targets, tenants, err := checkFanoutNodes(iam.RootScope(), kinds.DiagRun, []string{"n1", "n2", "n1", "n3"}, records)
	if err != nil || len(targets) != 3 || targets[0] != (fanoutTarget{"n1", "acme"}) || targets[2] != (fanoutTarget{"n3", "acme"}) ||
		!slices.Equal(tenants, []string{"acme", "beta"}) {
		t.Errorf("root fan-out: %v %v %v", targets, tenants, err)
	}
	for _, c := range []struct {
		name    string
		scope   iam.Scope
		ids     []string
		tenants []string
		want    refusal
	}{
		{"other tenant's node", iam.ScopeOf("acme"), []string{"n1", "n2"}, []string{"acme"}, refusal{errs.AccessDenied, "compute:commands:create on node n2 is not allowed: it does not exist or it is outside your tenant acme; check the id with better-compute nodes list"}},
		{"unknown node", iam.ScopeOf("acme"), []string{"n1", "n9", "n3"}, []string{"acme"}, refusal{errs.AccessDenied, "compute:commands:create on node n9 is not allowed: it does not exist or it is outside your tenant acme; check the id with better-compute nodes list"}},
		{"first node refused", iam.ScopeOf("beta"), []string{"n1"}, nil, refusal{errs.AccessDenied, "compute:commands:create on node n1 is not allowed: it does not exist or it is outside your tenant beta; check the id with better-compute nodes list"}},
		{"role", iam.RootScope(), []string{"n1", "n2", "s1"}, []string{"acme", "beta"}, refusal{errs.InvalidInput, ReasonKindNotAllowedForRole}},
		{"own nodes", iam.ScopeOf("acme"), []string{"n3", "n1"}, []string{"acme"}, refusal{}},
	} {
		targets, tenants, err := checkFanoutNodes(c.scope, kinds.DiagRun, c.ids, records)
		c.want.check(t, c.name, err)
		if !slices.Equal(tenants, c.tenants) {
			t.Errorf("%s: tenants checked %q, want %q", c.name, tenants, c.tenants)
		}
		if err != nil && targets != nil {
			t.Errorf("%s: refused with targets %v", c.name, targets)
		}
	}
}

// mustUpdate is an update whose body is b, unsigned.
func mustUpdate(t testing.TB, b *nodev1.UpdateBody) *nodev1.CommandUpdate {
	t.Helper()
	raw, err := proto.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return &nodev1.CommandUpdate{Body: raw}
}

// TestCheckUpdate: a node reports running or a terminal state about
// itself; anything else is refused, naming the command when the body
// parsed.
func TestCheckUpdate(t *testing.T) {
	for _, c := range []struct {
		name string
		upd  *nodev1.CommandUpdate
		want refusal
		id   string
	}{
		{"running", mustUpdate(t, &nodev1.UpdateBody{CommandId: "c1", NodeId: "n1", State: "running"}), refusal{}, "c1"},
		{"succeeded", mustUpdate(t, &nodev1.UpdateBody{CommandId: "c1", NodeId: "n1", State: "succeeded"}), refusal{}, "c1"},
		{"cancelled", mustUpdate(t, &nodev1.UpdateBody{CommandId: "c1", NodeId: "n1", State: "cancelled"}), refusal{}, "c1"},
		{"queued", mustUpdate(t, &nodev1.UpdateBody{CommandId: "c1", NodeId: "n1", State: "queued"}), refusal{errs.InvalidInput, "update state is not valid"}, "c1"},
		{"sent", mustUpdate(t, &nodev1.UpdateBody{CommandId: "c1", NodeId: "n1", State: "sent"}), refusal{errs.InvalidInput, "update state is not valid"}, "c1"},
		{"no state", mustUpdate(t, &nodev1.UpdateBody{CommandId: "c1", NodeId: "n1"}), refusal{errs.InvalidInput, "update state is not valid"}, "c1"},
		{"another node", mustUpdate(t, &nodev1.UpdateBody{CommandId: "c1", NodeId: "n2", State: "running"}), refusal{errs.AccessDenied, "update names another node"}, "c1"},
		{"garbage", &nodev1.CommandUpdate{Body: []byte{0xff, 0xff}}, refusal{errs.InvalidInput, "update body does not parse"}, ""},
		{"nil", nil, refusal{errs.AccessDenied, "update names another node"}, ""},
	} {
		body, err := checkUpdate("n1", c.upd)
		c.want.check(t, c.name, err)
		if got := body.GetCommandId(); got != c.id {
			t.Errorf("%s: names command %q, want %q", c.name, got, c.id)
		}
	}
}

// TestTerminalStates: the states the update statement never overwrites
// are exactly the terminal ones, and reportable is running or terminal.
func TestTerminalStates(t *testing.T) {
	all := []wire.State{StateQueued, StateSent, StateRunning, StateSucceeded, StateFailed, StateCancelled}
	for _, s := range all {
		if slices.Contains(terminalStates(), s) != s.Terminal() {
			t.Errorf("%s: in terminalStates %v, Terminal %v", s, slices.Contains(terminalStates(), s), s.Terminal())
		}
		if reportable(s) != (s == StateRunning || s.Terminal()) {
			t.Errorf("%s: reportable %v", s, reportable(s))
		}
	}
	if len(terminalStates()) != 3 || reportable("bogus") || reportable("") {
		t.Error("terminal states or reportable accept too much")
	}
}

// TestUpdateRounds: rounds keep arrival order, hold at most size updates
// and never name a command twice.
func TestUpdateRounds(t *testing.T) {
	mk := func(ids ...string) []updateTodo {
		var out []updateTodo
		for i, id := range ids {
			out = append(out, updateTodo{i: i, body: &nodev1.UpdateBody{CommandId: id}})
		}
		return out
	}
	show := func(rs [][]updateTodo) string {
		var parts []string
		for _, r := range rs {
			var ids []string
			for _, t := range r {
				ids = append(ids, t.body.CommandId)
			}
			parts = append(parts, strings.Join(ids, ","))
		}
		return strings.Join(parts, "|")
	}
	for _, c := range []struct {
		ids  []string
		size int
		want string
	}{
		{nil, 3, ""},
		{[]string{"a", "b", "c"}, 3, "a,b,c"},
		{[]string{"a", "b", "c", "d"}, 3, "a,b,c|d"},
		{[]string{"a", "a", "b"}, 3, "a|a,b"},
		{[]string{"a", "b", "a", "c", "b"}, 10, "a,b|a,c,b"},
		{[]string{"a", "b", "c"}, 1, "a|b|c"},
	} {
		if got := show(updateRounds(mk(c.ids...), c.size)); got != c.want {
			t.Errorf("%q size %d: %q, want %q", c.ids, c.size, got, c.want)
		}
	}
}

// attestFixture is a node key, its certificate record and a command row
// an update can report on.
type attestFixture struct {
	key     crypto.Signer
	states  map[string]nodes.CertState
	rows    map[string]binding
	now     time.Time
	payload []byte
}

func newAttestFixture(t testing.TB, key crypto.Signer) attestFixture {
	t.Helper()
	now := time.Unix(1_800_000_000, 0)
	payload := []byte(`{"x":1}`)
	return attestFixture{
		key: key,
		now: now,
		states: map[string]nodes.CertState{
			"s1": {Serial: "s1", NodeID: "n1", Role: pki.RoleNode, NotAfter: now.Add(time.Hour), Cert: &x509.Certificate{PublicKey: key.Public()}},
		},
		rows:    map[string]binding{"c1": {nodeID: "n1", kind: kinds.DiagRun, payloadSHA: sha256.Sum256(payload)}},
		payload: payload,
	}
}

// signed is a signed update of body under serial.
func (f attestFixture) signed(t testing.TB, body *nodev1.UpdateBody, serial string) *nodev1.CommandUpdate {
	t.Helper()
	upd := mustUpdate(t, body)
	sig, err := wire.SignNode(f.key, wire.UpdateSigContext, upd.Body)
	if err != nil {
		t.Fatal(err)
	}
	upd.NodeSig, upd.CertSerial = sig, serial
	return upd
}

// TestAttest: a signed update attests only with a live certificate of
// its node that may attest, and only for the command row it names, for
// ECDSA and Ed25519 node keys alike.
func TestAttest(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for keyName, key := range map[string]crypto.Signer{"ecdsa": ec, "ed25519": ed} {
		f := newAttestFixture(t, key)
		sum := f.rows["c1"].payloadSHA
		good := &nodev1.UpdateBody{CommandId: "c1", NodeId: "n1", Kind: kinds.DiagRun, PayloadSha256: sum[:], State: "succeeded"}
		with := func(change func(b *nodev1.UpdateBody)) *nodev1.UpdateBody {
			b := proto.Clone(good).(*nodev1.UpdateBody)
			change(b)
			return b
		}
		state := func(change func(st *nodes.CertState)) map[string]nodes.CertState {
			st := f.states["s1"]
			change(&st)
			return map[string]nodes.CertState{"s1": st}
		}
		tampered := f.signed(t, good, "s1")
		tampered.NodeSig = slices.Clone(tampered.NodeSig)
		tampered.NodeSig[len(tampered.NodeSig)-1] ^= 1
		for _, c := range []struct {
			name   string
			states map[string]nodes.CertState
			upd    *nodev1.CommandUpdate
			body   *nodev1.UpdateBody
			nodeID string
			now    time.Time
			why    string
		}{
			{"attested", f.states, f.signed(t, good, "s1"), good, "n1", f.now, ""},
			{"within grace", f.states, f.signed(t, good, "s1"), good, "n1", f.now.Add(time.Hour + AttestGrace), ""},
			{"past grace", f.states, f.signed(t, good, "s1"), good, "n1", f.now.Add(time.Hour + AttestGrace + time.Millisecond), "cert-expired"},
			{"unknown command", f.states, f.signed(t, good, "s1"), with(func(b *nodev1.UpdateBody) { b.CommandId = "c9" }), "n1", f.now, "command-unknown"},
			{"another node's command", f.states, f.signed(t, good, "s1"), good, "n2", f.now, "command-unknown"},
			{"kind", f.states, f.signed(t, good, "s1"), with(func(b *nodev1.UpdateBody) { b.Kind = kinds.NodePing }), "n1", f.now, "kind-mismatch"},
			{"payload", f.states, f.signed(t, good, "s1"), with(func(b *nodev1.UpdateBody) { b.PayloadSha256 = make([]byte, 32) }), "n1", f.now, "payload-mismatch"},
			{"unknown cert", f.states, f.signed(t, good, "s9"), good, "n1", f.now, "cert-unknown"},
			{"other node's cert", state(func(st *nodes.CertState) { st.NodeID = "n2" }), f.signed(t, good, "s1"), good, "n1", f.now, "cert-other-node"},
			{"revoked", state(func(st *nodes.CertState) { st.Revoked = true }), f.signed(t, good, "s1"), good, "n1", f.now, "cert-revoked"},
			{"node-tenant", state(func(st *nodes.CertState) { st.Role = pki.RoleNodeTenant }), f.signed(t, good, "s1"), good, "n1", f.now, "node-tenant"},
			{"no certificate", state(func(st *nodes.CertState) { st.Cert = nil }), f.signed(t, good, "s1"), good, "n1", f.now, "bad-signature"},
			{"tampered signature", f.states, tampered, good, "n1", f.now, "bad-signature"},
			{"other context", f.states, func() *nodev1.CommandUpdate {
				u := mustUpdate(t, good)
				u.NodeSig, _ = wire.SignNode(key, wire.SandboxReportSigContext, u.Body)
				u.CertSerial = "s1"
				return u
			}(), good, "n1", f.now, "bad-signature"},
		} {
			ok, why := attest(c.states, f.rows, c.now, c.nodeID, c.upd, c.body)
			if ok != (c.why == "") || why != c.why {
				t.Errorf("%s %s: attested %v (%q), want %q", keyName, c.name, ok, why, c.why)
			}
		}
	}
}

// TestDisallowed: the commands cancelled at Hello are those the role or
// the certificate's allowed list does not permit.
func TestDisallowed(t *testing.T) {
	cs := []idKind{{"c1", kinds.DiagRun}, {"c2", kinds.DiskWipe}, {"c3", kinds.NodePing}}
	if got := disallowed(pki.RoleNode, nil, cs); got != nil {
		t.Errorf("node, no narrowing: %q", got)
	}
	if got := disallowed(pki.RoleSite, nil, cs); !slices.Equal(got, []string{"c1", "c2"}) {
		t.Errorf("site: %q", got)
	}
	if got := disallowed(pki.RoleNode, []string{kinds.NodePing}, cs); !slices.Equal(got, []string{"c1", "c2"}) {
		t.Errorf("node narrowed to ping: %q", got)
	}
}

// TestFilterNormalized: the list limit defaults to 100 and is at most
// 1000.
func TestFilterNormalized(t *testing.T) {
	for in, want := range map[int]int{0: 100, -1: 100, 1: 1, 1000: 1000, 1001: 100} {
		if got := (Filter{Limit: in}).normalized().Limit; got != want {
			t.Errorf("limit %d: %d, want %d", in, got, want)
		}
	}
}
