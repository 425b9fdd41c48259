package quorum

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
)

const testDeployment = "dep1"

// testKeys returns n approver keys derived from fixed seeds, so that fuzz
// inputs stay meaningful between runs.
func testKeys(n int) []ed25519.PrivateKey {
	out := make([]ed25519.PrivateKey, n)
	for i := range out {
		seed := make([]byte, ed25519.SeedSize)
		seed[0] = byte(i + 1)
		out[i] = ed25519.NewKeyFromSeed(seed)
	}
	return out
}

func pubs(keys []ed25519.PrivateKey) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = k.Public().(ed25519.PublicKey)
	}
	return out
}

func mustSet(t testing.TB, generation uint64, threshold int, keys [][]byte) quorumwire.ApproverSet {
	t.Helper()
	s, err := quorumwire.NewApproverSet(generation, threshold, keys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// testBatch returns a stored batch of two bound leaves and one unbound one,
// expiring at expiresMS, with no approvals.
func testBatch(t testing.TB, expiresMS int64) *batchRow {
	t.Helper()
	leaves := []quorumwire.Leaf{
		quorumwire.UnboundLeaf("n1", kinds.NodeReboot),
		quorumwire.BoundLeaf("n1", kinds.NodeReboot, []byte(`{"force":true}`)),
		quorumwire.BoundLeaf("n2", kinds.DiskWipe, []byte(`{}`)),
	}
	root, err := quorumwire.Root(leaves)
	if err != nil {
		t.Fatal(err)
	}
	r := &batchRow{root: root, expiresMS: expiresMS, leaves: leaves}
	r.ID, r.Deployment, r.State = "b1", testDeployment, StateProposed
	return r
}

func codeOf(err error) errs.Code {
	if err == nil {
		return ""
	}
	return errs.CodeOf(err)
}

func TestCheckShape(t *testing.T) {
	cases := []struct {
		leaves int
		ttl    time.Duration
		want   time.Duration
		code   errs.Code
	}{
		{1, 0, DefaultLifetime, ""},
		{quorumwire.MaxLeaves, time.Second, time.Second, ""},
		{1, quorumwire.MaxBatchLifetime, quorumwire.MaxBatchLifetime, ""},
		{0, 0, 0, errs.InvalidInput},
		{quorumwire.MaxLeaves + 1, 0, 0, errs.InvalidInput},
		{1, -time.Second, 0, errs.InvalidInput},
		{1, quorumwire.MaxBatchLifetime + time.Millisecond, 0, errs.InvalidInput},
	}
	for _, c := range cases {
		got, err := checkShape(c.leaves, c.ttl)
		if got != c.want || codeOf(err) != c.code {
			t.Errorf("checkShape(%d, %v) = %v, %v; want %v, %q", c.leaves, c.ttl, got, err, c.want, c.code)
		}
	}
}

func TestPlanLeaves(t *testing.T) {
	lookupErr := errors.New("read failed")
	reboot := func(node string, payload string) LeafInput {
		return LeafInput{NodeID: node, Kind: kinds.NodeReboot, Payload: json.RawMessage(payload)}
	}
	cases := []struct {
		name      string
		scope     iam.Scope
		in        []LeafInput
		tenants   []string
		tenantErr error
		code      errs.Code
		wantErr   error
		msg       string
		tenant    string
	}{
		{name: "one bound leaf", scope: iam.ScopeOf("ta"), in: []LeafInput{reboot("n1", `{}`)}, tenants: []string{"ta"}, tenant: "ta"},
		{name: "empty payload binds {}", scope: iam.ScopeOf("ta"), in: []LeafInput{reboot("n1", ``)}, tenants: []string{"ta"}, tenant: "ta"},
		{name: "root sees every tenant", scope: iam.RootScope(), in: []LeafInput{reboot("n1", `{}`), reboot("n2", `{}`)},
			tenants: []string{"ta", "tb"}, tenant: "ta"},
		{name: "unbound leaf", scope: iam.ScopeOf("ta"), in: []LeafInput{{NodeID: "n1", Kind: kinds.DiskWipe, Unbound: true}}, tenants: []string{"ta"}, tenant: "ta"},
		{name: "unknown kind", scope: iam.ScopeOf("ta"), in: []LeafInput{{NodeID: "n1", Kind: "no.such"}}, tenants: []string{"ta"},
			code: errs.InvalidInput, msg: "leaves[0].kind: unknown command kind"},
		{name: "kind checked before the tenant read failure", scope: iam.ScopeOf("ta"), in: []LeafInput{{NodeID: "n1", Kind: "no.such"}},
			tenantErr: lookupErr, code: errs.InvalidInput, msg: "leaves[0].kind: unknown command kind"},
		{name: "tenant read failure", scope: iam.ScopeOf("ta"), in: []LeafInput{reboot("n1", `{}`), reboot("n2", `{}`)},
			tenants: []string{"ta"}, tenantErr: lookupErr, wantErr: lookupErr},
		{name: "other tenant's node", scope: iam.ScopeOf("ta"), in: []LeafInput{reboot("n1", `{}`)}, tenants: []string{"tb"},
			code: errs.NotFound, msg: "node not found"},
		{name: "zero scope sees nothing", in: []LeafInput{reboot("n1", `{}`)}, tenants: []string{"ta"}, code: errs.NotFound, msg: "node not found"},
		{name: "unbound with payload", scope: iam.ScopeOf("ta"), in: []LeafInput{{NodeID: "n1", Kind: kinds.NodeReboot, Unbound: true, Payload: json.RawMessage(`{}`)}},
			tenants: []string{"ta"}, code: errs.InvalidInput, msg: "leaves[0]: an unbound leaf takes no payload"},
		{name: "payload not JSON", scope: iam.ScopeOf("ta"), in: []LeafInput{reboot("n1", `{`)}, tenants: []string{"ta"},
			code: errs.InvalidInput, msg: "leaves[0].payload: not valid JSON of at most 64 KiB"},
		{name: "invalid node id", scope: iam.ScopeOf("ta"), in: []LeafInput{reboot("", `{}`)}, tenants: []string{"ta"},
			code: errs.InvalidInput, msg: "leaves[0]: not a valid leaf"},
		{name: "same leaf twice (after compacting)", scope: iam.ScopeOf("ta"), in: []LeafInput{reboot("n1", `{"a":1,"b":2}`), reboot("n1", `{ "a": 1, "b": 2 }`)},
			tenants: []string{"ta", "ta"}, code: errs.InvalidInput, msg: "leaves[1]: the same leaf twice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := planLeaves(c.scope, c.in, c.tenants, c.tenantErr)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("err %v, want %v", err, c.wantErr)
				}
				return
			}
			if codeOf(err) != c.code {
				t.Fatalf("err %v, want code %q", err, c.code)
			}
			if err != nil {
				var e *errs.Error
				if !errors.As(err, &e) || e.Message != c.msg {
					t.Fatalf("message %v, want %q", err, c.msg)
				}
				return
			}
			root, rerr := quorumwire.Root(p.leaves)
			if p.tenant != c.tenant || rerr != nil || string(root) != string(p.root) || len(p.leaves) != len(c.in) {
				t.Fatalf("plan %+v", p)
			}
		})
	}
}

