package sandboxes

import (
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestNewTemplateDefaults(t *testing.T) {
	tpl, env, labels, err := newTemplate(TemplateIn{Name: "small", Image: "busybox"}, "tpl_1", "ten_a", "idn_1", t0)
	if err != nil {
		t.Fatal(err)
	}
	want := spec.Limits{CPUMillis: 1000, MemoryMB: 256, Pids: 256, DiskMB: 256}
	if tpl.Limits != want || tpl.Lifetime != 3600 || tpl.MaxLifetime != 86400 || tpl.Runtime != spec.RuntimeRunc ||
		tpl.Network != spec.NetworkNone || tpl.TenantID != "ten_a" || tpl.CreatedBy != "idn_1" || !tpl.CreatedAt.Equal(t0) {
		t.Fatalf("defaults: %+v", tpl)
	}
	if string(env) != "{}" || string(labels) != "{}" {
		t.Fatalf("encoded env %s labels %s", env, labels)
	}
}

func TestNewTemplateRefusals(t *testing.T) {
	ok := TemplateIn{Name: "small", Image: "busybox"}
	with := func(f func(*TemplateIn)) TemplateIn {
		in := ok
		f(&in)
		return in
	}
	bigEnv := map[string]string{}
	for i := 0; i < 5; i++ {
		bigEnv["K"+string(rune('A'+i))] = strings.Repeat("v", 4000)
	}
	cases := []struct {
		name string
		in   TemplateIn
		msg  string // "" accepted
	}{
		{"ok", ok, ""},
		{"empty name", with(func(in *TemplateIn) { in.Name = "" }), "name: 1 to 63 of a-z 0-9 . _ -"},
		{"upper name", with(func(in *TemplateIn) { in.Name = "Small" }), "name: 1 to 63 of a-z 0-9 . _ -"},
		{"runtime", with(func(in *TemplateIn) { in.Runtime = "kata" }), "runtime: runc, runsc or sim"},
		{"runsc", with(func(in *TemplateIn) { in.Runtime = spec.RuntimeRunsc }), ""},
		{"network", with(func(in *TemplateIn) { in.Network = "host" }), "network: none or egress"},
		{"egress on runsc", with(func(in *TemplateIn) { in.Runtime, in.Network = spec.RuntimeRunsc, spec.NetworkEgress }),
			"network: egress is not available on runsc (use runc, or network none)"},
		{"egress on runc", with(func(in *TemplateIn) { in.Network = spec.NetworkEgress }), ""},
		{"short lifetime", with(func(in *TemplateIn) { in.Lifetime = 119 }),
			"lifetime_seconds: at least 120, and at most max_lifetime_seconds (at most 7 days)"},
		{"lifetime over max", with(func(in *TemplateIn) { in.Lifetime, in.MaxLifetime = 600, 300 }),
			"lifetime_seconds: at least 120, and at most max_lifetime_seconds (at most 7 days)"},
		{"max over a week", with(func(in *TemplateIn) { in.MaxLifetime = 7*86400 + 1 }),
			"lifetime_seconds: at least 120, and at most max_lifetime_seconds (at most 7 days)"},
		{"a week", with(func(in *TemplateIn) { in.MaxLifetime = 7 * 86400 }), ""},
		{"negative warm", with(func(in *TemplateIn) { in.Warm = -1 }), "warm: 0 to 32"},
		{"warm over", with(func(in *TemplateIn) { in.Warm = MaxWarm + 1 }), "warm: 0 to 32"},
		{"warm max", with(func(in *TemplateIn) { in.Warm = MaxWarm }), ""},
		{"env too big", with(func(in *TemplateIn) { in.Env = bigEnv }), "env: at most 16 KiB"},
		{"bcd label", with(func(in *TemplateIn) { in.Labels = map[string]string{spec.LabelPrefix + "x": "1"} }),
			"labels: keys under runtime. are bcd's; keys and values up to 63 bytes"},
		{"empty label key", with(func(in *TemplateIn) { in.Labels = map[string]string{"": "1"} }),
			"labels: keys under runtime. are bcd's; keys and values up to 63 bytes"},
		{"long label value", with(func(in *TemplateIn) { in.Labels = map[string]string{"zone": strings.Repeat("a", 64)} }),
			"labels: keys under runtime. are bcd's; keys and values up to 63 bytes"},
		{"label", with(func(in *TemplateIn) { in.Labels = map[string]string{"zone": "a"} }), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, _, err := newTemplate(c.in, "tpl_1", "ten_a", "idn_1", t0)
			if c.msg == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if errs.CodeOf(err) != errs.InvalidInput || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("got %v, want INVALID_INPUT %q", err, c.msg)
			}
		})
	}
}

