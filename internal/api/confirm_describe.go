package api

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// heldBack marks the methods of ms that describe themselves for an
// agent's person (see confirm.go): sandboxes.create (when m has the
// sandbox module), sandboxes.extend, commands.create, commands.fanout
// and batches.create.
func heldBack(m Modules, ms []Method) []Method {
	describers := map[string]describer{
		"sandboxes.extend": describeExtend,
		"commands.create":  describeCommand,
		"commands.fanout":  describeFanout,
		"batches.create":   describeBatch,
		// A command in an approved batch runs what its quorum signed, but
		// a kind held back is held for an agent here too.
		"commands.createInBatch": describeCommandInBatch,
	}
	if m.Sandboxes != nil {
		describers["sandboxes.create"] = describeSandbox(m)
	}
	for i := range ms {
		if d := describers[ms[i].Name]; d != nil {
			ms[i].describe = d
		}
	}
	return ms
}

// describeSandbox describes sandboxes.create by the template the sandbox
// would start under, as the control plane holds it (image, runtime,
// lifetime, limits, network, env with secrets by reference and other
// values by size and SHA-256), so a template changed after the approval
// no longer matches it. A restore is described by its checkpoint's own
// template with the checkpoint's image, runtime, network and user (what
// CreateFrom starts), and the checkpoint's digest. A template or
// checkpoint the caller cannot read refuses the call here, as the method
// would: nothing unheld gets through.
func describeSandbox(m Modules) describer {
	return func(ctx context.Context, _ *Server, c *Caller, in any) (string, bool, error) {
		req := in.(apitypes.SandboxCreateIn)
		var b strings.Builder
		var t sandboxes.Template
		var err error
		if req.FromCheckpoint != "" {
			var ck sandboxes.Checkpoint
			if t, ck, err = m.Sandboxes.RestoreTemplate(ctx, c.ActingTenant, c.Identity, req.Template, req.FromCheckpoint); err != nil {
				return "", false, err
			}
			fmt.Fprintf(&b, "restores checkpoint: %s (%s, memory %t)\n", clip(ck.ID), clip(ck.Digest), ck.MemoryDigest != "")
		} else if t, err = m.Sandboxes.Template(ctx, c.Scope(), req.Template); err != nil {
			return "", false, err
		}
		limits, _ := json.Marshal(t.Limits)
		fmt.Fprintf(&b, "template: %s (%s)\n", clip(t.Name), t.ID)
		fmt.Fprintf(&b, "image: %s (%s)\n", clip(t.Image), clip(t.ImageDigest))
		fmt.Fprintf(&b, "runtime: %s\n", clip(t.Runtime))
		fmt.Fprintf(&b, "lifetime: %d s (at most %d s)\n", t.Lifetime, t.MaxLifetime)
		fmt.Fprintf(&b, "limits: %s\n", clip(string(limits)))
		fmt.Fprintf(&b, "network: %s\nroot: %t\n", clip(t.Network), t.Root)
		b.WriteString(envLines(t.Env))
		return b.String(), true, nil
	}
}

// envLines describes env: names sorted, a secret by its reference, any
// other value by size and SHA-256.
func envLines(env map[string]string) string {
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		v := env[k]
		if tenant, name, ok := spec.SecretRef(v); ok {
			fmt.Fprintf(&b, "env %s: secret %s/%s\n", clip(k), clip(tenant), clip(name))
			continue
		}
		fmt.Fprintf(&b, "env %s: %s\n", clip(k), bytesLine([]byte(v)))
	}
	return b.String()
}

// describeExtend describes sandboxes.extend.
func describeExtend(_ context.Context, _ *Server, _ *Caller, in any) (string, bool, error) {
	req := in.(apitypes.SandboxExtendIn)
	return fmt.Sprintf("sandbox: %s\nextend by: %d s\n", clip(req.ID), req.Seconds), true, nil
}