// FuzzPlanLeaves: whatever the leaves, an accepted plan has one valid,
// distinct leaf per input, in order, under the root it reports, and
// nothing outside the caller's scope.
func FuzzPlanLeaves(f *testing.F) {
	f.Add("n1", kinds.NodeReboot, []byte(`{}`), false, "n2", kinds.DiskWipe, []byte(``), true, "ta", "ta", "ta")
	f.Add("n1", kinds.NodeReboot, []byte(`{"a":1}`), false, "n1", kinds.NodeReboot, []byte(`{ "a" : 1 }`), false, "ta", "ta", "ta")
	f.Add("n1", "x", []byte(`[]`), true, "", "", []byte(`{`), false, "ta", "tb", "tc")
	f.Fuzz(func(t *testing.T, n1, k1 string, p1 []byte, u1 bool, n2, k2 string, p2 []byte, u2 bool, scope, t1, t2 string) {
		in := []LeafInput{{NodeID: n1, Kind: k1, Payload: p1, Unbound: u1}, {NodeID: n2, Kind: k2, Payload: p2, Unbound: u2}}
		p, err := planLeaves(iam.ScopeOf(scope), in, []string{t1, t2}, nil)
		if err != nil {
			return
		}
		if !iam.ScopeOf(scope).Sees(t1) || !iam.ScopeOf(scope).Sees(t2) || p.tenant != t1 {
			t.Fatalf("planned leaves of %q and %q in scope %q", t1, t2, scope)
		}
		if len(p.leaves) != 2 || string(p.leaves[0].Encode()) == string(p.leaves[1].Encode()) || !rootMatches(p.leaves, p.root) {
			t.Fatalf("bad plan %+v", p)
		}
		for i, l := range p.leaves {
			if l.Validate() != nil || l.NodeID != in[i].NodeID || l.Kind != in[i].Kind || l.Unbound != in[i].Unbound {
				t.Fatalf("leaf %d %+v from %+v", i, l, in[i])
			}
			if !l.Unbound && !l.Admits(in[i].NodeID, in[i].Kind, p.payloads[i]) {
				t.Fatalf("leaf %d does not admit its own payload", i)
			}
		}
	})
}

