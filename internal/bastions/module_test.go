package bastions_test

import (
	"bytes"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestPairTokenJoinsAsBastion: a pairing token is a one-time join token of
// role bastion, audited as compute:bastions:pair; joining with it issues a
// certificate of role bastion (the node CA's ordinary join), whose role
// runs no command kind. A join token of role bastion is refused by the
// nodes module (INVALID_INPUT): only PairToken mints one.
func TestPairTokenJoinsAsBastion(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := newEnv(t, db)
		tok, err := e.s.PairToken(e.ctx, actor(e.tenant), "laptop", time.Hour)
		if err != nil || tok.Role != pki.RoleBastion || tok.Token == "" {
			t.Fatalf("pair token: %+v %v", tok, err)
		}
		if n := e.countAudit(e.tenant, "compute:bastions:pair", "allowed"); n != 1 {
			t.Fatalf("%d pair audit rows", n)
		}
		if _, err := e.nodes.CreateJoinToken(e.ctx, actor(iam.RootTenant), pki.RoleBastion, "x", time.Hour); errs.CodeOf(err) != errs.InvalidInput || errs.SafeMessage(err) != nodes.ReasonBastionRole {
			t.Fatalf("join token of role bastion: %v", err)
		}
		if _, err := e.nodes.CreateJoinTokens(e.ctx, actor(iam.RootTenant), pki.RoleBastion, 2, time.Hour); errs.CodeOf(err) != errs.InvalidInput {
			t.Fatalf("join tokens of role bastion: %v", err)
		}
		id, leaf := e.pair(e.tenant, "desk")
		ident, err := pki.ParseNodeCert(leaf)
		if err != nil || ident.Role != pki.RoleBastion || ident.NodeID != id {
			t.Fatalf("bastion certificate: %+v %v", ident, err)
		}
		if ks := kinds.ForRole(pki.RoleBastion); len(ks) != 0 || kinds.AllowedForRole(pki.RoleBastion, kinds.NodePing) {
			t.Fatalf("a bastion runs kinds %v", ks)
		}
		if ok, err := e.s.Paired(e.ctx, id); !ok || err != nil {
			t.Fatalf("Paired after join: %v %v", ok, err)
		}
		if tnt, err := e.s.TenantOf(e.ctx, id); err != nil || tnt != e.tenant {
			t.Fatalf("TenantOf: %q %v", tnt, err)
		}
	})
}

// TestHelloAllocatesStableUniqueAddresses: the first hello allocates the
// lowest free address (never 100.100.0.0 or .0.1), every later hello
// answers the same one (a new key keeps it), two bastions never share one
// or a WireGuard key, and what is not a paired bastion is refused with its
// reason.
func TestHelloAllocatesStableUniqueAddresses(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := newEnv(t, db)
		a, _ := e.pair(e.tenant, "alpha")
		b, _ := e.pair(iam.RootTenant, "beta")
		ka, kb := wgKey(t), wgKey(t)
		ta, err := e.s.Hello(e.ctx, a, ka)
		if err != nil || ta.BastionAddr != "100.100.0.2" || ta.HostAddr != "100.100.0.1" {
			t.Fatalf("first hello: %+v %v", ta, err)
		}
		vkey, _ := e.s.GrantVerifyKey(e.ctx)
		_, hostPub, _ := e.s.LanesKey(e.ctx)
		if ta.GrantVerifyKey != vkey || ta.HostPublicKey != hostPub || vkey == "" || hostPub == "" {
			t.Fatalf("hello keys %+v, want %q %q", ta, vkey, hostPub)
		}
		tb, err := e.s.Hello(e.ctx, b, kb)
		if err != nil || tb.BastionAddr != "100.100.0.3" {
			t.Fatalf("second bastion: %+v %v", tb, err)
		}
		ka2 := wgKey(t)
		if again, err := e.s.Hello(e.ctx, a, ka2); err != nil || again.BastionAddr != ta.BastionAddr {
			t.Fatalf("hello with a new key: %+v %v", again, err)
		}
		_, err = e.s.Hello(e.ctx, b, ka2)
		wantRefusal(t, "another bastion's key", err, errs.AccessDenied, bastions.ReasonWGKeyInUse)
		_, err = e.s.Hello(e.ctx, b, hostPub)
		wantRefusal(t, "the control plane's key", err, errs.AccessDenied, bastions.ReasonWGKeyInUse)
		for _, bad := range []string{"", "AAAA", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", ka + "x"} {
			_, err = e.s.Hello(e.ctx, a, bad)
			wantRefusal(t, "malformed key "+bad, err, errs.InvalidInput, bastions.ReasonWGKeyMalformed)
		}
		e.node("nplainnodexxxxxx", e.tenant, pki.RoleNode)
		for _, id := range []string{"nplainnodexxxxxx", "nmissingxxxxxxxx"} {
			_, err = e.s.Hello(e.ctx, id, wgKey(t))
			wantRefusal(t, "hello from "+id, err, errs.AccessDenied, bastions.ReasonNotBastion)
		}
		peers, err := e.s.Peers(e.ctx)
		if err != nil || len(peers) != 2 || peers[0].Addr.String() == peers[1].Addr.String() {
			t.Fatalf("peers: %+v %v", peers, err)
		}
		if err := e.s.Unpair(e.ctx, actor(iam.RootTenant), iam.RootScope(), b); err != nil {
			t.Fatal(err)
		}
		_, err = e.s.Hello(e.ctx, b, kb)
		wantRefusal(t, "hello after unpair", err, errs.AccessDenied, bastions.ReasonUnpaired)
		if peers, _ := e.s.Peers(e.ctx); len(peers) != 1 || peers[0].BastionID != a {
			t.Fatalf("peers after unpair: %+v", peers)
		}
		c, _ := e.pair(e.tenant, "gamma")
		if tc, err := e.s.Hello(e.ctx, c, wgKey(t)); err != nil || tc.BastionAddr != "100.100.0.4" {
			t.Fatalf("an unpaired bastion's address is never reused: %+v %v", tc, err)
		}
	})
}

