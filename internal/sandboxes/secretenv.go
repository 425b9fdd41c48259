package sandboxes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// A template's environment at rest and in answers. The env column holds
// the whole environment (plain values and secret references) sealed with
// the key-encryption key under authenticated data naming the template and
// its tenant, so a sealed env copied to another template does not open.
// A secret reference (secret://TENANT/NAME) is resolved only on the host
// that runs the sandbox, through the secrets broker, for the command
// that carries the reference; its value is never in the database.

// Secrets is what the module asks the secrets module: whether tenant put
// ref itself (a live, tenant-scoped secret of tenant; another tenant's
// and every fleet secret answer false like a missing one).
type Secrets interface {
	TenantSecretExists(ctx context.Context, tenant, ref string) (bool, error)
}

// SetSecretEnv gives the module the key-encryption key that seals
// templates' environments and the secrets module that checks their
// references. Without them a template naming a secret is refused
// (INVALID_CONFIG) and environments cannot be sealed or opened.
func (s *Service) SetSecretEnv(kek pki.KEK, sec Secrets) { s.kek, s.secrets = kek, sec }

// sealedEnvPrefix starts a sealed env column; a column starting with "{"
// is a plain one written before sealing (read, never written).
const sealedEnvPrefix = "sealed:v1:"

// RedactedValue replaces a plain env value in an answer to a caller not
// allowed to manage the template.
const RedactedValue = "(redacted)"

// ReasonSecretUnknown is the refusal of a template env naming a secret
// that is not a live secret its tenant put: one answer whether the
// secret is missing, another tenant's or a fleet secret.
const ReasonSecretUnknown = "names no secret of the template's tenant"

// envAAD binds a sealed env to its template and tenant.
func envAAD(tenant, id string) []byte { return []byte("bc-template-env-v1\x00" + tenant + "\x00" + id) }

// sealEnv seals a template's env JSON for its row.
func (s *Service) sealEnv(tenant, id string, envJSON []byte) (string, error) {
	if s.kek == (pki.KEK{}) {
		return "", errs.New(errs.InvalidConfig, "templates: no key-encryption key to seal the environment")
	}
	sealed, err := pki.Seal(s.kek, envJSON, envAAD(tenant, id))
	if err != nil {
		return "", fmt.Errorf("sandboxes: seal env: %w", err)
	}
	return sealedEnvPrefix + base64.StdEncoding.EncodeToString(sealed), nil
}

// openEnv reads a template's env column.
func (s *Service) openEnv(tenant, id, col string) (map[string]string, error) {
	raw := []byte(col)
	if b64, ok := strings.CutPrefix(col, sealedEnvPrefix); ok {
		sealed, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("sandboxes: template env: %w", err)
		}
		if raw, err = pki.Open(s.kek, sealed, envAAD(tenant, id)); err != nil {
			return nil, fmt.Errorf("sandboxes: template env does not open: %w", err)
		}
		defer clear(raw)
	}
	var env map[string]string
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("sandboxes: template env: %w", err)
	}
	return env, nil
}

// EnvRefs returns the secret references env's values name, sorted, each
// once.
func EnvRefs(env map[string]string) []string {
	var out []string
	for _, v := range env {
		if _, _, ok := spec.SecretRef(v); ok && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// checkEnvSecrets refuses env when a reference it names is not a live
// secret that tenant put itself (INVALID_INPUT, ReasonSecretUnknown, the
// same for a missing, another tenant's or a fleet secret).
func (s *Service) checkEnvSecrets(ctx context.Context, tenant string, env map[string]string) error {
	refs := EnvRefs(env)
	if len(refs) == 0 {
		return nil
	}
	if s.secrets == nil {
		return errs.New(errs.InvalidConfig, "templates: the secrets module is not running")
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if _, _, ok := spec.SecretRef(env[k]); !ok {
			continue
		}
		ok, err := s.secrets.TenantSecretExists(ctx, tenant, env[k])
		if err != nil {
			return err
		}
		if !ok {
			return errs.New(errs.InvalidInput, "env "+k+": "+ReasonSecretUnknown+" (a secret://TENANT/NAME the tenant put with secrets put)")
		}
	}
	return nil
}

// Redacted returns t as a caller not allowed to manage it sees it: every
// plain env value replaced by RedactedValue, secret references as they
// are (a reference is not a value).
func Redacted(t Template) Template {
	env := make(map[string]string, len(t.Env))
	for k, v := range t.Env {
		if _, _, ok := spec.SecretRef(v); ok {
			env[k] = v
		} else {
			env[k] = RedactedValue
		}
	}
	t.Env = env
	return t
}