func TestCheckApproval(t *testing.T) {
	keys := testKeys(3)
	set := mustSet(t, 0, 2, pubs(keys))
	const nowMS, expMS = 1000, 2000
	sign := func(k ed25519.PrivateKey, r *batchRow) []byte {
		return ed25519.Sign(k, quorumwire.ApprovalMessage(r.Deployment, r.ID, r.root, r.expiresMS))
	}
	approvedBy := func(r *batchRow, ks ...ed25519.PrivateKey) {
		for _, k := range ks {
			r.approvals = append(r.approvals, quorumwire.Signature{PublicKey: k.Public().(ed25519.PublicKey), Signature: sign(k, r)})
		}
	}
	cases := []struct {
		name    string
		edit    func(r *batchRow)
		sig     func(r *batchRow) []byte
		reached bool
		code    errs.Code
	}{
		{name: "first of two", edit: func(*batchRow) {}},
		{name: "second reaches the quorum", edit: func(r *batchRow) { approvedBy(r, keys[1]) }, reached: true},
		{name: "an invalid stored approval does not count", edit: func(r *batchRow) {
			r.approvals = append(r.approvals, quorumwire.Signature{PublicKey: keys[1].Public().(ed25519.PublicKey), Signature: make([]byte, 64)})
		}},
		{name: "already approved stays approved", edit: func(r *batchRow) { approvedBy(r, keys[1], keys[2]); r.State = StateApproved }},
		{name: "expired", edit: func(r *batchRow) { r.expiresMS = nowMS }, code: errs.InvalidState},
		{name: "leaves changed under the root", edit: func(r *batchRow) { r.leaves = r.leaves[:2] }, code: errs.InvalidState},
		{name: "root changed", edit: func(r *batchRow) { r.root = append([]byte{1}, r.root[1:]...) }, code: errs.InvalidState},
		{name: "signature over another batch", edit: func(*batchRow) {}, sig: func(r *batchRow) []byte {
			return ed25519.Sign(keys[0], quorumwire.ApprovalMessage(r.Deployment, "b2", r.root, r.expiresMS))
		}, code: errs.InvalidInput},
		{name: "signature for another deployment", edit: func(*batchRow) {}, sig: func(r *batchRow) []byte {
			return ed25519.Sign(keys[0], quorumwire.ApprovalMessage("dep2", r.ID, r.root, r.expiresMS))
		}, code: errs.InvalidInput},
		{name: "approver twice", edit: func(r *batchRow) { approvedBy(r, keys[0]) }, code: errs.Conflict},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := testBatch(t, expMS)
			c.edit(r)
			sig := sign(keys[0], r)
			if c.sig != nil {
				sig = c.sig(r)
			}
			before := len(r.approvals)
			reached, err := checkApproval(set, r, keys[0].Public().(ed25519.PublicKey), sig, nowMS)
			if reached != c.reached || codeOf(err) != c.code {
				t.Fatalf("reached %v err %v; want %v %q", reached, err, c.reached, c.code)
			}
			if len(r.approvals) != before {
				t.Fatal("checkApproval changed the stored approvals")
			}
		})
	}
	r := testBatch(t, expMS)
	r.leaves = r.leaves[:1]
	if _, err := checkApproval(set, r, keys[0].Public().(ed25519.PublicKey), sign(keys[0], r), nowMS); err != errRootMismatch {
		t.Fatalf("root mismatch: %v, want errRootMismatch (the caller logs it)", err)
	}
}

