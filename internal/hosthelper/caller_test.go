package hosthelper

import (
	"crypto/sha256"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

var ping = helperwire.Request{Version: helperwire.Version, Op: helperwire.OpPing}

// A caller of another uid, even one in the node's group (so it can open
// the 0660 socket), is refused CodePeerUID; so is the node's uid with
// another primary gid.
func TestHelperRefusesCallerOfAnotherUID(t *testing.T) {
	f := newFixture(t, nil, nil)
	for _, cred := range []*syscall.Credential{
		{Uid: otherUID, Gid: otherGID, Groups: []uint32{nodeGID}},
		{Uid: nodeUID, Gid: otherGID, Groups: []uint32{nodeGID}},
	} {
		o, pid := runAs(t, f, f.exe, cred, ping)
		if o.Code != helperwire.CodePeerUID {
			t.Fatalf("uid %d gid %d: got code %q result %s err %q, want code %s", cred.Uid, cred.Gid, o.Code, o.Result, o.Err, helperwire.CodePeerUID)
		}
		if !strings.Contains(f.log.String(), `"pid":`+itoa(pid)) {
			t.Fatalf("refusal of pid %d not logged: %s", pid, f.log.String())
		}
	}
}

// A Python client running as the node account is refused CodePeerExe: the
// uid is right but the executable is not bcd.
func TestHelperRefusesCallerWhoseExeIsNotBcd(t *testing.T) {
	f := newFixture(t, nil, nil)
	resp := runPython(t, f, `{"version":1,"op":"ping"}`)
	if resp.Code != helperwire.CodePeerExe {
		t.Fatalf("python as the node account: got code %q result %s, want code %s", resp.Code, resp.Result, helperwire.CodePeerExe)
	}
}

// An executable pinned by SHA-256 in the config is accepted as bcd.
func TestHelperAcceptsPinnedExe(t *testing.T) {
	sum := fileSHA(t, pythonPath(t))
	f := newFixture(t, func(c *Config) { c.ExeSHA256 = [][sha256.Size]byte{sum} }, nil)
	resp := runPython(t, f, `{"version":1,"op":"ping"}`)
	if resp.Code != "" {
		t.Fatalf("pinned python: refused %+v", resp)
	}
	var p helperwire.Ping
	if err := json.Unmarshal(resp.Result, &p); err != nil || p.UID != nodeUID || p.GID != nodeGID {
		t.Fatalf("ping result %s (%v)", resp.Result, err)
	}
}

// The node account running the helper's own executable (the same inode,
// and a copy with the same SHA-256) is served: ping answers the caller's
// pid, uid and gid as the kernel reported them.
func TestHelperServesNodeAccountRunningBcd(t *testing.T) {
	f := newFixture(t, nil, nil)
	cp := filepath.Join(f.base, "bin", "copy.test")
	copyFile(t, f.exe, cp)
	for _, exe := range []string{f.exe, cp} {
		o, pid := runAs(t, f, exe, &syscall.Credential{Uid: nodeUID, Gid: nodeGID}, ping)
		if o.Code != "" || o.Err != "" {
			t.Fatalf("%s: got %+v", exe, o)
		}
		var p helperwire.Ping
		if err := json.Unmarshal(o.Result, &p); err != nil {
			t.Fatal(err)
		}
		want := helperwire.Ping{Version: helperwire.Version, PID: int32(pid), UID: nodeUID, GID: nodeGID}
		if p != want {
			t.Fatalf("%s: ping %+v, want %+v", exe, p, want)
		}
	}
}

// events.drain returns the refused caller with its pid, then forgets it.
func TestEventsDrainReturnsRefusedCaller(t *testing.T) {
	f := newFixture(t, nil, nil)
	_, pid := runAs(t, f, f.exe, &syscall.Credential{Uid: otherUID, Gid: otherGID, Groups: []uint32{nodeGID}}, ping)
	res, code := call(t, f.sock, helperwire.Request{Version: 1, Op: helperwire.OpEventsDrain})
	if code != "" {
		t.Fatalf("drain refused %s", code)
	}
	var ev helperwire.Events
	if err := json.Unmarshal(res, &ev); err != nil {
		t.Fatal(err)
	}
	if len(ev.Events) != 1 || ev.Events[0].PID != int32(pid) || ev.Events[0].UID != otherUID || ev.Events[0].Code != helperwire.CodePeerUID {
		t.Fatalf("events %+v, want one peer-uid refusal of pid %d", ev, pid)
	}
	res, _ = call(t, f.sock, helperwire.Request{Version: 1, Op: helperwire.OpEventsDrain})
	if err := json.Unmarshal(res, &ev); err != nil || len(ev.Events) != 0 || ev.Dropped != 0 {
		t.Fatalf("second drain %s (%v), want empty", res, err)
	}
}
