package sandboxes

import (
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// The module's pure decisions: no database, no clock (the caller passes
// now). Methods load rows, call one of these, then write.

// Template defaults, applied to the zero fields of a TemplateIn.
const (
	defaultCPUMillis   = 1000
	defaultMemoryMB    = 256
	defaultPids        = 256
	defaultDiskMB      = 256
	defaultLifetime    = 3600  // seconds
	defaultMaxLifetime = 86400 // seconds
	maxMaxLifetime     = 7 * 86400
	minLifetime        = 120
	maxEnvJSON         = 16 << 10
)

// newTemplate applies the defaults to in and checks it, for a template
// of tenant made by actor at now; the image digest is filled in later
// (the template's image must exist in the tenant). It answers
// INVALID_INPUT saying which field is wrong, and the encoded environment
// and labels the row stores.
func newTemplate(in TemplateIn, id, tenant, actor string, now time.Time) (t Template, envJSON, labelsJSON []byte, err error) {
	t = Template{ID: id, TenantID: tenant, Name: in.Name, Image: in.Image, Runtime: in.Runtime, Limits: in.Limits,
		Lifetime: in.Lifetime, MaxLifetime: in.MaxLifetime, Network: in.Network, Root: in.Root, Env: in.Env, Labels: in.Labels, Warm: in.Warm,
		CreatedBy: actor, CreatedAt: now.UTC()}
	templateDefaults(&t)
	if msg := checkTemplate(t); msg != "" {
		return Template{}, nil, nil, errs.New(errs.InvalidInput, msg)
	}
	envJSON, _ = json.Marshal(t.Env)
	if len(envJSON) > maxEnvJSON {
		return Template{}, nil, nil, errs.New(errs.InvalidInput, "env: at most 16 KiB")
	}
	if msg := checkLabels(t.Labels); msg != "" {
		return Template{}, nil, nil, errs.New(errs.InvalidInput, msg)
	}
	labelsJSON, _ = json.Marshal(t.Labels)
	return t, envJSON, labelsJSON, nil
}

// templateDefaults fills t's zero fields.
func templateDefaults(t *Template) {
	def := func(p *int64, v int64) {
		if *p == 0 {
			*p = v
		}
	}
	def(&t.Limits.CPUMillis, defaultCPUMillis)
	def(&t.Limits.MemoryMB, defaultMemoryMB)
	def(&t.Limits.Pids, defaultPids)
	def(&t.Limits.DiskMB, defaultDiskMB)
	def(&t.Lifetime, defaultLifetime)
	def(&t.MaxLifetime, defaultMaxLifetime)
	if t.Runtime == "" {
		t.Runtime = spec.RuntimeRunc
	}
	if t.Network == "" {
		t.Network = spec.NetworkNone
	}
	if t.Env == nil {
		t.Env = map[string]string{}
	}
	if t.Labels == nil {
		t.Labels = map[string]string{}
	}
}

// checkTemplate returns what is wrong with a defaulted template's
// fields, or "".
func checkTemplate(t Template) string {
	switch {
	case !validName(t.Name):
		return "name: 1 to 63 of a-z 0-9 . _ -"
	case t.Runtime != spec.RuntimeRunc && t.Runtime != spec.RuntimeRunsc && t.Runtime != spec.RuntimeSim:
		return "runtime: runc, runsc or sim"
	case t.Network != spec.NetworkNone && t.Network != spec.NetworkEgress:
		return "network: none or egress"
	case t.Network == spec.NetworkEgress && t.Runtime == spec.RuntimeRunsc:
		return "network: egress is not available on runsc (use runc, or network none)"
	case t.Lifetime < minLifetime || t.MaxLifetime < t.Lifetime || t.MaxLifetime > maxMaxLifetime:
		return "lifetime_seconds: at least 120, and at most max_lifetime_seconds (at most 7 days)"
	case t.Warm < 0 || t.Warm > MaxWarm:
		return "warm: 0 to 32"
	}
	if err := t.Limits.Validate(); err != nil {
		return err.Error()
	}
	if err := spec.ValidEnv(t.Env); err != nil {
		return err.Error()
	}
	return ""
}

// checkLabels returns what is wrong with a template's labels, or "".
func checkLabels(labels map[string]string) string {
	for k, v := range labels {
		if strings.HasPrefix(k, spec.LabelPrefix) || k == "" || len(k) > 63 || len(v) > 63 {
			return "labels: keys under runtime. are bcd's; keys and values up to 63 bytes"
		}
	}
	return ""
}

// hostLoad is what a host's live sandboxes hold.
type hostLoad struct {
	count    int
	memoryMB int64
}

// host is a candidate for placement.
type host struct {
	id       string
	slots    int
	memoryMB int64
	hostLoad
}

// placeHost picks, among ns, a connected fleet host (role node, of the
// root tenant) whose bcd-set labels advertise t's runtime (and egress
// when t needs it), whose other labels match t's, and that has a free
// slot and memory for t after load; the least loaded wins, ties by id.
func placeHost(ns []nodes.Node, load map[string]hostLoad, t Template) (string, error) {
	cands := candidates(ns, t)
	if len(cands) == 0 {
		return "", errs.New(errs.InvalidState, "no connected host has the "+t.Runtime+" runtime and the template's labels")
	}
	for _, h := range cands {
		h.hostLoad = load[h.id]
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].count != cands[j].count {
			return cands[i].count < cands[j].count
		}
		return cands[i].id < cands[j].id
	})
	for _, h := range cands {
		if h.count < h.slots && h.hostLoad.memoryMB+t.Limits.MemoryMB <= h.memoryMB {
			return h.id, nil
		}
	}
	return "", errs.New(errs.InvalidState, "no host has capacity for the template")
}