// FuzzCheckApproval: a forged or foreign signature never counts, and the
// quorum is reached only with threshold distinct valid approvals.
func FuzzCheckApproval(f *testing.F) {
	keys := testKeys(3)
	set := mustSet(f, 0, 2, pubs(keys))
	r := testBatch(f, 2000)
	good := ed25519.Sign(keys[0], quorumwire.ApprovalMessage(r.Deployment, r.ID, r.root, r.expiresMS))
	f.Add(uint8(0), good, int64(1000), uint8(1))
	f.Add(uint8(1), good, int64(1000), uint8(0))
	f.Add(uint8(0), good, int64(2000), uint8(3))
	f.Add(uint8(2), []byte{}, int64(0), uint8(7))
	f.Fuzz(func(t *testing.T, who uint8, sig []byte, nowMS int64, stored uint8) {
		b := testBatch(t, 2000)
		msg := quorumwire.ApprovalMessage(b.Deployment, b.ID, b.root, b.expiresMS)
		for i := range keys { // stored approvals: bit i set means key i approved
			if stored&(1<<i) != 0 {
				b.approvals = append(b.approvals, quorumwire.Signature{PublicKey: keys[i].Public().(ed25519.PublicKey), Signature: ed25519.Sign(keys[i], msg)})
			}
		}
		key := keys[int(who)%len(keys)].Public().(ed25519.PublicKey)
		reached, err := checkApproval(set, b, key, sig, nowMS)
		if err != nil {
			if reached {
				t.Fatal("reached with an error")
			}
			return
		}
		if nowMS >= b.expiresMS || !ed25519.Verify(key, msg, sig) {
			t.Fatalf("accepted an expired batch or a bad signature")
		}
		valid := countValid(set, msg, append(b.approvals, quorumwire.Signature{PublicKey: key, Signature: sig}))
		if reached != (valid >= set.Threshold) {
			t.Fatalf("reached %v with %d valid of %d", reached, valid, set.Threshold)
		}
	})
}

