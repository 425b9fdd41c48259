package approval

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// grant gives a standing grant for kind from now for a week.
func (f *fixture) grant(t *testing.T, kind string, perHour, perDay int) Standing {
	t.Helper()
	now := f.clk.Now()
	g, err := f.s.GrantStanding(kind, now, now.Add(7*24*time.Hour), perHour, perDay, f.fresh(t))
	must(t, err)
	return g
}

func TestStandingRatePerHourAndDay(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	g := f.grant(t, moveOp, 3, 5)
	start := f.clk.Now()
	for i := 0; i < 3; i++ {
		u, err := f.s.UseStanding(moveOp)
		must(t, err)
		if u.ID != g.ID || len(u.Runs) != i+1 {
			t.Fatalf("run %d: %+v", i+1, u)
		}
		f.clk.Advance(time.Minute)
	}
	_, err := f.s.UseStanding(moveOp)
	wantRefused(t, err, ReasonRateHour)
	f.clk.Set(start.Add(time.Hour)) // the first run is an hour old
	_, err = f.open(t).UseStanding(moveOp)
	must(t, err)
	f.clk.Set(start.Add(2 * time.Hour))
	_, err = f.s.UseStanding(moveOp)
	must(t, err)
	_, err = f.s.UseStanding(moveOp)
	wantRefused(t, err, ReasonRateDay)                 // 5 runs today
	f.clk.Set(start.Add(24*time.Hour + 2*time.Minute)) // the first three runs are a day old
	u, err := f.s.UseStanding(moveOp)
	must(t, err)
	if len(u.Runs) != 3 { // the runs older than a day were pruned
		t.Fatalf("runs kept %v", u.Runs)
	}
}

func TestStandingWindowByClock(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	now := f.clk.Now()
	_, err := f.s.GrantStanding(moveOp, now.Add(time.Hour), now.Add(2*time.Hour), 10, 10, f.fresh(t))
	must(t, err)
	_, err = f.s.UseStanding(moveOp)
	wantRefused(t, err, ReasonOutsideWindow)
	_, err = f.s.UseStanding("observe:disk")
	wantRefused(t, err, ReasonNoStanding)
	f.clk.Set(now.Add(time.Hour))
	_, err = f.s.UseStanding(moveOp)
	must(t, err)
	f.clk.Set(now.Add(2 * time.Hour))
	_, err = f.s.UseStanding(moveOp)
	wantRefused(t, err, ReasonOutsideWindow)
}

func TestGrantStandingChecks(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	cases := []struct {
		name            string
		kind            string
		nb, na          time.Duration // from now
		perHour, perDay int
		reason          string
	}{
		{"over 30 days", moveOp, 0, 30*24*time.Hour + time.Second, 1, 1, ReasonBadWindow},
		{"ended", moveOp, -2 * time.Hour, -time.Hour, 1, 1, ReasonBadWindow},
		{"empty", moveOp, time.Hour, time.Hour, 1, 1, ReasonBadWindow},
		{"zero per hour", moveOp, 0, time.Hour, 0, 1, ReasonBadRate},
		{"zero per day", moveOp, 0, time.Hour, 1, 0, ReasonBadRate},
		{"huge rate", moveOp, 0, time.Hour, 1, MaxPerDay + 1, ReasonBadRate},
		{"bad kind", "files move", 0, time.Hour, 1, 1, ReasonBadKind},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := f.clk.Now()
			_, err := f.s.GrantStanding(c.kind, now.Add(c.nb), now.Add(c.na), c.perHour, c.perDay, f.fresh(t))
			wantRefused(t, err, c.reason)
		})
	}
	now := f.clk.Now()
	_, err := f.s.GrantStanding(moveOp, now, now.Add(30*24*time.Hour), 1, 1, f.wrongCode(t))
	wantRefused(t, err, ReasonCodeInvalid)
	_, err = f.s.GrantStanding(moveOp, now, now.Add(30*24*time.Hour), 1, 1, f.fresh(t))
	must(t, err)
}

// readOps decodes the fixture's ops.json.
func (f *fixture) readOps(t *testing.T) opsDoc {
	t.Helper()
	d, err := decodeOps(f.readFile(t, opsFile))
	must(t, err)
	return d
}

// writeOps replaces the fixture's ops.json.
func (f *fixture) writeOps(t *testing.T, d opsDoc) {
	t.Helper()
	b, err := json.Marshal(d)
	must(t, err)
	f.writeFile(t, opsFile, b)
}

// wantNoGrant asserts kind has no usable grant and the listing marks every
// record invalid.
func (f *fixture) wantNoGrant(t *testing.T, kinds ...string) {
	t.Helper()
	for _, k := range kinds {
		_, err := f.s.UseStanding(k)
		wantRefused(t, err, ReasonNoStanding)
	}
	l, err := f.s.ListStanding()
	must(t, err)
	for _, g := range l {
		if g.Valid || g.Kind != "" {
			t.Fatalf("listed %+v as a grant", g)
		}
	}
}

