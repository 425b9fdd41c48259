package api

import (
	"fmt"
	"strings"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// denied is the ACCESS_DENIED answer to a call: it names the action, the
// object the caller named (a resource, a tenant) and the next step. It is
// built only from the method, the caller's own identity and what the input
// named, never from what the envelope found, so a resource that does not
// exist, one outside the caller's reach and one its roles do not allow
// read exactly alike: there is still no existence oracle.
func denied(c *Caller, action string, t Target) error {
	var b strings.Builder
	b.WriteString(action)
	if obj := named(t); obj != "" {
		b.WriteString(" on " + obj)
	}
	keyScoped := ""
	if len(c.Scopes) > 0 {
		keyScoped = " (within this API key's scopes)"
	}
	if c.Root() {
		fmt.Fprintf(&b, " is not allowed: no role of yours%s allows it", keyScoped)
	} else {
		fmt.Fprintf(&b, " is not allowed: it does not exist, it is outside your tenant %s, or no role of yours%s allows it", c.HomeTenant, keyScoped)
	}
	fmt.Fprintf(&b, "; ask an admin of tenant %s for a role with %s", c.HomeTenant, action)
	if keyScoped != "" {
		b.WriteString(", or use a key whose scopes include it")
	}
	return errs.New(errs.AccessDenied, b.String())
}

// named is the object the input named: "node n_1", "tenant t_2", or
// "node n_1 in tenant t_2" ("" when it named none).
func named(t Target) string {
	var parts []string
	if t.Kind != "" {
		parts = append(parts, t.Kind+" "+t.ID)
	}
	if t.Tenant != "" {
		if len(parts) > 0 {
			parts = append(parts, "in")
		}
		parts = append(parts, "tenant "+t.Tenant)
	}
	return strings.Join(parts, " ")
}