// TestUnpairRevokesAndPokes: unpairing marks the bastion unpaired with an
// audit row, revokes every certificate of it through the nodes module and
// pokes bus.TopicBastions.
func TestUnpairRevokesAndPokes(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := newEnv(t, db)
		id, leaf := e.pair(e.tenant, "alpha")
		poke, stop := e.bus.Subscribe(bus.TopicBastions)
		defer stop()
		if err := e.s.Unpair(e.ctx, actor(e.tenant), iam.ScopeOf(e.tenant), id); err != nil {
			t.Fatal(err)
		}
		select {
		case <-poke:
		default:
			t.Fatal("unpair did not poke bus.TopicBastions")
		}
		st, err := e.nodes.CertState(e.ctx, pki.SerialHex(leaf))
		if err != nil || !st.Revoked {
			t.Fatalf("certificate after unpair: %+v %v", st, err)
		}
		if ok, _ := e.s.Paired(e.ctx, id); ok {
			t.Fatal("still paired")
		}
		if n := e.countAudit(e.tenant, "compute:bastions:unpair", "allowed"); n != 1 {
			t.Fatalf("%d unpair audit rows", n)
		}
		_, err = e.s.SignedGrants(e.ctx, id)
		wantRefusal(t, "grants of an unpaired bastion", err, errs.AccessDenied, bastions.ReasonUnpaired)
		_, err = e.s.Grant(e.ctx, actor(e.tenant), iam.ScopeOf(e.tenant), id, bastions.GrantRequest{Allow: []string{grant.FamilyInference}})
		wantRefusal(t, "grant to an unpaired bastion", err, errs.InvalidState, bastions.ReasonUnpaired)
	})
}

