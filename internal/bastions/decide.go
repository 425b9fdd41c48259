package bastions

import (
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// Grant lifetimes.
const (
	DefaultGrantTTL = 24 * time.Hour
	MaxGrantTTL     = 30 * 24 * time.Hour
)

// Grant list caps (the same as the bastion's verifier: a grant it would
// refuse is never signed).
const (
	MaxModels = 16
	MaxReach  = 64
)

// Reasons a grant request is refused (INVALID_INPUT).
const (
	ReasonUnknownFamily = "grant-unknown-family" // a family in allow or deny that is not a known one
	ReasonEmptyGrant    = "grant-empty"          // neither allow nor deny names a family
	ReasonDuplicate     = "grant-duplicate"      // a list names one entry twice
	ReasonBadModel      = "grant-model"          // a model name that is not 1..128 printable characters without spaces
	ReasonBadReach      = "grant-reach"          // a reach name that is not a server name
	ReasonTooMany       = "grant-too-many"       // over MaxModels models or MaxReach reach names
	ReasonBadTTL        = "grant-ttl"            // a lifetime over MaxGrantTTL, or negative
)

// knownFamilies are the families a grant may name (grant's constants).
var knownFamilies = []string{grant.FamilyEgress, grant.FamilyInference, grant.FamilyModels, grant.FamilyServices}

var (
	modelRE = regexp.MustCompile(`^[\x21-\x7e]{1,128}$`)
	reachRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
)

// GrantRequest is what an operator asks a grant to say.
type GrantRequest struct {
	Allow, Deny, Models, Reach []string
	// TTL is the grant's lifetime (0: DefaultGrantTTL).
	TTL time.Duration
}

// CheckGrant decides a grant request and returns it with its lifetime
// filled in, or a Refusal (INVALID_INPUT) naming the first entry at fault.
// It is pure.
func CheckGrant(r GrantRequest) (GrantRequest, error) {
	if r.TTL == 0 {
		r.TTL = DefaultGrantTTL
	}
	if r.TTL < 0 || r.TTL > MaxGrantTTL {
		return r, refuse(errs.InvalidInput, ReasonBadTTL, "ttl: at most 30 days")
	}
	if len(r.Allow) == 0 && len(r.Deny) == 0 {
		return r, refuse(errs.InvalidInput, ReasonEmptyGrant, "allow or deny at least one family")
	}
	for _, l := range []struct {
		field string
		vals  []string
	}{{"allow", r.Allow}, {"deny", r.Deny}} {
		for _, f := range l.vals {
			if !slices.Contains(knownFamilies, f) {
				return r, refuse(errs.InvalidInput, ReasonUnknownFamily, fmt.Sprintf("%s: unknown family %q (known: inference, models, services, egress)", l.field, f))
			}
		}
	}
	if len(r.Models) > MaxModels || len(r.Reach) > MaxReach {
		return r, refuse(errs.InvalidInput, ReasonTooMany, "at most 16 models and 64 reach names")
	}
	for _, m := range r.Models {
		if !modelRE.MatchString(m) {
			return r, refuse(errs.InvalidInput, ReasonBadModel, fmt.Sprintf("model %q: 1 to 128 printable characters, no spaces", m))
		}
	}
	for _, s := range r.Reach {
		if !reachRE.MatchString(s) {
			return r, refuse(errs.InvalidInput, ReasonBadReach, fmt.Sprintf("reach %q: lowercase letters, digits and '-', at most 63", s))
		}
	}
	return r, checkDuplicates(r)
}

// checkDuplicates refuses a list that names one entry twice.
func checkDuplicates(r GrantRequest) error {
	for _, l := range []struct {
		field string
		vals  []string
	}{{"allow", r.Allow}, {"deny", r.Deny}, {"model", r.Models}, {"reach", r.Reach}} {
		seen := map[string]bool{}
		for _, v := range l.vals {
			if seen[v] {
				return refuse(errs.InvalidInput, ReasonDuplicate, fmt.Sprintf("%s %q named twice", l.field, v))
			}
			seen[v] = true
		}
	}
	return nil
}

// EffectiveFamilies returns the families live grants leave allowed: the
// union of their allows less the union of their denies (a deny in any
// grant beats every allow), sorted. Expired grants count for nothing.
func EffectiveFamilies(docs []grant.Doc, now time.Time) []string {
	fs := grant.Effective(docs, now).Families()
	if fs == nil {
		return []string{}
	}
	return fs
}
