package nodes

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/jointoken"
)

var testPin = [32]byte{1, 2, 3}

func testToken(pin [32]byte) jointoken.Token {
	return jointoken.Token{Pin: pin, ID: ids.New("jt_"), Secret: ids.Secret(32)}
}

// TestCheckJoinRequest: what a joining node sends is refused, before any
// read, for a malformed token, another deployment's pin, or a name that
// is not acceptable; the reason is the one recorded.
func TestCheckJoinRequest(t *testing.T) {
	good := testToken(testPin)
	cases := []struct {
		name, token, nodeName string
		parsed                bool
		reason                string
	}{
		{"ok", good.String(), "rack-1", true, ""},
		{"ok without name", good.String(), "", true, ""},
		{"surrounding space", " " + good.String() + "\n", "", true, ""},
		{"malformed", "bcj1.x.y.z", "", false, reasonTokenMalformed},
		{"empty", "", "", false, reasonTokenMalformed},
		{"other pin", testToken([32]byte{9}).String(), "", true, reasonTokenPinMismatch},
		{"name with control", good.String(), "a\x1b[2J", true, reasonNameInvalid},
		{"name too long", good.String(), strings.Repeat("a", 300), true, reasonNameInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tok, parsed, reason := checkJoinRequest(c.token, [][32]byte{testPin}, c.nodeName)
			if parsed != c.parsed || reason != c.reason {
				t.Fatalf("parsed %v reason %q, want %v %q", parsed, reason, c.parsed, c.reason)
			}
			if parsed && tok.ID == "" {
				t.Fatal("parsed token without id")
			}
		})
	}
}