// TestGrantsSignedAndLive: a grant is signed under the grant key and
// verifies with grant.Verify under GrantVerifyKey for its bastion only;
// SignedGrants carries only live grants (a revoked or expired one is
// gone); Grants flags them; List shows the effective families, a deny
// beating an allow; each change is audited and pokes bus.TopicBastions.
func TestGrantsSignedAndLive(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := newEnv(t, db)
		id, _ := e.pair(e.tenant, "alpha")
		other, _ := e.pair(e.tenant, "beta")
		scope := iam.ScopeOf(e.tenant)
		poke, stop := e.bus.Subscribe(bus.TopicBastions)
		defer stop()
		g1, err := e.s.Grant(e.ctx, actor(e.tenant), scope, id, bastions.GrantRequest{Allow: []string{grant.FamilyInference, grant.FamilyModels},
			Models: []string{"llama3:8b"}, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		<-poke
		g2, err := e.s.Grant(e.ctx, actor(e.tenant), scope, id, bastions.GrantRequest{Allow: []string{grant.FamilyEgress}, Deny: []string{grant.FamilyModels}, TTL: 2 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		signed, err := e.s.SignedGrants(e.ctx, id)
		if err != nil || len(signed) != 2 {
			t.Fatalf("signed grants: %d %v", len(signed), err)
		}
		vkey, _ := e.s.GrantVerifyKey(e.ctx)
		docs := map[string]grant.Doc{}
		for _, m := range signed {
			doc, reason := grant.Verify(m, vkey, id, e.clk.Now())
			if reason != "" {
				t.Fatalf("verify: %q", reason)
			}
			docs[doc.ID] = doc
		}
		if d := docs[g1.ID]; !slices.Equal(d.Allow, g1.Allow) || !slices.Equal(d.Models, g1.Models) || d.ExpiresAt != g1.ExpiresAt.UnixMilli() || d.Bastion != id {
			t.Fatalf("verified grant %+v, want %+v", d, g1)
		}
		if d := docs[g2.ID]; !slices.Equal(d.Deny, g2.Deny) {
			t.Fatalf("verified grant %+v, want %+v", d, g2)
		}
		if _, reason := grant.Verify(signed[0], vkey, other, e.clk.Now()); reason != grant.ReasonOtherBastion {
			t.Fatalf("verify for another bastion: %q", reason)
		}
		if bytes.Contains(signed[0], []byte("PRIVATE")) {
			t.Fatal("signed grant carries key material")
		}
		wantFamilies(t, e, id, []string{grant.FamilyEgress, grant.FamilyInference})
		if err := e.s.RevokeGrant(e.ctx, actor(e.tenant), e.tenant, g2.ID); err != nil {
			t.Fatal(err)
		}
		<-poke
		if err := e.s.RevokeGrant(e.ctx, actor(e.tenant), e.tenant, g2.ID); errs.CodeOf(err) != errs.NotFound {
			t.Fatalf("second revoke: %v", err)
		}
		if signed, _ := e.s.SignedGrants(e.ctx, id); len(signed) != 1 {
			t.Fatalf("%d signed grants after a revoke", len(signed))
		}
		wantFamilies(t, e, id, []string{grant.FamilyInference, grant.FamilyModels})
		e.clk.Advance(time.Hour)
		if signed, _ := e.s.SignedGrants(e.ctx, id); len(signed) != 0 {
			t.Fatalf("%d signed grants after expiry", len(signed))
		}
		wantFamilies(t, e, id, []string{})
		gs, err := e.s.Grants(e.ctx, scope, id)
		if err != nil || len(gs) != 2 {
			t.Fatalf("grants: %+v %v", gs, err)
		}
		for _, g := range gs {
			if g.ID == g1.ID && (!g.Expired || g.Revoked) || g.ID == g2.ID && (g.Expired || !g.Revoked) {
				t.Fatalf("grant flags: %+v", g)
			}
		}
		if n := e.countAudit(e.tenant, "compute:bastions:grant", "allowed"); n != 3 {
			t.Fatalf("%d grant audit rows, want 3", n)
		}
	})
}

// wantFamilies fails unless bastions.list shows id with families fams.
func wantFamilies(t *testing.T, e *env, id string, fams []string) {
	t.Helper()
	ls, err := e.s.List(e.ctx, iam.ScopeOf(e.tenant))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ls {
		if s.ID == id {
			if !slices.Equal(s.Families, fams) {
				t.Fatalf("families %v, want %v", s.Families, fams)
			}
			return
		}
	}
	t.Fatalf("%s not listed in %+v", id, ls)
}

// TestTenancy: another tenant's bastion is NOT_FOUND exactly like a
// missing one and like a node that is not a bastion, for every read and
// write the module takes a scope for; the root scope sees it.
func TestTenancy(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := newEnv(t, db)
		theirs, _ := e.pair(iam.RootTenant, "theirs")
		e.node("nplainnodexxxxxx", e.tenant, pki.RoleNode)
		scope := iam.ScopeOf(e.tenant)
		for _, id := range []string{theirs, "nmissingxxxxxxxx", "nplainnodexxxxxx"} {
			var msgs []string
			_, err := e.s.Get(e.ctx, scope, id)
			msgs = append(msgs, string(errs.CodeOf(err))+errs.SafeMessage(err))
			_, err = e.s.Grants(e.ctx, scope, id)
			msgs = append(msgs, string(errs.CodeOf(err))+errs.SafeMessage(err))
			_, err = e.s.Grant(e.ctx, actor(e.tenant), scope, id, bastions.GrantRequest{Allow: []string{grant.FamilyEgress}})
			msgs = append(msgs, string(errs.CodeOf(err))+errs.SafeMessage(err))
			err = e.s.Unpair(e.ctx, actor(e.tenant), scope, id)
			msgs = append(msgs, string(errs.CodeOf(err))+errs.SafeMessage(err))
			for _, m := range msgs {
				if m != "NOT_FOUNDbastion not found" {
					t.Fatalf("%s: %v", id, msgs)
				}
			}
		}
		if ls, _ := e.s.List(e.ctx, scope); len(ls) != 0 {
			t.Fatalf("tenant lists %+v", ls)
		}
		if b, err := e.s.Get(e.ctx, iam.RootScope(), theirs); err != nil || b.State != bastions.StatePaired {
			t.Fatalf("root get: %+v %v", b, err)
		}
		if ok, _ := e.s.Paired(e.ctx, theirs); !ok {
			t.Fatal("a refused unpair changed the bastion")
		}
	})
}