func TestOpsEditedByHandHoldsNoGrant(t *testing.T) {
	for _, edit := range []struct {
		name string
		fn   func(d *opsDoc)
	}{
		{"sealed byte flipped", func(d *opsDoc) { d.Records[0].Sealed[len(d.Records[0].Sealed)/2] ^= 1 }},
		{"sealed truncated", func(d *opsDoc) { d.Records[0].Sealed = d.Records[0].Sealed[:20] }},
		{"id changed", func(d *opsDoc) { d.Records[0].ID = "sg_aaaaaaaaaaaaaaaaaaaa" }},
		{"record doubled", func(d *opsDoc) { d.Records = append(d.Records, d.Records[0]) }},
	} {
		t.Run(edit.name, func(t *testing.T) {
			f := newFixture(t)
			f.enroll(t)
			f.grant(t, moveOp, 3, 10)
			d := f.readOps(t)
			edit.fn(&d)
			f.writeOps(t, d)
			f.wantNoGrant(t, moveOp)
		})
	}
	f := newFixture(t)
	f.enroll(t)
	f.grant(t, moveOp, 3, 10)
	f.writeFile(t, opsFile, []byte(`{"records":[{"id":"sg_x","sealed":"AAAA","kind":"files:move-plan"}]}`))
	_, err := f.s.UseStanding(moveOp)
	wantRefused(t, err, ReasonNoStanding)
	_, err = f.s.ListStanding()
	wantRefused(t, err, ReasonOpsDamaged)
	n, err := f.s.DropAllStanding()
	must(t, err)
	if l, err := f.s.ListStanding(); err != nil || len(l) != 0 || n != 0 {
		t.Fatalf("after drop --all: %v %v (dropped %d)", l, err, n)
	}
}

func TestOpsFromAnotherBastionHoldsNoGrant(t *testing.T) {
	for _, other := range []struct {
		name   string
		secret []byte
		id     string
	}{
		{"other key", []byte("another bastion's key bytes....!"), "bastion-1"},
		{"other bastion id", testSecret, "bastion-2"},
	} {
		t.Run(other.name, func(t *testing.T) {
			f, g := newFixture(t), newFixture(t)
			g.keyIn, g.bid = other.secret, other.id
			g.s = g.open(t)
			g.enroll(t)
			g.grant(t, moveOp, 3, 10)
			if _, err := g.s.UseStanding(moveOp); err != nil {
				t.Fatalf("the grant does not hold on its own bastion: %v", err)
			}
			must(t, os.WriteFile(filepath.Join(f.dir, opsFile), g.readFile(t, opsFile), 0o600))
			f.wantNoGrant(t, moveOp)
		})
	}
}

func TestOtherGrantsBlobUnderThisIDHoldsNoGrant(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	a := f.grant(t, moveOp, 1, 1)
	b := f.grant(t, "files:read", 100, 1000)
	d := f.readOps(t)
	if d.Records[0].ID != a.ID || d.Records[1].ID != b.ID {
		t.Fatalf("records %v", d.Records)
	}
	d.Records[0].Sealed = append([]byte(nil), d.Records[1].Sealed...) // B's blob under A's id
	f.writeOps(t, d)
	_, err := f.s.UseStanding(moveOp)
	wantRefused(t, err, ReasonNoStanding)
	l, err := f.s.ListStanding()
	must(t, err)
	if len(l) != 2 || l[0].Valid || l[0].ID != a.ID || !l[1].Valid || l[1].ID != b.ID {
		t.Fatalf("listing %+v", l)
	}
	_, err = f.s.UseStanding("files:read") // B itself still holds
	must(t, err)
}

func TestDropStanding(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	a := f.grant(t, moveOp, 3, 10)
	f.grant(t, "files:read", 3, 10)
	f.grant(t, "files:list", 3, 10)
	wantRefused(t, f.s.DropStanding("sg_nosuchgrantxxxxxxxx"), ReasonUnknownGrant)
	must(t, f.s.DropStanding(a.ID))
	_, err := f.s.UseStanding(moveOp)
	wantRefused(t, err, ReasonNoStanding)
	wantRefused(t, f.s.DropStanding(a.ID), ReasonUnknownGrant)
	n, err := f.s.DropAllStanding()
	must(t, err)
	if n != 2 {
		t.Fatalf("dropped %d, want 2", n)
	}
	_, err = f.s.UseStanding("files:read")
	wantRefused(t, err, ReasonNoStanding)
}

// TestRecordBindsIDAndBastion checks the seal format the brief fixes: a
// record opens only under aad "bc-bastion-ops\x00"+bastion+"\x00"+id, and
// a record that opens but whose plaintext names another id or bastion (as
// only a holder of the key could write) holds no grant either.
func TestRecordBindsIDAndBastion(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	g := f.grant(t, moveOp, 3, 10)
	rec := f.readOps(t).Records[0]
	key := DeriveKey(testSecret, "bc-bastion ops.json v1")
	if _, err := Open(key, []byte("bc-bastion-ops\x00bastion-1\x00"+g.ID), rec.Sealed); err != nil {
		t.Fatalf("record does not open under its aad: %v", err)
	}
	_, err := Open(key, []byte("bc-bastion-ops\x00bastion-1\x00sg_other"), rec.Sealed)
	wantRefused(t, err, ReasonSealBroken)

	const id = "sg_cccccccccccccccccccc"
	for name, p := range map[string]standingPlain{
		"other id":      {V: 1, ID: "sg_dddddddddddddddddddd", Bastion: f.bid},
		"other bastion": {V: 1, ID: id, Bastion: "bastion-2"},
		"other version": {V: 2, ID: id, Bastion: f.bid},
	} {
		p.Kind, p.NotBefore, p.NotAfter, p.PerHour, p.PerDay = moveOp, f.clk.Now(), f.clk.Now().Add(time.Hour), 5, 5
		pt, err := json.Marshal(p)
		must(t, err)
		sealed, err := Seal(key, opsAAD(f.bid, id), pt)
		must(t, err)
		f.writeOps(t, opsDoc{Records: []opsRecord{{ID: id, Sealed: sealed}}})
		t.Run(name, func(t *testing.T) { f.wantNoGrant(t, moveOp) })
	}
}