func TestCountValid(t *testing.T) {
	keys := testKeys(3)
	set := mustSet(t, 0, 2, pubs(keys[:2]))
	msg := []byte("m")
	sig := func(k ed25519.PrivateKey, m []byte) quorumwire.Signature {
		return quorumwire.Signature{PublicKey: k.Public().(ed25519.PublicKey), Signature: ed25519.Sign(k, m)}
	}
	cases := []struct {
		name string
		sigs []quorumwire.Signature
		want int
	}{
		{"none", nil, 0},
		{"one", []quorumwire.Signature{sig(keys[0], msg)}, 1},
		{"same key twice", []quorumwire.Signature{sig(keys[0], msg), sig(keys[0], msg)}, 1},
		{"two", []quorumwire.Signature{sig(keys[0], msg), sig(keys[1], msg)}, 2},
		{"key outside the set", []quorumwire.Signature{sig(keys[2], msg)}, 0},
		{"over another message", []quorumwire.Signature{sig(keys[0], []byte("x"))}, 0},
		{"short key", []quorumwire.Signature{{PublicKey: []byte{1}, Signature: []byte{2}}}, 0},
	}
	for _, c := range cases {
		if got := countValid(set, msg, c.sigs); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestAdmitsAndPickLeaf(t *testing.T) {
	r := testBatch(t, 2000)
	cases := []struct {
		node, kind, payload string
		nowMS               int64
		code                errs.Code
		pick                int
	}{
		{"n1", kinds.NodeReboot, `{"force":true}`, 1000, "", 1}, // the bound leaf over the unbound one before it
		{"n1", kinds.NodeReboot, `{"other":1}`, 1000, "", 0},    // only the unbound leaf
		{"n2", kinds.DiskWipe, `{}`, 1000, "", 2},
		{"n2", kinds.DiskWipe, `{"x":1}`, 1000, errs.InvalidInput, -1},
		{"n3", kinds.NodeReboot, `{}`, 1000, errs.InvalidInput, -1},
		{"n1", kinds.NodeReboot, `{}`, 2000, errs.InvalidState, 0},
	}
	for _, c := range cases {
		if err := admits(r, c.nowMS, c.node, c.kind, []byte(c.payload)); codeOf(err) != c.code {
			t.Errorf("admits(%s %s %s at %d): %v, want %q", c.node, c.kind, c.payload, c.nowMS, err, c.code)
		}
		if got := pickLeaf(r.leaves, c.node, c.kind, []byte(c.payload)); got != c.pick {
			t.Errorf("pickLeaf(%s %s %s) = %d, want %d", c.node, c.kind, c.payload, got, c.pick)
		}
	}
}

func TestCheckSetSignature(t *testing.T) {
	keys := testKeys(4)
	cur := mustSet(t, 0, 2, pubs(keys[:3]))
	newKeys := pubs(keys[1:])
	signNext := func(k ed25519.PrivateKey, dep string, gen uint64, threshold int, ks [][]byte) []byte {
		return ed25519.Sign(k, quorumwire.ApproverSetMessage(dep, mustSet(t, gen, threshold, ks)))
	}
	cases := []struct {
		name       string
		cur        quorumwire.ApproverSet
		generation uint64
		threshold  int
		keys       [][]byte
		signer     ed25519.PrivateKey
		sig        []byte
		code       errs.Code
	}{
		{name: "ok", cur: cur, generation: 1, threshold: 2, keys: newKeys, signer: keys[0]},
		{name: "nothing pinned", cur: quorumwire.ApproverSet{}, generation: 1, threshold: 2, keys: newKeys, signer: keys[0], code: errs.InvalidState},
		{name: "generation skipped", cur: cur, generation: 2, threshold: 2, keys: newKeys, signer: keys[0], code: errs.InvalidInput},
		{name: "generation replayed", cur: cur, generation: 0, threshold: 2, keys: newKeys, signer: keys[0], code: errs.InvalidInput},
		{name: "threshold above the keys", cur: cur, generation: 1, threshold: 4, keys: newKeys, signer: keys[0], code: errs.InvalidInput},
		{name: "no keys", cur: cur, generation: 1, threshold: 1, keys: nil, signer: keys[0], code: errs.InvalidInput},
		{name: "signer not a current approver", cur: cur, generation: 1, threshold: 2, keys: newKeys, signer: keys[3], code: errs.AccessDenied},
		{name: "signature over another set", cur: cur, generation: 1, threshold: 2, keys: newKeys, signer: keys[0],
			sig: signNext(keys[0], testDeployment, 1, 1, newKeys), code: errs.InvalidInput},
		{name: "signature for another deployment", cur: cur, generation: 1, threshold: 2, keys: newKeys, signer: keys[0],
			sig: signNext(keys[0], "dep2", 1, 2, newKeys), code: errs.InvalidInput},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sig := c.sig
			if sig == nil && c.code != errs.InvalidInput && c.code != errs.InvalidState {
				sig = signNext(c.signer, testDeployment, c.generation, c.threshold, c.keys)
			}
			next, msg, err := checkSetSignature(c.cur, testDeployment, c.generation, c.threshold, c.keys, c.signer.Public().(ed25519.PublicKey), sig)
			if codeOf(err) != c.code {
				t.Fatalf("err %v, want %q", err, c.code)
			}
			if err == nil && (next.Generation != c.generation || string(msg) != string(quorumwire.ApproverSetMessage(testDeployment, next))) {
				t.Fatalf("next %+v msg %x", next, msg)
			}
		})
	}
}

