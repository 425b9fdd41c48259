package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// completionTimeout bounds the API call a shell completion makes, so a
// slow or unreachable API never hangs the operator's shell.
const completionTimeout = 3 * time.Second

// argFamilies names the family of the first argument of the commands in a
// group that take an id ("ID", "NODE_ID", "REF", "[ID]" in their Use).
var argFamilies = map[string]string{
	"nodes": "node", "commands": "command", "sandbox": "sandbox", "secrets": "secret", "tenants": "tenant",
	"templates": "template", "identities": "identity", "api-keys": "api-key",
}

// flagFamilies names the family of the flags that take an id.
var flagFamilies = map[string]string{
	"node": "node", "tenant": "tenant", "parent": "tenant", "identity": "identity", "role": "role", "template": "template",
}

// addCompletions gives the commands that take ids (as an argument or a
// flag) cobra's dynamic completion: ids and names the caller can see,
// listed through the API with BC_ADDR and the caller's key. Any error
// completes nothing, silently.
func addCompletions(c *cobra.Command) {
	for _, sub := range c.Commands() {
		addCompletions(sub)
	}
	if fam, ok := argFamilies[parentName(c)]; ok && takesID(c.Use) && c.ValidArgsFunction == nil {
		c.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return complete(cmd, fam, toComplete)
		}
	}
	c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
		fam, ok := flagFamilies[f.Name]
		if !ok || f.Value.Type() != "string" && f.Value.Type() != "stringArray" {
			return
		}
		_ = c.RegisterFlagCompletionFunc(f.Name, func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			return complete(cmd, fam, toComplete)
		})
	})
}

func parentName(c *cobra.Command) string {
	if c.HasParent() {
		return c.Parent().Name()
	}
	return ""
}

// takesID reports whether a Use line's first argument is an id.
func takesID(use string) bool {
	f := strings.Fields(use)
	if len(f) < 2 {
		return false
	}
	switch f[1] {
	case "ID", "[ID]", "NODE_ID", "REF":
		return true
	}
	return false
}

// complete lists family fam's ids and names that start with toComplete,
// each with the other as its description.
func complete(cmd *cobra.Command, fam, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	none := cobra.ShellCompDirectiveNoFileComp
	cl, err := apiClient()
	if err != nil {
		return nil, none
	}
	ctx, cancel := context.WithTimeout(contextOf(cmd), completionTimeout)
	defer cancel()
	cl.HTTP.Timeout = completionTimeout
	rows, ok := newResolver(cl).load(ctx, families[fam])
	if !ok {
		return nil, none
	}
	var out []cobra.Completion
	for _, r := range rows {
		if fam == "secret" {
			// Secrets are taken by name in the caller's tenant.
			if strings.HasPrefix(r.name, toComplete) {
				out = append(out, cobra.CompletionWithDesc(r.name, r.id))
			}
			continue
		}
		if r.name != "" && r.name != r.id && strings.HasPrefix(r.name, toComplete) {
			out = append(out, cobra.CompletionWithDesc(r.name, r.id))
		}
		if strings.HasPrefix(r.id, toComplete) {
			out = append(out, cobra.CompletionWithDesc(r.id, r.name))
		}
	}
	return out, none
}
