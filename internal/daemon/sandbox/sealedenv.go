package sandbox

import (
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// A sandbox's env as signed holds three kinds of values: plain ones
// (commands from before sealing), secret references (secret://TENANT/NAME)
// and sealed values (spec.SealedEnvPrefix). The host resolves the last
// two through the broker for the command it runs (driver.SecretsFrom):
// a reference's value, or the sandbox's env data key
// (spec.EnvKeyRef), with which it opens every sealed value. The results
// live in Host.secretVals only, keyed by the value as signed; the state
// file and the kept signed commands hold the references and the sealed
// form, never a value. A value that cannot be had is refused by reason
// (secret-unavailable, env-unavailable): nothing starts with a variable
// missing.

// heldValue returns the reason a program is refused when env value v is
// one the host must hold resolved in memory and does not: a secret
// reference (secret-unavailable) or anything that starts like a sealed
// value (env-unavailable, even one that does not parse: it never reaches
// a program as it stands). It returns "" for a plain value.
func heldValue(v string) string {
	if !spec.FromBroker(v) {
		return ""
	}
	if _, _, ref := spec.SecretRef(v); ref {
		return ReasonSecretUnavailable
	}
	return spec.ReasonEnvUnavailable
}

// resolveEnv fetches, through the broker and for the command being run
// (driver.SecretsFrom), the value of every secret reference env names
// and the env key that opens its sealed values, and returns the values
// keyed by the env value as signed. Values in held are skipped; may, when
// not nil, says which references this command may fetch (an exec's
// env_refs). It logs only the sandbox, and a variable's name.
func (h *Host) resolveEnv(ctx context.Context, id string, env, held map[string]string, may func(ref string) bool) (map[string]string, error) {
	var vals map[string]string
	keys := map[string]pki.KEK{}
	defer func() {
		for t := range keys {
			keys[t] = pki.KEK{}
		}
	}()
	for _, name := range slices.Sorted(maps.Keys(env)) {
		v := env[name]
		why := heldValue(v)
		if _, ok := held[v]; ok || why == "" {
			continue
		}
		if _, ok := vals[v]; ok {
			continue
		}
		var val string
		var err error
		if why == ReasonSecretUnavailable {
			val, err = h.fetchSecret(ctx, id, v, may)
		} else {
			val, err = h.openSealed(ctx, id, name, v, keys, may)
		}
		if err != nil {
			return nil, err
		}
		if vals == nil {
			vals = map[string]string{}
		}
		vals[v] = val
	}
	return vals, nil
}

// fetchSecret fetches secret reference ref for sandbox id.
func (h *Host) fetchSecret(ctx context.Context, id, ref string, may func(string) bool) (string, error) {
	fetch := brokerFor(ctx, ref, may)
	if fetch == nil {
		h.cfg.Log.Warn("sandbox secret env without a broker", "sandbox_id", id)
		return "", errors.New(ReasonSecretUnavailable)
	}
	b, err := fetch(ctx, ref)
	if err != nil {
		h.cfg.Log.Warn("sandbox secret env refused", "sandbox_id", id)
		return "", errors.New(ReasonSecretUnavailable)
	}
	defer clear(b)
	return string(b), nil
}

// brokerFor is the broker path of the command being run
// (driver.SecretsFrom) when it may fetch ref (may nil: any), else nil.
func brokerFor(ctx context.Context, ref string, may func(string) bool) driver.SecretFetcher {
	if may != nil && !may(ref) {
		return nil
	}
	return driver.SecretsFrom(ctx)
}

// openSealed opens sealed value v of variable name of sandbox id, with the
// sandbox's env key for the value's tenant (fetched once per tenant into
// keys). Anything that fails is env-unavailable.
func (h *Host) openSealed(ctx context.Context, id, name, v string, keys map[string]pki.KEK, may func(string) bool) (string, error) {
	refused := errors.New(spec.ReasonEnvUnavailable)
	tenant, ok := spec.SealedEnvTenant(v)
	if !ok {
		h.cfg.Log.Warn("sandbox sealed env value malformed", "sandbox_id", id, "variable", name)
		return "", refused
	}
	k, ok := keys[tenant]
	if !ok {
		ref := spec.EnvKeyRef(tenant, id)
		fetch := brokerFor(ctx, ref, may)
		if fetch == nil {
			h.cfg.Log.Warn("sandbox sealed env without a broker", "sandbox_id", id)
			return "", refused
		}
		b, err := fetch(ctx, ref)
		if err != nil || len(b) != len(k) {
			h.cfg.Log.Warn("sandbox env key refused", "sandbox_id", id)
			clear(b)
			return "", refused
		}
		copy(k[:], b)
		clear(b)
		keys[tenant] = k
	}
	plain, err := spec.OpenEnvValue(k, id, name, v)
	if err != nil {
		h.cfg.Log.Warn("sandbox sealed env value does not open", "sandbox_id", id, "variable", name)
		return "", refused
	}
	return plain, nil
}

// resolveForExec resolves, for exec e (whose env_refs say what it may
// fetch), the values of its sandbox's env this process does not hold,
// and keeps them in memory for the sandbox's later programs.
func (h *Host) resolveForExec(ctx context.Context, e spec.Exec) error {
	h.mu.Lock()
	st, ok := h.sbx[e.SandboxID]
	var env, held map[string]string
	if ok {
		env, held = maps.Clone(st.Env), maps.Clone(h.secretVals[e.SandboxID])
	}
	h.mu.Unlock()
	if !ok {
		return errors.New("sandbox-not-found")
	}
	vals, err := h.resolveEnv(ctx, e.SandboxID, env, held, func(ref string) bool { return slices.Contains(e.EnvRefs, ref) })
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, still := h.sbx[e.SandboxID]; !still {
		return errors.New("sandbox-not-found")
	}
	if h.secretVals[e.SandboxID] == nil {
		h.secretVals[e.SandboxID] = map[string]string{}
	}
	maps.Copy(h.secretVals[e.SandboxID], vals)
	return nil
}
