package sandboxes

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Plain env values are sealed end to end: a command the module makes
// (a cold sandbox.create, a claim's sandbox.update) carries each plain
// value only sealed (spec.SealEnvValue) under the sandbox's env data key,
// which the secrets broker releases to the command's host while the
// command is live; the commands table, the signed body, the host's kept
// commands and state, and every log hold the sealed form only. Secret
// references stay as they are.

// sealEnvFor returns env as a payload for sandbox (of tenant) carries
// it: every value that is not exactly a secret reference sealed under
// the sandbox's env data key, nil when env is empty. Without a
// key-encryption key a plain value is refused (INVALID_CONFIG): it is
// never sent in clear.
func (s *Service) sealEnvFor(tenant, sandbox string, env map[string]string) (map[string]string, error) {
	if len(env) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(env))
	var k pki.KEK
	for name, v := range env {
		if _, _, ref := spec.SecretRef(v); ref {
			out[name] = v
			continue
		}
		if k == (pki.KEK{}) {
			if s.kek == (pki.KEK{}) {
				return nil, errs.New(errs.InvalidConfig, "sandboxes: no key-encryption key to seal the environment")
			}
			k = spec.EnvDataKey(spec.EnvKey(s.kek), tenant, sandbox)
		}
		sealed, err := spec.SealEnvValue(k, tenant, sandbox, name, v)
		if err != nil {
			return nil, err
		}
		out[name] = sealed
	}
	clear(k[:])
	return out, nil
}

// needsBroker reports whether a payload carrying env makes its host ask
// the secrets broker (a secret reference or a sealed value): such a
// command works for the sandbox's tenant (a subject command), so the
// broker releases only that tenant's secrets and env key, for it alone.
func needsBroker(env map[string]string) bool {
	for _, v := range env {
		if spec.FromBroker(v) {
			return true
		}
	}
	return false
}

// execEnvRefs returns what an exec in sandbox x may fetch through the
// broker when its host no longer holds the env's values (after a bcd
// restart): the live secret references of x's template's env and, when
// that env has a plain value, x's env key reference. A sandbox whose
// template is gone or unreadable gets none, and a deleted secret is not
// named (its exec then works only while its host still holds the values).
func (s *Service) execEnvRefs(ctx context.Context, x Sandbox) []string {
	if x.TemplateID == "" {
		return nil
	}
	ts, err := s.templates(ctx, whereTemplateRef, x.TenantID, x.TemplateID)
	if err != nil || len(ts) != 1 {
		if err != nil {
			s.log.Warn("read the template of an exec", "sandbox_id", x.ID, "err", err)
		}
		return nil
	}
	var refs []string
	for _, ref := range EnvRefs(ts[0].Env) {
		// Only live secrets: the commands module refuses an exec naming
		// a deleted one, and the host could not fetch it anyway.
		if s.secrets != nil {
			if ok, err := s.secrets.TenantSecretExists(ctx, x.TenantID, ref); err == nil && ok {
				refs = append(refs, ref)
			}
		}
	}
	for _, v := range ts[0].Env {
		if _, _, ref := spec.SecretRef(v); !ref {
			refs = append(refs, spec.EnvKeyRef(x.TenantID, x.ID))
			break
		}
	}
	slices.Sort(refs)
	return refs
}

// ReasonArgvSecretRef refuses an exec whose argv names a secret reference
// (the commands module's answer to any module command naming one).
const ReasonArgvSecretRef = "payload: secret references are not allowed in this command"

// queueExec creates exec e in sandbox x: for the sandbox's tenant (a
// subject command, commands.CreateFor) when it names env references the
// host may fetch for it, the module's own command otherwise.
func (s *Service) queueExec(ctx context.Context, actor audit.Entry, x Sandbox, e spec.Exec, timeout time.Duration) (commands.Command, error) {
	raw, err := json.Marshal(e)
	if err != nil {
		return commands.Command{}, fmt.Errorf("sandboxes: encode exec: %w", err)
	}
	if len(e.EnvRefs) == 0 {
		return s.commands.CreateOwned(ctx, kinds.ModuleSandboxes, system(actor), x.NodeID, kinds.SandboxExec, raw, timeout+time.Minute)
	}
	argv, _ := json.Marshal(e.Argv)
	if refs, err := commands.SecretRefs(argv); err != nil || len(refs) > 0 {
		// A subject exec takes references in env_refs alone: its argv
		// is refused as the module's own command refuses one, with the
		// one same answer.
		return commands.Command{}, errs.New(errs.InvalidInput, ReasonArgvSecretRef)
	}
	return s.commands.CreateFor(ctx, kinds.ModuleSandboxes, system(actor), x.TenantID, x.NodeID, kinds.SandboxExec, raw, timeout+time.Minute)
}