// confirmKind reports whether kind is held back by the tenant the call
// acts in or by the agent's own tenant (an agent acting in a tenant below
// its own is held by its own tenant's list too).
func confirmKind(ctx context.Context, s *Server, c *Caller, kind string) (bool, error) {
	for _, tenant := range []string{c.ActingTenant, c.HomeTenant} {
		if tenant == "" {
			continue
		}
		kinds, err := s.deps.IAM.ConfirmKinds(ctx, tenant)
		if err != nil || slices.Contains(kinds, kind) {
			return err == nil, err
		}
	}
	return false, nil
}

// describeCommandInBatch describes commands.createInBatch of a kind held
// back: as commands.create, and the batch.
func describeCommandInBatch(ctx context.Context, s *Server, c *Caller, in any) (string, bool, error) {
	req := in.(apitypes.CommandInBatchIn)
	if held, err := confirmKind(ctx, s, c, req.Kind); err != nil || !held {
		return "", false, err
	}
	return fmt.Sprintf("batch: %s\nnode: %s\nkind: %s\npayload: %s\nttl: %d s\n", clip(req.BatchID), clip(req.NodeID), clip(req.Kind), bytesLine(req.Payload), req.TTLSeconds), true, nil
}

// describeCommand describes commands.create of a kind the tenant holds
// back: node, kind, payload by size and SHA-256, lifetime.
func describeCommand(ctx context.Context, s *Server, c *Caller, in any) (string, bool, error) {
	req := in.(apitypes.CommandIn)
	if held, err := confirmKind(ctx, s, c, req.Kind); err != nil || !held {
		return "", false, err
	}
	return fmt.Sprintf("node: %s\nkind: %s\npayload: %s\nttl: %d s\n", clip(req.NodeID), clip(req.Kind), bytesLine(req.Payload), req.TTLSeconds), true, nil
}

// describeFanout describes commands.fanout of a kind the tenant holds
// back (fanoutText).
func describeFanout(ctx context.Context, s *Server, c *Caller, in any) (string, bool, error) {
	req := in.(apitypes.FanoutIn)
	if held, err := confirmKind(ctx, s, c, req.Kind); err != nil || !held {
		return "", false, err
	}
	return fanoutText(req), true, nil
}

// fanoutText is a fan-out's text: the nodes named and the labels (sorted),
// kind, payload and lifetime.
func fanoutText(req apitypes.FanoutIn) string {
	nodes := slices.Clone(req.NodeIDs)
	sort.Strings(nodes)
	labels := make([]string, 0, len(req.Labels))
	for k, v := range req.Labels {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	return fmt.Sprintf("nodes: %s\nlabels: %s\nkind: %s\npayload: %s\nttl: %d s\n",
		listLine(nodes), listLine(labels), clip(req.Kind), bytesLine(req.Payload), req.TTLSeconds)
}

// describeBatch describes batches.create: its leaves (node, kind,
// payload by size and SHA-256, unbound) in order, one a line, and its
// lifetime.
func describeBatch(_ context.Context, _ *Server, _ *Caller, in any) (string, bool, error) {
	req := in.(apitypes.BatchCreateIn)
	var b strings.Builder
	raw := make([]string, len(req.Leaves))
	fmt.Fprintf(&b, "leaves: %d\n", len(req.Leaves))
	for i, l := range req.Leaves {
		raw[i] = fmt.Sprintf("%s %s %s %t", l.NodeID, l.Kind, bytesLine(l.Payload), l.Unbound)
		if i < maxListed {
			fmt.Fprintf(&b, "leaf %d: node %s kind %s payload %s unbound %t\n", i, clip(l.NodeID), clip(l.Kind), bytesLine(l.Payload), l.Unbound)
		}
	}
	if r := rest(raw); r != "" {
		fmt.Fprintf(&b, "leaves not shown:%s\n", r)
	}
	fmt.Fprintf(&b, "expires in: %d s\n", req.ExpiresSeconds)
	return b.String(), true, nil
}
