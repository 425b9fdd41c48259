package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/kinds"
)

// Refusal reasons of command creation; each is the start of the refusal's
// message, so a caller can match it.
const (
	// ReasonKindOwned: the kind belongs to a module (kinds.Owner) and is
	// created only by that module, never on the generic command path.
	ReasonKindOwned = "kind-owned-by-module"
	// ReasonKindNotAllowedForRole: the node's certificate role does not run
	// the kind (kinds.AllowedForRole); the node would refuse it too.
	ReasonKindNotAllowedForRole = "kind-not-allowed-for-role"
)

// ErrSecretNotFound is the one answer to a payload naming a secret
// reference the command may not use: missing, deleted, malformed, or
// another tenant's. It is the same value (code and message bytes) in every
// case, so a caller cannot tell another tenant's secret from a missing one.
var ErrSecretNotFound = errs.New(errs.NotFound, "secret not found")

// SecretChecker answers whether a secret reference exists for a scope
// tenant; the secrets module implements it. The commands module never
// reads the secrets table itself.
type SecretChecker interface {
	// SecretExists reports whether ref names a live secret of scopeTenant
	// (false, not an error, for another tenant's or a malformed ref).
	SecretExists(ctx context.Context, scopeTenant, ref string) (bool, error)
}

// checkKind refuses an unknown kind, and a kind that module may not create:
// the generic path (module "") creates no module's kind, and a module
// creates only its own kinds.
func checkKind(kind, module string) error {
	if !kinds.Known(kind) {
		return errs.New(errs.InvalidInput, "kind: unknown command kind")
	}
	owner := kinds.Owner(kind)
	switch {
	case owner == module:
		return nil
	case owner != "":
		return errs.New(errs.InvalidInput, ReasonKindOwned+": kind "+kind+" is created only through the "+owner+" methods")
	default:
		return errs.New(errs.InvalidInput, "kind: "+kind+" is not a kind of the "+module+" module")
	}
}

// checkRole refuses a kind the node's role does not run.
func checkRole(role, kind string) error {
	if kinds.AllowedForRole(role, kind) {
		return nil
	}
	return errs.New(errs.InvalidInput, ReasonKindNotAllowedForRole+": a node of role "+role+" does not run "+kind)
}

// secretScheme starts a secret reference.
const secretScheme = "secret://"

// SecretRefs returns every secret reference a JSON payload names, in any
// string (object keys included), in order of appearance, without
// duplicates. A string holding the scheme anywhere counts: the text after
// it up to the first character a reference cannot hold is the reference,
// and the scheme is matched without regard to case, so a spelling the
// broker would not parse is still checked (and refused, as missing).
func SecretRefs(payload []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var out []string
	seen := map[string]bool{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("commands: payload: %w", err)
		}
		str, ok := tok.(string)
		if !ok {
			continue
		}
		for _, ref := range refsIn(str) {
			if !seen[ref] {
				seen[ref] = true
				out = append(out, ref)
			}
		}
	}
}

// refsIn returns the references one string names.
func refsIn(str string) []string {
	var out []string
	for i := 0; ; {
		k := indexSchemeFold(str[i:])
		if k < 0 {
			return out
		}
		start := i + k
		end := start + len(secretScheme)
		for end < len(str) && refChar(str[end]) {
			end++
		}
		out = append(out, str[start:end])
		i = start + len(secretScheme)
	}
}

// indexSchemeFold returns the index of the first secretScheme in s,
// matched without regard to ASCII case, or -1. It folds bytes in place
// rather than searching a lowercased copy: strings.ToLower changes the
// length of some letters (U+023A grows, the Kelvin sign shrinks), so the
// copy's indexes would not be the string's.
func indexSchemeFold(s string) int {
	for i := 0; i+len(secretScheme) <= len(s); i++ {
		j := 0
		for j < len(secretScheme) && asciiLower(s[i+j]) == secretScheme[j] {
			j++
		}
		if j == len(secretScheme) {
			return i
		}
	}
	return -1
}

// asciiLower lowers an ASCII capital letter; any other byte is itself.
func asciiLower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// refChar reports whether c can be part of a reference's tenant or name.
func refChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/'
}

// checkSecrets refuses a payload that names a secret reference a command
// of tenant may not use: each must be a live secret of tenant itself (a
// fleet secret, secret://root/…, only on a root-tenant node). Every refusal
// is ErrSecretNotFound.
func (s *Service) checkSecrets(ctx context.Context, tenant string, refs []string) error {
	if len(refs) == 0 {
		return nil
	}
	if s.secrets == nil {
		return errs.New(errs.InvalidConfig, "the secrets module is not running")
	}
	for _, ref := range refs {
		ok, err := s.secrets.SecretExists(ctx, tenant, ref)
		if err != nil {
			return fmt.Errorf("commands: check secret reference: %w", err)
		}
		if !ok {
			s.log.Info("command refused: secret reference", "tenant_id", tenant)
			return ErrSecretNotFound
		}
	}
	return nil
}