func TestSetChangeOutcomeAndReplay(t *testing.T) {
	keys := testKeys(4)
	pinned := mustSet(t, 0, 2, pubs(keys[:3]))
	next := mustSet(t, 1, 1, pubs(keys[2:]))
	msg := quorumwire.ApproverSetMessage(testDeployment, next)
	sig := func(i int) quorumwire.Signature {
		return quorumwire.Signature{PublicKey: keys[i].Public().(ed25519.PublicKey), Signature: ed25519.Sign(keys[i], msg)}
	}
	for _, c := range []struct {
		name    string
		sigs    []quorumwire.Signature
		signed  int
		applied bool
	}{
		{"one of two", []quorumwire.Signature{sig(0)}, 1, false},
		{"two of two", []quorumwire.Signature{sig(0), sig(1)}, 2, true},
		{"same approver twice", []quorumwire.Signature{sig(0), sig(0)}, 1, false},
		{"a key outside the set refuses the change", []quorumwire.Signature{sig(0), sig(1), sig(3)}, 2, false},
	} {
		signed, applied := setChangeOutcome(pinned, testDeployment, next, msg, c.sigs)
		if signed != c.signed || applied != c.applied {
			t.Errorf("%s: signed %d applied %v; want %d %v", c.name, signed, applied, c.signed, c.applied)
		}
	}
	good := setRow{generation: 1, threshold: 1, keys: next.RawKeys(), sigs: []quorumwire.Signature{sig(0), sig(1)}}
	forged := setRow{generation: 2, threshold: 1, keys: pubs(keys[3:]), sigs: []quorumwire.Signature{sig(3)}}
	for _, c := range []struct {
		name   string
		rows   []setRow
		gen    uint64
		broken int
	}{
		{"nothing recorded", nil, 0, -1},
		{"one change", []setRow{good}, 1, 0 - 1},
		{"a forged row ends the chain", []setRow{good, forged}, 1, 1},
		{"a forged first row keeps the pinned set", []setRow{forged}, 0, 0},
	} {
		cur, broken, err := replayChain(pinned, testDeployment, c.rows)
		if cur.Generation != c.gen || broken != c.broken || (err != nil) != (broken >= 0) {
			t.Errorf("%s: generation %d broken %d err %v; want %d %d", c.name, cur.Generation, broken, err, c.gen, c.broken)
		}
	}
}

// FuzzCheckSetSignature: only a current approver's valid signature over
// the exact proposed set passes, whatever the keys and threshold.
func FuzzCheckSetSignature(f *testing.F) {
	keys := testKeys(3)
	cur := mustSet(f, 0, 2, pubs(keys))
	next := mustSet(f, 1, 2, pubs(keys))
	good := ed25519.Sign(keys[0], quorumwire.ApproverSetMessage(testDeployment, next))
	f.Add(uint64(1), 2, pubs(keys)[0], pubs(keys)[1], uint8(0), good)
	f.Add(uint64(1), 1, pubs(keys)[0], []byte{1, 2, 3}, uint8(1), good)
	f.Add(uint64(7), 0, []byte{}, []byte{}, uint8(2), []byte{})
	f.Fuzz(func(t *testing.T, generation uint64, threshold int, k1, k2 []byte, who uint8, sig []byte) {
		signer := pubs(keys)[int(who)%len(keys)]
		nx, msg, err := checkSetSignature(cur, testDeployment, generation, threshold, [][]byte{k1, k2}, signer, sig)
		if err != nil {
			return
		}
		if generation != 1 || nx.Validate() != nil || !ed25519.Verify(signer, msg, sig) ||
			string(msg) != string(quorumwire.ApproverSetMessage(testDeployment, nx)) {
			t.Fatalf("accepted generation %d threshold %d", generation, threshold)
		}
	})
}
