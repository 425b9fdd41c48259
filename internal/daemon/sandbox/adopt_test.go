package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// TestRuncRestartAdoptsKnownKillsUnknown: when the host opens again (bcd
// restarted), a sandbox it has state for is adopted and keeps running
// its processes; one its runtime runs without a readable state (the
// state file lost, or never the host's) is killed and removed, with its
// bundle; and both the killed one and one the runtime lost are reported
// once the daemon listens, with their reasons.
func TestRuncRestartAdoptsKnownKillsUnknown(t *testing.T) {
	rt := runcRuntime(t)
	h, digest := testHost(t, rt, clock.Real{})
	deadline := time.Now().Add(time.Hour)
	kept, unknown, lost := createSpec(digest, deadline, 64), createSpec(digest, deadline, 64), createSpec(digest, deadline, 64)
	mustCreate(t, h, kept)
	mustCreate(t, h, unknown)
	mustCreate(t, h, lost)
	if r := execIn(t, h, kept.SandboxID, 10*time.Second, "sh", "-c", "echo adopted > /tmp/mark"); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	// bcd stops: nothing is removed. Then one state file is lost, and
	// one sandbox dies with the runtime's help while bcd is down.
	if err := os.Remove(h.statePath(unknown.SandboxID)); err != nil {
		t.Fatal(err)
	}
	if err := h.cfg.Runtime.Remove(context.Background(), lost.SandboxID); err != nil {
		t.Fatal(err)
	}
	h2, err := OpenHost(context.Background(), h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h2.Get(kept.SandboxID); !ok {
		t.Fatal("the known sandbox was not adopted")
	}
	if r := execIn(t, h2, kept.SandboxID, 10*time.Second, "cat", "/tmp/mark"); string(r.Stdout) != "adopted\n" {
		t.Fatalf("the adopted sandbox: %+v", r)
	}
	assertGone(t, h2, unknown.SandboxID)
	assertGone(t, h2, lost.SandboxID)
	got := map[string]string{}
	h2.OnFailed(func(id, reason string) { got[id] = reason })
	if len(got) != 2 || got[unknown.SandboxID] != ReasonUnknownToHost || got[lost.SandboxID] != ReasonLostAtRestart {
		t.Fatalf("reported %v, want %s %s and %s %s", got, unknown.SandboxID, ReasonUnknownToHost, lost.SandboxID, ReasonLostAtRestart)
	}
	h2.OnFailed(func(id, reason string) { t.Errorf("reported again: %s %s", id, reason) })
}

// issued is a fake of the daemon's verifier of kept commands: a "signed"
// command is kind, a NUL and the payload, and verifies only when the
// test issued exactly those bytes.
type issued map[string]bool

func (is issued) sign(kind string, payload []byte) []byte {
	b := append([]byte(kind+"\x00"), payload...)
	is[string(b)] = true
	return b
}

func (is issued) check(signed []byte, kind string) ([]byte, error) {
	k, payload, ok := bytes.Cut(signed, []byte{0})
	switch {
	case !ok || !is[string(signed)]:
		return nil, errors.New("signature-invalid")
	case string(k) != kind:
		return nil, errors.New("kind-not-allowed")
	}
	return payload, nil
}

// TestHostAdoptKillsWhatItCannotMatch: at adoption the host verifies
// again the signed commands each running sandbox's state keeps and keeps
// only those whose create (and claim and last update) verify and give
// exactly the state: a sandbox with no signed create kept, a forged one,
// one naming another sandbox, a command of another kind in its place, a
// deadline or environment changed in the state file, or a claim dropped
// from it is killed, removed and reported spec-unmatched, once; the
// others keep running.
func TestHostAdoptKillsWhatItCannotMatch(t *testing.T) {
	clk := clock.NewFake(time.Now())
	rt := NewSim()
	h, digest := testHost(t, func(string) Runtime { return rt }, clk)
	h.cfg.Slots, h.cfg.MemoryMB = 32, 8192
	ctx := context.Background()
	is := issued{}
	mk := func(warm bool) spec.Create {
		return spec.Create{SandboxID: ids.New("sbx"), ImageDigest: digest, Runtime: spec.RuntimeSim, Limits: spec.Limits{CPUMillis: 100, MemoryMB: 64, Pids: 16, DiskMB: 8},
			Network: spec.NetworkNone, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli(), Warm: warm}
	}
	run := func(kind string, payload any, signed func(kind string, raw []byte) []byte) {
		t.Helper()
		runSigned(t, h, kind, payload, signed)
	}
	forge := func(kind string, raw []byte) []byte { return append([]byte(kind+"\x00"), raw...) }
	cases := map[string]spec.Create{}
	create := func(name string, warm bool, signed func(string, []byte) []byte) spec.Create {
		c := mk(warm)
		run(kinds.SandboxCreate, c, signed)
		cases[name] = c
		return c
	}
	create("kept", false, is.sign)
	claimed := create("claimed", true, is.sign)
	run(kinds.SandboxUpdate, spec.Update{SandboxID: claimed.SandboxID, DeadlineMS: claimed.DeadlineMS + 1000, Claim: true, Env: map[string]string{"A": "b"}}, is.sign)
	run(kinds.SandboxUpdate, spec.Update{SandboxID: claimed.SandboxID, DeadlineMS: claimed.DeadlineMS + 2000}, is.sign)
	create("unsigned", false, nil)
	create("forged", false, forge)
	other := mk(false)
	create("other-sandbox", false, func(kind string, _ []byte) []byte { raw, _ := json.Marshal(other); return is.sign(kind, raw) })
	create("other-kind", false, func(_ string, raw []byte) []byte { return is.sign(kinds.SandboxUpdate, raw) })
	create("deadline-changed", false, is.sign)
	editState(t, h, cases["deadline-changed"].SandboxID, func(st *State) { st.DeadlineMS += 3600e3 })
	envClaimed := create("env-changed", true, is.sign)
	run(kinds.SandboxUpdate, spec.Update{SandboxID: envClaimed.SandboxID, DeadlineMS: envClaimed.DeadlineMS, Claim: true, Env: map[string]string{"A": "b"}}, is.sign)
	editState(t, h, envClaimed.SandboxID, func(st *State) { st.Env["A"] = "c" })
	dropped := create("claim-dropped", true, is.sign)
	run(kinds.SandboxUpdate, spec.Update{SandboxID: dropped.SandboxID, DeadlineMS: dropped.DeadlineMS, Claim: true, Env: map[string]string{"A": "b"}}, is.sign)
	editState(t, h, dropped.SandboxID, func(st *State) { st.SignedClaim, st.SignedUpdate = nil, nil })

	h2, err := OpenHost(ctx, h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	h2.OnFailed(func(id, reason string) { got[id] = reason })
	adopted := h2.Adopt(ctx, is.check)
	want := []string{cases["kept"].SandboxID, cases["claimed"].SandboxID}
	slices.Sort(want)
	if !slices.Equal(adopted, want) {
		t.Errorf("adopted %v, want %v", adopted, want)
	}
	for name, c := range cases {
		kept := name == "kept" || name == "claimed"
		if _, held := h2.Get(c.SandboxID); held != kept || rt.Running(ctx, c.SandboxID) != kept {
			t.Errorf("%s: held %v, running %v; want %v", name, held, rt.Running(ctx, c.SandboxID), kept)
		}
		if !kept && got[c.SandboxID] != ReasonSpecUnmatched {
			t.Errorf("%s: reported %q, want %s", name, got[c.SandboxID], ReasonSpecUnmatched)
		}
	}
	if len(got) != len(cases)-2 {
		t.Errorf("reported %v", got)
	}
	if again := h2.Adopt(ctx, is.check); len(again) != 0 {
		t.Errorf("a second Adopt adopted %v", again)
	}
}

// editState changes sandbox id's state file as someone with write access
// to the host's data folder might.
func editState(t *testing.T, h *Host, id string, edit func(*State)) {
	t.Helper()
	st, ok := h.Get(id)
	if !ok {
		t.Fatalf("%s not held", id)
	}
	edit(&st)
	if err := h.save(&st); err != nil {
		t.Fatal(err)
	}
}

// runSigned runs a sandbox.create or sandbox.update of payload on h with
// the command signed makes of it in the context (none when signed is
// nil), as the daemon hands a verified command to its driver.
func runSigned(t *testing.T, h *Host, kind string, payload any, signed func(kind string, raw []byte) []byte) {
	t.Helper()
	raw, _ := json.Marshal(payload)
	var cmd []byte
	if signed != nil {
		cmd = signed(kind, raw)
	}
	ctx := driver.WithCommand(context.Background(), cmd)
	var err error
	switch kind {
	case kinds.SandboxCreate:
		_, err = h.Create(ctx, raw)
	case kinds.SandboxUpdate:
		_, err = h.Update(ctx, raw)
	}
	if err != nil {
		t.Fatalf("%s: %v", kind, err)
	}
}