// TestRecordLaneEvents: a bastion's lane events become audit rows in its
// tenant (compute:bastions:lane.<kind>, allowed or refused, with lane,
// reason, peer, seq and hash); a batch with a bad kind or field, or over
// the cap, is refused whole; a node that is not a bastion is refused.
func TestRecordLaneEvents(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := newEnv(t, db)
		id, _ := e.pair(e.tenant, "alpha")
		hash := "aa" + string(bytes.Repeat([]byte("0"), 62))
		evs := []bastions.LaneEvent{
			{Seq: 1, Kind: "accept", Lane: "inference/ollama", Peer: "100.100.0.1:40000", Hash: hash},
			{Seq: 2, Kind: "refuse", Lane: "egress", Reason: "egress-private", Peer: "100.100.0.1:40001", Hash: hash},
		}
		if err := e.s.RecordLaneEvents(e.ctx, id, evs); err != nil {
			t.Fatal(err)
		}
		if e.countAudit(e.tenant, "compute:bastions:lane.accept", "allowed") != 1 || e.countAudit(e.tenant, "compute:bastions:lane.refuse", "refused") != 1 {
			t.Fatal("lane events not recorded in the bastion's tenant")
		}
		var details string
		if err := db.QueryRowContext(e.ctx, `SELECT details FROM audit_events WHERE action = 'compute:bastions:lane.refuse'`).Scan(&details); err != nil {
			t.Fatal(err)
		}
		if details != `{"hash":"`+hash+`","lane":"egress","peer":"100.100.0.1:40001","reason":"egress-private","seq":2}` {
			t.Fatalf("details %s", details)
		}
		for name, c := range map[string]struct {
			evs    []bastions.LaneEvent
			reason string
		}{
			"bad kind":   {[]bastions.LaneEvent{evs[0], {Seq: 3, Kind: "Accept"}}, bastions.ReasonEventKind},
			"long kind":  {[]bastions.LaneEvent{{Kind: string(bytes.Repeat([]byte("a"), 33))}}, bastions.ReasonEventKind},
			"bad lane":   {[]bastions.LaneEvent{{Kind: "accept", Lane: "x\n"}}, bastions.ReasonEventField},
			"bad hash":   {[]bastions.LaneEvent{{Kind: "accept", Hash: "zz"}}, bastions.ReasonEventField},
			"bad reason": {[]bastions.LaneEvent{{Kind: "refuse", Reason: "Has Space"}}, bastions.ReasonEventField},
			"too many":   {make([]bastions.LaneEvent, bastions.MaxLaneEvents+1), bastions.ReasonEventsTooMany},
		} {
			wantRefusal(t, name, e.s.RecordLaneEvents(e.ctx, id, c.evs), errs.InvalidInput, c.reason)
		}
		if e.countAudit(e.tenant, "compute:bastions:lane.accept", "") != 1 {
			t.Fatal("a refused batch wrote rows")
		}
		e.node("nplainnodexxxxxx", e.tenant, pki.RoleNode)
		wantRefusal(t, "events from a plain node", e.s.RecordLaneEvents(e.ctx, "nplainnodexxxxxx", evs[:1]), errs.AccessDenied, bastions.ReasonNotBastion)
	})
}