// FuzzNewTemplate: any input is either refused as INVALID_INPUT or gives
// a template within every bound the hosts rely on.
func FuzzNewTemplate(f *testing.F) {
	f.Add("small", "runc", "none", int64(0), int64(0), int64(0), int64(0), int64(0), 0, "K", "v", "zone", "a")
	f.Add("x", "runsc", "egress", int64(500), int64(128), int64(120), int64(120), int64(1), 32, "PATH", "/bin", "runtime.runc", "true")
	f.Add("", "sim", "", int64(-1), int64(-1), int64(-1), int64(7*86400+1), int64(-5), -1, "", "", "", "")
	f.Fuzz(func(t *testing.T, name, runtime, network string, cpu, mem, life, maxLife, pids int64, warm int, ek, ev, lk, lv string) {
		in := TemplateIn{Name: name, Image: "img", Runtime: runtime, Network: network, Limits: spec.Limits{CPUMillis: cpu, MemoryMB: mem, Pids: pids},
			Lifetime: life, MaxLifetime: maxLife, Warm: warm, Env: map[string]string{ek: ev}, Labels: map[string]string{lk: lv}}
		tpl, env, labels, err := newTemplate(in, "tpl_1", "ten_a", "idn_1", t0)
		if err != nil {
			if errs.CodeOf(err) != errs.InvalidInput {
				t.Fatalf("refusal is not INVALID_INPUT: %v", err)
			}
			return
		}
		if !validName(tpl.Name) || tpl.Warm < 0 || tpl.Warm > MaxWarm || tpl.Lifetime < 120 || tpl.MaxLifetime < tpl.Lifetime ||
			tpl.MaxLifetime > 7*86400 || tpl.Limits.Validate() != nil || len(env) > 16<<10 || len(labels) == 0 {
			t.Fatalf("accepted out of bounds: %+v", tpl)
		}
		if tpl.Network == spec.NetworkEgress && tpl.Runtime == spec.RuntimeRunsc {
			t.Fatal("accepted egress on runsc")
		}
		for k := range tpl.Labels {
			if strings.HasPrefix(k, spec.LabelPrefix) {
				t.Fatalf("accepted bcd's label %q", k)
			}
		}
	})
}

func fleetNode(id string, labels map[string]string) nodes.Node {
	l := map[string]string{spec.RuntimeLabel(spec.RuntimeRunc): "true", spec.LabelPrefix + "sandbox.slots": "2", spec.LabelPrefix + "sandbox.memory_mb": "1024"}
	for k, v := range labels {
		l[k] = v
	}
	return nodes.Node{ID: id, TenantID: iam.RootTenant, Role: pki.RoleNode, Connected: true, Labels: l}
}