// TestDecideJoin: the stored token admits a join only when it exists, its
// hash matches the secret, it is unused and not expired (expiry is
// exclusive: at expires_at it is expired).
func TestDecideJoin(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	tok := testToken(testPin)
	row := tokenRow{hash: jointoken.HashSecret(tok.Secret), tenant: "t1", role: "node", expires: now.Add(time.Minute).UnixMilli()}
	used := row
	used.used = sql.NullInt64{Int64: 1, Valid: true}
	expired := row
	expired.expires = now.UnixMilli()
	cases := []struct {
		name   string
		row    tokenRow
		found  bool
		secret string
		want   string
	}{
		{"ok", row, true, tok.Secret, ""},
		{"no row", tokenRow{}, false, tok.Secret, reasonTokenUnknown},
		{"wrong secret", row, true, ids.Secret(32), reasonTokenUnknown},
		{"used", used, true, tok.Secret, reasonTokenUsed},
		{"expired at expiry", expired, true, tok.Secret, reasonTokenExpired},
		{"wrong secret beats used", used, true, "x", reasonTokenUnknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := decideJoin(c.row, c.found, c.secret, now); got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestJoinName: the asked name, else the token's, else the node id.
func TestJoinName(t *testing.T) {
	for _, c := range []struct{ asked, token, want string }{
		{"a", "b", "a"}, {"", "b", "b"}, {"", "", "n-1"},
	} {
		if got := joinName(c.asked, c.token, "n-1"); got != c.want {
			t.Errorf("joinName(%q, %q) = %q, want %q", c.asked, c.token, got, c.want)
		}
	}
}

// TestDecideSession: a Hello supersedes the node's open session (moved
// when another gateway holds it), and counts a flip only when that
// session was live (heartbeat, or connection when none, within
// SessionQuietAfter) and from another boot.
func TestDecideSession(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	ms := func(d time.Duration) int64 { return now.Add(-d).UnixMilli() }
	beat := func(d time.Duration) sql.NullInt64 { return sql.NullInt64{Int64: ms(d), Valid: true} }
	live := sessionRow{session: "s-old", boot: "bA", gateway: "gw1", connected: ms(time.Hour), heartbeat: beat(time.Second)}
	closed := live
	closed.closed = sql.NullInt64{Int64: ms(time.Minute), Valid: true}
	quiet := live
	quiet.heartbeat = beat(SessionQuietAfter + time.Millisecond)
	edge := live
	edge.heartbeat = beat(SessionQuietAfter)
	noBeat := live
	noBeat.heartbeat = sql.NullInt64{}
	noBeat.connected = ms(time.Second)
	noBeatOld := noBeat
	noBeatOld.connected = ms(time.Hour)
	cases := []struct {
		name     string
		prev     sessionRow
		found    bool
		boot, gw string
		want     sessionDecision
	}{
		{"first session", sessionRow{}, false, "bA", "gw1", sessionDecision{}},
		{"previous closed", closed, true, "bB", "gw1", sessionDecision{}},
		{"same boot reconnects", live, true, "bA", "gw1", sessionDecision{Superseded: "s-old"}},
		{"same boot on another gateway", live, true, "bA", "gw2", sessionDecision{Superseded: "s-old", Moved: true}},
		{"another boot while live", live, true, "bB", "gw1", sessionDecision{Superseded: "s-old", Flip: true}},
		{"another boot, another gateway", live, true, "bB", "gw2", sessionDecision{Superseded: "s-old", Moved: true, Flip: true}},
		{"another boot after quiet", quiet, true, "bB", "gw1", sessionDecision{Superseded: "s-old"}},
		{"heartbeat exactly at the quiet edge is live", edge, true, "bB", "gw1", sessionDecision{Superseded: "s-old", Flip: true}},
		{"no heartbeat: recent connection is live", noBeat, true, "bB", "gw1", sessionDecision{Superseded: "s-old", Flip: true}},
		{"no heartbeat: old connection is quiet", noBeatOld, true, "bB", "gw1", sessionDecision{Superseded: "s-old"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := decideSession(c.prev, c.found, c.boot, c.gw, now); got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestQuarantines: more than FlipLimit flips within the window quarantine.
func TestQuarantines(t *testing.T) {
	for n, want := range map[int]bool{0: false, 1: false, FlipLimit: false, FlipLimit + 1: true, 100: true} {
		if got := quarantines(n); got != want {
			t.Errorf("quarantines(%d) = %v, want %v", n, got, want)
		}
	}
	now := time.UnixMilli(1_700_000_000_000)
	if got := now.Sub(flipWindowStart(now)); got != FlipWindow {
		t.Errorf("flip window %v, want %v", got, FlipWindow)
	}
}

// TestDecideRenew: a certificate revoked since it was read refuses the
// renewal (whatever else), then any renewal of the node in the interval.
func TestDecideRenew(t *testing.T) {
	cases := []struct {
		revoked bool
		recent  int
		want    string
	}{
		{false, 0, ""},
		{false, 1, reasonRenewRateLimited},
		{true, 0, reasonRenewRevoked},
		{true, 3, reasonRenewRevoked},
	}
	for _, c := range cases {
		if got := decideRenew(c.revoked, c.recent); got != c.want {
			t.Errorf("decideRenew(%v, %d) = %q, want %q", c.revoked, c.recent, got, c.want)
		}
	}
	now := time.UnixMilli(1_700_000_000_000)
	if got := now.Sub(renewWindowStart(now, DefaultRenewInterval)); got != DefaultRenewInterval {
		t.Errorf("renew window %v", got)
	}
}

// FuzzCheckJoinRequest: any token and name a node sends is decided
// without panicking, and admitted only when it parsed, carries this
// deployment's pin and its name is empty or acceptable.
func FuzzCheckJoinRequest(f *testing.F) {
	f.Add(testToken(testPin).String(), "rack-1")
	f.Add(testToken([32]byte{9}).String(), "")
	f.Add("bcj1....", "a b")
	f.Fuzz(func(t *testing.T, token, name string) {
		tok, parsed, reason := checkJoinRequest(token, [][32]byte{testPin}, name)
		if reason == "" {
			if !parsed || tok.Pin != testPin || (name != "" && !ValidateName(name)) {
				t.Fatalf("admitted %q name %q", token, name)
			}
			if again, err := jointoken.Parse(tok.String()); err != nil || again != tok {
				t.Fatalf("admitted token does not round-trip: %v", err)
			}
		}
		if !parsed && reason != reasonTokenMalformed {
			t.Fatalf("unparsed token refused as %q", reason)
		}
	})
}

// FuzzDecideSession: whatever boot id a node presents (its own choice) and
// whatever the stored row holds, a flip or a move is only ever decided for
// an open previous session, a flip only for another boot, and a move only
// for another gateway.
func FuzzDecideSession(f *testing.F) {
	f.Add("bA", "bB", "gw1", "gw2", int64(0), int64(0), false, false, true)
	f.Add("bA", "bA", "gw1", "gw1", int64(1), int64(-1), true, true, true)
	f.Fuzz(func(t *testing.T, prevBoot, boot, prevGw, gw string, connected, beat int64, hasBeat, closed, found bool) {
		now := time.UnixMilli(1_700_000_000_000)
		prev := sessionRow{session: "s", boot: prevBoot, gateway: prevGw, connected: now.UnixMilli() - connected,
			heartbeat: sql.NullInt64{Int64: now.UnixMilli() - beat, Valid: hasBeat}, closed: sql.NullInt64{Valid: closed}}
		d := decideSession(prev, found, boot, gw, now)
		open := found && !closed
		if !open && d != (sessionDecision{}) {
			t.Fatalf("decided %+v for no open session", d)
		}
		if d.Flip && boot == prevBoot {
			t.Fatal("flip for the same boot")
		}
		if d.Moved != (open && gw != prevGw) {
			t.Fatalf("moved %v", d.Moved)
		}
	})
}