// TestKeysSealedAndResealed: the grant and lanes private keys are stored
// only sealed under the KEK, each bound to its row (a sealed key moved to
// the other row does not open), made once (the same on every call), and
// Reseal moves them to a new KEK under which a new module reads the same
// keys.
func TestKeysSealedAndResealed(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := newEnv(t, db)
		priv, pub, err := e.s.LanesKey(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p2, pub2, _ := e.s.LanesKey(e.ctx); p2 != priv || pub2 != pub || priv.Public().String() != pub {
			t.Fatal("lanes key changed between calls")
		}
		vkey, _ := e.s.GrantVerifyKey(e.ctx)
		sealed := map[string][]byte{}
		rows, err := db.QueryContext(e.ctx, `SELECT name, sealed FROM bastion_keys`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var n string
			var s []byte
			_ = rows.Scan(&n, &s)
			sealed[n] = s
		}
		rows.Close()
		if len(sealed) != 2 || bytes.Contains(sealed["lanes"], []byte(priv.String())) || bytes.Contains(sealed["grant"], []byte("PRIVATE+KEY")) {
			t.Fatalf("keys not sealed: %d rows", len(sealed))
		}
		swap(t, e, sealed["grant"], "lanes")
		if _, _, err := e.s.LanesKey(e.ctx); !errors.Is(err, pki.ErrSealBroken) {
			t.Fatalf("the grant key's sealed bytes in the lanes row: %v, want the seal broken", err)
		}
		swap(t, e, sealed["lanes"], "lanes")
		var next pki.KEK
		next[0] = 1
		c, err := bastions.Reseal(e.ctx, db, e.kek, next)
		if err != nil || c.Resealed != 2 {
			t.Fatalf("reseal: %+v %v", c, err)
		}
		if c, err := bastions.Reseal(e.ctx, db, e.kek, next); err != nil || c.AlreadyDone != 2 {
			t.Fatalf("reseal again: %+v %v", c, err)
		}
		after := bastions.New(db, e.clk, next, e.nodes, nil, nil)
		if p, _, err := after.LanesKey(e.ctx); err != nil || p != priv {
			t.Fatalf("lanes key under the new KEK: %v", err)
		}
		if v, _ := after.GrantVerifyKey(e.ctx); v != vkey {
			t.Fatal("grant key changed")
		}
		if _, _, err := e.s.LanesKey(e.ctx); err == nil {
			t.Fatal("the lanes key still opens under the old KEK")
		}
	})
}

// swap stores sealed as the sealed bytes of key name (an attacker with the
// database).
func swap(t *testing.T, e *env, sealed []byte, name string) {
	t.Helper()
	if _, err := e.db.ExecContext(e.ctx, `UPDATE bastion_keys SET sealed = $1 WHERE name = $2`, sealed, name); err != nil {
		t.Fatal(err)
	}
}

// TestAllocate: the lowest free address, skipping the range's first
// address, the host's and the last; none when all are taken.
func TestAllocate(t *testing.T) {
	a, ok := bastions.Allocate(nil)
	if !ok || a != netip.MustParseAddr("100.100.0.2") {
		t.Fatalf("first: %v", a)
	}
	used := map[netip.Addr]bool{netip.MustParseAddr("100.100.0.2"): true, netip.MustParseAddr("100.100.0.4"): true}
	if a, _ := bastions.Allocate(used); a != netip.MustParseAddr("100.100.0.3") {
		t.Fatalf("gap: %v", a)
	}
	for _, bad := range []string{"100.100.0.0", "100.100.0.1", "100.100.255.255", "100.101.0.2", "10.0.0.2", "::1"} {
		if bastions.Allocatable(netip.MustParseAddr(bad)) {
			t.Errorf("%s allocatable", bad)
		}
	}
	all := map[netip.Addr]bool{}
	for x := netip.MustParseAddr("100.100.0.0"); bastions.TunnelRange.Contains(x); x = x.Next() {
		all[x] = true
	}
	if a, ok := bastions.Allocate(all); ok {
		t.Fatalf("a full range allocated %v", a)
	}
}