// candidates are the hosts of ns that could run t, capacity aside.
func candidates(ns []nodes.Node, t Template) []*host {
	var out []*host
	for _, n := range ns {
		if !n.Connected || n.Role != pki.RoleNode || !iam.IsRoot(n.TenantID) || n.Labels[spec.RuntimeLabel(t.Runtime)] != "true" {
			continue
		}
		// An egress sandbox needs a host that wires the egress proxy.
		ok := t.Network != spec.NetworkEgress || n.Labels[spec.EgressLabel] == "true"
		for k, v := range t.Labels {
			if n.Labels[k] != v {
				ok = false
			}
		}
		slots, _ := strconv.Atoi(n.Labels[spec.LabelPrefix+"sandbox.slots"])
		mem, _ := strconv.ParseInt(n.Labels[spec.LabelPrefix+"sandbox.memory_mb"], 10, 64)
		if !ok || slots <= 0 || mem <= 0 {
			continue
		}
		out = append(out, &host{id: n.ID, slots: slots, memoryMB: mem})
	}
	return out
}

// newSandbox plans a sandbox of t with id on node, made by actor at now
// (warm: unclaimed, living to the template's maximum, with no tenant
// environment): its row, the signed create its host gets, and the row's
// claimed column (0 warm, 1 otherwise).
func newSandbox(t Template, id, node, actor string, warm bool, now time.Time) (Sandbox, spec.Create, int) {
	x := Sandbox{ID: id, TenantID: t.TenantID, TemplateID: t.ID, NodeID: node, Runtime: t.Runtime, State: StateStarting,
		CreatedBy: actor, CreatedAt: now.UTC(), ExpiresAt: now.Add(time.Duration(t.Lifetime) * time.Second).UTC(),
		MaxExpires: now.Add(time.Duration(t.MaxLifetime) * time.Second).UTC(), memoryMB: t.Limits.MemoryMB,
		run: runsAs{image: t.ImageDigest, network: t.Network, root: t.Root}}
	c := spec.Create{SandboxID: x.ID, ImageDigest: t.ImageDigest, Runtime: t.Runtime, Limits: t.Limits, Network: t.Network, Root: t.Root,
		Env: t.Env, DeadlineMS: x.ExpiresAt.UnixMilli()}
	claimed := 1
	if warm {
		// A warm sandbox lives until the template's maximum and holds no
		// tenant environment; a claim sets both.
		c.Env, c.Warm, claimed = nil, true, 0
		x.ExpiresAt = x.MaxExpires
		c.DeadlineMS = x.ExpiresAt.UnixMilli()
	}
	if len(c.Env) == 0 {
		c.Env = nil
	}
	return x, c, claimed
}

// claimable reports whether a warm sandbox x, on a host that is
// connected or not, can be claimed for t at now: its remaining life must
// hold the template's lifetime.
func claimable(x Sandbox, connected bool, t Template, now time.Time) bool {
	return connected && x.MaxExpires.Sub(now) >= time.Duration(t.Lifetime)*time.Second
}

// checkExec decides whether sandbox x takes an exec at now.
func checkExec(x Sandbox, now time.Time) error {
	if x.State != StateRunning {
		return errs.New(errs.InvalidState, "the sandbox is "+string(x.State))
	}
	if x.ExpiresAt.Sub(now) < ExecRefuseWithin {
		return errs.New(errs.InvalidState, "the sandbox expires within a minute")
	}
	return nil
}

// extendTo decides the new expiry of sandbox x extended by by at now:
// at least a minute, never past the template's maximum.
func extendTo(x Sandbox, by time.Duration, now time.Time) (time.Time, error) {
	if x.State != StateRunning {
		return time.Time{}, errs.New(errs.InvalidState, "the sandbox is "+string(x.State))
	}
	deadline := now.Add(by)
	if by < time.Minute || deadline.After(x.MaxExpires) {
		return time.Time{}, errs.New(errs.InvalidInput, "seconds: at least 60, and not past the template's maximum lifetime ("+x.MaxExpires.Format(time.RFC3339)+")")
	}
	return deadline, nil
}

// Why the control plane orders a sandbox a node adopted killed (the audit
// row's reason).
const (
	// AdoptKillUnknown: no sandbox has the id (a database restored from
	// an earlier backup, or never ours).
	AdoptKillUnknown = "adopted-unknown"
	// AdoptKillOtherNode: the sandbox is recorded on another node.
	AdoptKillOtherNode = "adopted-other-node"
	// AdoptKillNotLive: the sandbox is recorded on this node but deleted,
	// expired or failed.
	AdoptKillNotLive = "adopted-not-live"
)

// decideAdopted is phase two of adoption: a node reports it adopted a
// sandbox; found, host and state are the sandbox's row (found false: no
// row). It is confirmed only when recorded live on that very node;
// anything else is to be killed, and the answer says why.
func decideAdopted(nodeID string, found bool, host string, state State) (confirm bool, killReason string) {
	switch {
	case !found:
		return false, AdoptKillUnknown
	case host != nodeID:
		return false, AdoptKillOtherNode
	case !state.Live():
		return false, AdoptKillNotLive
	}
	return true, ""
}
