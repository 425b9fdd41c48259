package grant

import (
	"slices"
	"strings"
	"time"
)

// Policy is what a set of grants lets the CP do at one instant: the union
// of the current grants' allows minus the union of their denies, and the
// models and servers they name. The zero Policy allows nothing.
type Policy struct {
	families []string        // effective families, sorted
	models   map[string]bool // normalised model names
	reach    map[string]bool // service-slot server names
}

// Effective combines docs (already verified, for this bastion) at now. A
// doc outside its validity window is ignored whole. A doc that fails the
// shape checks Verify makes contributes no allow, model or server, but
// its denies of known families still apply (fail closed). A deny in any
// doc removes that family whatever other docs allow.
func Effective(docs []Doc, now time.Time) Policy {
	allowed := map[string]bool{}
	denied := map[string]bool{}
	p := Policy{models: map[string]bool{}, reach: map[string]bool{}}
	for _, d := range docs {
		if !current(d, now) {
			continue
		}
		for _, f := range d.Deny {
			denied[f] = true
		}
		if r, _ := check(d); r != "" {
			continue
		}
		for _, f := range d.Allow {
			allowed[f] = true
		}
		for _, m := range d.Models {
			p.models[NormalizeModel(m)] = true
		}
		for _, s := range d.Reach {
			p.reach[s] = true
		}
	}
	for _, f := range Families() {
		if allowed[f] && !denied[f] {
			p.families = append(p.families, f)
		}
	}
	return p
}

// Allows reports whether family is allowed (and denied by no grant).
func (p Policy) Allows(family string) bool {
	return slices.Contains(p.families, family)
}

// ModelInScope reports whether the CP may use model through the inference
// forwards: inference is allowed and some current grant names the model.
// Names compare exactly after NormalizeModel, so an alias ollama would
// also resolve ("library/x", another letter case) is out of scope.
func (p Policy) ModelInScope(model string) bool {
	return p.Allows(FamilyInference) && validModel(model) && p.models[NormalizeModel(model)]
}

// Models returns the models in scope, normalised, sorted and without
// duplicates; none if inference is not allowed.
func (p Policy) Models() []string {
	if !p.Allows(FamilyInference) {
		return nil
	}
	out := make([]string, 0, len(p.models))
	for m := range p.models {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Reaches reports whether the CP may reach the service-slot server
// named server: services is allowed and some current grant names it.
func (p Policy) Reaches(server string) bool {
	return p.Allows(FamilyServices) && p.reach[server]
}

// Families returns the effective families, sorted.
func (p Policy) Families() []string {
	return slices.Clone(p.families)
}

// NormalizeModel gives an ollama model name its implicit tag: "name"
// becomes "name:latest"; a name that has a tag (a ':' after the last '/')
// is returned as it is.
func NormalizeModel(model string) string {
	if strings.LastIndexByte(model, ':') > strings.LastIndexByte(model, '/') {
		return model
	}
	return model + ":latest"
}
