package commands

import (
	"bytes"
	"encoding/json"
	"fmt"
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

// The pure decisions of the module: no database, no clock, no bus. A
// method reads what a decision needs, calls it, then writes what it
// decided; each decision has table tests and a fuzz target.

// Bounds of a command's time to live.
const (
	DefaultTTL = 10 * time.Minute
	MaxTTL     = 24 * time.Hour
)

// createRequest is one command to create, as the caller gave it.
type createRequest struct {
	scope   iam.Scope // the actor's tenant: who may address the node
	module  string    // the module creating it ("" on the generic path)
	kind    string
	payload json.RawMessage
	ttl     time.Duration
	// subject is the tenant a module's command works for (CreateFor):
	// its secret references are checked against it.
	subject string
}

// ReasonSubjectNotAllowed refuses a subject tenant on any command but
// the sandboxes module's sandbox.create, sandbox.update and sandbox.exec
// (CreateFor).
const ReasonSubjectNotAllowed = "subject: only the sandboxes module's create, update and exec commands work for a subject tenant"

// createPlan is an admitted creation: the payload and TTL to store, the
// tenant the command belongs to (its node's), and the secret references
// still to check against that tenant.
type createPlan struct {
	tenant  string
	payload json.RawMessage
	ttl     time.Duration
	refs    []string
}

// checkPayload normalises and bounds a single command's payload: empty is
// {}, more than MaxPayload is PAYLOAD_TOO_LARGE, invalid JSON is
// INVALID_INPUT.
func checkPayload(payload json.RawMessage) (json.RawMessage, error) {
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	if len(payload) > MaxPayload {
		return nil, errs.New(errs.PayloadTooLarge, "payload: larger than 64 KiB")
	}
	if !json.Valid(payload) {
		return nil, errs.New(errs.InvalidInput, "payload: not valid JSON")
	}
	return payload, nil
}

// checkTTL defaults a zero or negative TTL to DefaultTTL and refuses one
// over MaxTTL.
func checkTTL(ttl time.Duration) (time.Duration, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if ttl > MaxTTL {
		return 0, errs.New(errs.InvalidInput, "ttl: at most 24 hours")
	}
	return ttl, nil
}

// checkTarget refuses a node that does not exist or is outside scope
// (NOT_FOUND, one answer for both) and a kind its role does not run.
func checkTarget(scope iam.Scope, node nodes.TenantRole, found bool, kind string) error {
	if !found || !scope.Sees(node.Tenant) {
		return errs.New(errs.NotFound, "node not found")
	}
	return checkRole(node.Role, kind)
}

// checkCreate decides a single command's creation against its node as
// read (found false: no such node), in the order the refusals are
// documented: kind, payload, TTL, node, role, secret references.
func checkCreate(r createRequest, node nodes.TenantRole, found bool) (createPlan, error) {
	if err := checkKind(r.kind, r.module); err != nil {
		return createPlan{}, err
	}
	if r.subject != "" && (r.module != kinds.ModuleSandboxes || (r.kind != kinds.SandboxCreate && r.kind != kinds.SandboxUpdate && r.kind != kinds.SandboxExec)) {
		return createPlan{}, errs.New(errs.InvalidInput, ReasonSubjectNotAllowed)
	}
	payload, err := checkPayload(r.payload)
	if err != nil {
		return createPlan{}, err
	}
	ttl, err := checkTTL(r.ttl)
	if err != nil {
		return createPlan{}, err
	}
	if err := checkTarget(r.scope, node, found, r.kind); err != nil {
		return createPlan{}, err
	}
	refs, err := SecretRefs(payload)
	if err != nil {
		return createPlan{}, errs.Wrap(errs.InvalidInput, "payload: not valid JSON", err)
	}
	if r.module != "" && r.subject == "" && len(refs) > 0 {
		// A module's commands carry its callers' strings (a sandbox's
		// argv, a template's env) on a host of the root tenant: checking
		// those references against the host's tenant would answer a
		// tenant whether a fleet secret exists, and a live command naming
		// one would bind it to the host. Only a command working for a
		// subject tenant (CreateFor: a sandbox's create or claim) takes
		// references, checked against that tenant; any other is refused,
		// one answer for all.
		return createPlan{}, errs.New(errs.InvalidInput, "payload: secret references are not allowed in this command")
	}
	return createPlan{tenant: node.Tenant, payload: payload, ttl: ttl, refs: refs}, nil
}

// fanoutPlan is an admitted fan-out before its nodes are read: the
// payload and TTL to store and the secret references it names.
type fanoutPlan struct {
	payload json.RawMessage
	ttl     time.Duration
	refs    []string
}

// checkFanout decides what a fan-out can be refused for before its nodes
// are read: kind, node count, payload, TTL, payload references.
func checkFanout(kind string, nodeCount int, payload json.RawMessage, ttl time.Duration) (fanoutPlan, error) {
	if err := checkKind(kind, ""); err != nil {
		return fanoutPlan{}, err
	}
	if nodeCount == 0 || nodeCount > MaxFanout {
		return fanoutPlan{}, errs.New(errs.InvalidInput, "node_ids: between 1 and 10000 nodes")
	}
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	if len(payload) > MaxPayload || !json.Valid(payload) {
		return fanoutPlan{}, errs.New(errs.InvalidInput, "payload: valid JSON of at most 64 KiB")
	}
	ttl, err := checkTTL(ttl)
	if err != nil {
		return fanoutPlan{}, err
	}
	refs, err := SecretRefs(payload)
	if err != nil {
		return fanoutPlan{}, errs.Wrap(errs.InvalidInput, "payload: not valid JSON", err)
	}
	return fanoutPlan{payload: payload, ttl: ttl, refs: refs}, nil
}

// fanoutTarget is one node a fan-out queues a command on.
type fanoutTarget struct{ nodeID, tenant string }

// checkFanoutNodes decides a fan-out's nodes, in the order given: each
// must exist and be visible in scope (ACCESS_DENIED otherwise, one answer
// for both) and its role must run kind. It returns the targets (each node
// once, in first-seen order), the distinct tenants of the nodes before the
// first refused one, in first-seen order (their secret references are
// checked before the refusal is answered, as a node-by-node walk would),
// and the refusal, nil when every node passes.
func checkFanoutNodes(scope iam.Scope, kind string, nodeIDs []string, records map[string]nodes.TenantRole) (targets []fanoutTarget, tenants []string, refusal error) {
	seenTenant := map[string]bool{}
	seenNode := map[string]bool{}
	for _, nodeID := range nodeIDs {
		r, ok := records[nodeID]
		if !ok || !scope.Sees(r.Tenant) {
			// One answer for a missing node and another tenant's: it names
			// only what the caller gave and its own tenant.
			return nil, tenants, errs.New(errs.AccessDenied, fmt.Sprintf(
				"compute:commands:create on node %s is not allowed: it does not exist or it is outside your tenant %s; check the id with better-compute nodes list", nodeID, scope.Tenant))
		}
		if err := checkRole(r.Role, kind); err != nil {
			return nil, tenants, err
		}
		if !seenTenant[r.Tenant] {
			seenTenant[r.Tenant] = true
			tenants = append(tenants, r.Tenant)
		}
		if !seenNode[nodeID] {
			seenNode[nodeID] = true
			targets = append(targets, fanoutTarget{nodeID: nodeID, tenant: r.Tenant})
		}
	}
	return targets, tenants, nil
}

// reportable reports whether a node may report st in an update: running,
// or a terminal state (queued and sent are the control plane's to set).
func reportable(st wire.State) bool {
	return st == wire.StateRunning || st.Terminal()
}

// checkUpdate decides whether an update received on nodeID's session may
// be recorded: its body parses, names nodeID, and reports a reportable
// state. The body is returned whenever it parsed, so the refusal can name
// its command.
func checkUpdate(nodeID string, upd *nodev1.CommandUpdate) (*nodev1.UpdateBody, error) {
	var body nodev1.UpdateBody
	if err := proto.Unmarshal(upd.GetBody(), &body); err != nil {
		return nil, errs.Wrap(errs.InvalidInput, "update body does not parse", err)
	}
	if body.NodeId != nodeID {
		return &body, errs.New(errs.AccessDenied, "update names another node")
	}
	if !reportable(wire.State(body.State)) {
		return &body, errs.New(errs.InvalidInput, "update state is not valid")
	}
	return &body, nil
}

// updateTodo is an update of a batch that passed checkUpdate: its item's
// index, its parsed body, and whether its signature attests it.
type updateTodo struct {
	i        int
	body     *nodev1.UpdateBody
	attested int
}

// updateRounds splits todo, in order, into rounds of at most size updates
// in which no command appears twice (one UPDATE … FROM applies one row
// per command, so a command named twice, running then its result, goes in
// two rounds, in arrival order).
func updateRounds(todo []updateTodo, size int) [][]updateTodo {
	var rounds [][]updateTodo
	var cur []updateTodo
	inCur := map[string]bool{}
	for _, t := range todo {
		if len(cur) == size || inCur[t.body.CommandId] {
			rounds = append(rounds, cur)
			cur, inCur = nil, map[string]bool{}
		}
		cur = append(cur, t)
		inCur[t.body.CommandId] = true
	}
	if len(cur) > 0 {
		rounds = append(rounds, cur)
	}
	return rounds
}

// attest checks the node's signature on an update against the stored
// record of the certificate it names: of this node, not revoked, not of
// role node-tenant, expired less than AttestGrace before now; and that the
// signed body names the kind and payload digest of the command row it
// reports on, so a result signed for one command never attests another.
// The second result names why an update is not attested.
func attest(states map[string]nodes.CertState, rows map[string]binding, now time.Time, nodeID string, upd *nodev1.CommandUpdate, body *nodev1.UpdateBody) (bool, string) {
	st, known := states[upd.GetCertSerial()]
	row, haveRow := rows[body.CommandId]
	switch {
	case !haveRow || row.nodeID != nodeID:
		return false, "command-unknown"
	case body.Kind != row.kind:
		return false, "kind-mismatch"
	case !bytes.Equal(body.PayloadSha256, row.payloadSHA[:]):
		return false, "payload-mismatch"
	case !known:
		return false, "cert-unknown"
	case st.NodeID != nodeID:
		return false, "cert-other-node"
	case st.Revoked:
		return false, "cert-revoked"
	case st.Role == pki.RoleNodeTenant:
		return false, "node-tenant"
	case now.After(st.NotAfter.Add(AttestGrace)):
		return false, "cert-expired"
	case st.Cert == nil || !wire.VerifyNode(st.Cert.PublicKey, wire.UpdateSigContext, upd.GetBody(), upd.GetNodeSig()):
		return false, "bad-signature"
	}
	return true, ""
}

// disallowed returns the ids of the commands of unfinished whose kind a
// certificate of role, narrowed to allowed, does not run.
func disallowed(role string, allowed []string, unfinished []idKind) []string {
	var out []string
	for _, c := range unfinished {
		if !kinds.Permitted(role, allowed, c.kind) {
			out = append(out, c.id)
		}
	}
	return out
}

// check refuses a filter naming a state that is none of the six
// (INVALID_INPUT), which would otherwise list nothing as if none matched.
func (f Filter) check() error {
	if f.State != "" && !wire.State(f.State).Valid() {
		return errs.New(errs.InvalidInput, "state: not a command state (queued, sent, running, succeeded, failed, cancelled)")
	}
	return nil
}

// normalized returns f with its limit defaulted and bounded.
func (f Filter) normalized() Filter {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	return f
}