func TestPlaceHost(t *testing.T) {
	tpl := Template{Runtime: spec.RuntimeRunc, Network: spec.NetworkNone, Limits: spec.Limits{MemoryMB: 256}}
	egress := tpl
	egress.Network = spec.NetworkEgress
	zoned := tpl
	zoned.Labels = map[string]string{"zone": "a"}
	offline := fleetNode("n0", nil)
	offline.Connected = false
	gateway := fleetNode("n0", nil)
	gateway.Role = pki.RoleSite
	tenants := fleetNode("n0", nil)
	tenants.TenantID = "ten_a"
	cases := []struct {
		name string
		ns   []nodes.Node
		load map[string]hostLoad
		t    Template
		want string // host id, or "!" + refusal text
	}{
		{"none", nil, nil, tpl, "!no connected host has the runc runtime"},
		{"offline", []nodes.Node{offline}, nil, tpl, "!no connected host"},
		{"site role", []nodes.Node{gateway}, nil, tpl, "!no connected host"},
		{"tenant's node", []nodes.Node{tenants}, nil, tpl, "!no connected host"},
		{"no runtime", []nodes.Node{fleetNode("n1", map[string]string{spec.RuntimeLabel(spec.RuntimeRunc): "false"})}, nil, tpl, "!no connected host"},
		{"no slots label", []nodes.Node{fleetNode("n1", map[string]string{spec.LabelPrefix + "sandbox.slots": "x"})}, nil, tpl, "!no connected host"},
		{"one", []nodes.Node{fleetNode("n1", nil)}, nil, tpl, "n1"},
		{"least loaded", []nodes.Node{fleetNode("n1", nil), fleetNode("n2", nil)}, map[string]hostLoad{"n1": {1, 256}}, tpl, "n2"},
		{"tie by id", []nodes.Node{fleetNode("n2", nil), fleetNode("n1", nil)}, nil, tpl, "n1"},
		{"slots full", []nodes.Node{fleetNode("n1", nil)}, map[string]hostLoad{"n1": {2, 256}}, tpl, "!no host has capacity"},
		{"memory full", []nodes.Node{fleetNode("n1", nil)}, map[string]hostLoad{"n1": {1, 800}}, tpl, "!no host has capacity"},
		{"memory exact", []nodes.Node{fleetNode("n1", nil)}, map[string]hostLoad{"n1": {1, 768}}, tpl, "n1"},
		{"fuller when emptier lacks memory", []nodes.Node{fleetNode("n1", map[string]string{spec.LabelPrefix + "sandbox.memory_mb": "100"}), fleetNode("n2", nil)},
			map[string]hostLoad{"n2": {1, 0}}, tpl, "n2"},
		{"egress needs label", []nodes.Node{fleetNode("n1", nil)}, nil, egress, "!no connected host"},
		{"egress", []nodes.Node{fleetNode("n1", nil), fleetNode("n2", map[string]string{spec.EgressLabel: "true"})}, nil, egress, "n2"},
		{"labels", []nodes.Node{fleetNode("n1", map[string]string{"zone": "b"}), fleetNode("n2", map[string]string{"zone": "a"})}, nil, zoned, "n2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := placeHost(c.ns, c.load, c.t)
			if want, refused := strings.CutPrefix(c.want, "!"); refused {
				if errs.CodeOf(err) != errs.InvalidState || !strings.Contains(err.Error(), want) {
					t.Fatalf("got %q, %v; want INVALID_STATE %q", got, err, want)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// FuzzPlaceHost: a host placeHost picks is always a connected fleet host
// that advertises the runtime and has room for the template.
func FuzzPlaceHost(f *testing.F) {
	f.Add("2", "1024", 0, int64(0), "1", "512", 1, int64(256), int64(256), true, false)
	f.Add("0", "0", 5, int64(99), "x", "-1", -1, int64(-1), int64(1<<40), false, true)
	f.Fuzz(func(t *testing.T, slots1, mem1 string, used1 int, usedMB1 int64, slots2, mem2 string, used2 int, usedMB2, need int64, connected2, egress bool) {
		n1 := fleetNode("n1", map[string]string{spec.LabelPrefix + "sandbox.slots": slots1, spec.LabelPrefix + "sandbox.memory_mb": mem1})
		n2 := fleetNode("n2", map[string]string{spec.LabelPrefix + "sandbox.slots": slots2, spec.LabelPrefix + "sandbox.memory_mb": mem2, spec.EgressLabel: "true"})
		n2.Connected = connected2
		tpl := Template{Runtime: spec.RuntimeRunc, Network: spec.NetworkNone, Limits: spec.Limits{MemoryMB: need}}
		if egress {
			tpl.Network = spec.NetworkEgress
		}
		load := map[string]hostLoad{"n1": {used1, usedMB1}, "n2": {used2, usedMB2}}
		got, err := placeHost([]nodes.Node{n1, n2}, load, tpl)
		if err != nil {
			if errs.CodeOf(err) != errs.InvalidState {
				t.Fatalf("refusal is not INVALID_STATE: %v", err)
			}
			return
		}
		var n nodes.Node
		switch got {
		case "n1":
			n = n1
		case "n2":
			n = n2
		default:
			t.Fatalf("placed on %q", got)
		}
		l := load[got]
		hs := candidates([]nodes.Node{n}, tpl)
		if !n.Connected || len(hs) != 1 || l.count >= hs[0].slots || l.memoryMB+need > hs[0].memoryMB {
			t.Fatalf("placed on %s without room: %+v %+v", got, n, l)
		}
		if egress && n.Labels[spec.EgressLabel] != "true" {
			t.Fatal("egress placed on a host without the proxy")
		}
	})
}

func TestNewSandbox(t *testing.T) {
	tpl := Template{ID: "tpl_1", TenantID: "ten_a", Runtime: spec.RuntimeRunc, Lifetime: 600, MaxLifetime: 3600,
		Limits: spec.Limits{MemoryMB: 64}, Env: map[string]string{"A": "1"}, ImageDigest: "sha256:x"}
	x, c, claimed := newSandbox(tpl, "sbx_1", "n1", "idn_1", false, t0)
	if claimed != 1 || x.State != StateStarting || !x.ExpiresAt.Equal(t0.Add(600*time.Second)) || !x.MaxExpires.Equal(t0.Add(time.Hour)) ||
		c.DeadlineMS != x.ExpiresAt.UnixMilli() || c.Env["A"] != "1" || c.Warm || x.memoryMB != 64 || c.SandboxID != "sbx_1" {
		t.Fatalf("cold: %+v %+v %d", x, c, claimed)
	}
	x, c, claimed = newSandbox(tpl, "sbx_2", "n1", "idn_1", true, t0)
	if claimed != 0 || !x.ExpiresAt.Equal(x.MaxExpires) || c.DeadlineMS != x.MaxExpires.UnixMilli() || c.Env != nil || !c.Warm {
		t.Fatalf("warm: %+v %+v %d", x, c, claimed)
	}
	tpl.Env = map[string]string{}
	if _, c, _ = newSandbox(tpl, "sbx_3", "n1", "idn_1", false, t0); c.Env != nil {
		t.Fatalf("empty env is sent: %+v", c.Env)
	}
}

func TestClaimable(t *testing.T) {
	tpl := Template{Lifetime: 600}
	x := Sandbox{MaxExpires: t0.Add(600 * time.Second)}
	if !claimable(x, true, tpl, t0) || claimable(x, false, tpl, t0) || claimable(x, true, tpl, t0.Add(time.Millisecond)) {
		t.Fatal("claimable")
	}
}

func TestCheckExecAndExtend(t *testing.T) {
	run := Sandbox{State: StateRunning, ExpiresAt: t0.Add(10 * time.Minute), MaxExpires: t0.Add(time.Hour)}
	if err := checkExec(run, t0); err != nil {
		t.Fatal(err)
	}
	if err := checkExec(run, t0.Add(9*time.Minute+time.Second)); errs.CodeOf(err) != errs.InvalidState {
		t.Fatalf("near expiry: %v", err)
	}
	warm := run
	warm.State = StateWarm
	if err := checkExec(warm, t0); errs.CodeOf(err) != errs.InvalidState || !strings.Contains(err.Error(), "the sandbox is warm") {
		t.Fatalf("warm: %v", err)
	}
	if d, err := extendTo(run, time.Hour, t0); err != nil || !d.Equal(t0.Add(time.Hour)) {
		t.Fatalf("to the maximum: %v %v", d, err)
	}
	for _, by := range []time.Duration{59 * time.Second, time.Hour + time.Second} {
		if _, err := extendTo(run, by, t0); errs.CodeOf(err) != errs.InvalidInput {
			t.Fatalf("by %v: %v", by, err)
		}
	}
	if _, err := extendTo(warm, time.Hour, t0); errs.CodeOf(err) != errs.InvalidState {
		t.Fatalf("extend warm: %v", err)
	}
}

func TestStates(t *testing.T) {
	for _, s := range []State{StateStarting, StateWarm, StateClaiming, StateRunning} {
		if !s.Live() || s.Final() {
			t.Fatalf("%s", s)
		}
	}
	for _, s := range []State{StateDeleted, StateExpired, StateFailed} {
		if s.Live() || !s.Final() {
			t.Fatalf("%s", s)
		}
	}
}

// TestDecideAdopted: a sandbox a node adopted is confirmed only when the
// control plane records it live on that node; unknown, another node's,
// and deleted, expired or failed ones are ordered killed, by reason.
func TestDecideAdopted(t *testing.T) {
	for _, c := range []struct {
		found   bool
		host    string
		state   State
		confirm bool
		why     string
	}{
		{true, "n1", StateRunning, true, ""},
		{true, "n1", StateWarm, true, ""},
		{true, "n1", StateStarting, true, ""},
		{true, "n1", StateClaiming, true, ""},
		{false, "", "", false, AdoptKillUnknown},
		{true, "n2", StateRunning, false, AdoptKillOtherNode},
		{true, "n1", StateDeleted, false, AdoptKillNotLive},
		{true, "n1", StateExpired, false, AdoptKillNotLive},
		{true, "n1", StateFailed, false, AdoptKillNotLive},
	} {
		confirm, why := decideAdopted("n1", c.found, c.host, c.state)
		if confirm != c.confirm || why != c.why {
			t.Errorf("%+v: got %v %q", c, confirm, why)
		}
	}
}
