package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

// templatesUpdateCmd changes the flags given of a template's recipe: it
// reads the template, overlays them, and sends the whole recipe.
func templatesUpdateCmd() *cobra.Command {
	var image, runtime, network string
	var cpu, mem, pids, disk int64
	var life, maxLife time.Duration
	var root, asJSON bool
	var env, labels []string
	var warm int
	c := &cobra.Command{Use: "update ID [flags]", Short: "Change a template's recipe (the flags given); its warm pool is drained and refilled from the new recipe", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			if err := resolveArg(cmd, cl, "template", &args[0]); err != nil {
				return err
			}
			var cur map[string]any
			if err := cl.Call(contextOf(cmd), "templates.get", map[string]any{"id": args[0]}, &cur); err != nil {
				return apiErr(err)
			}
			in := map[string]any{"id": args[0]}
			for _, k := range []string{"image", "runtime", "network", "limits", "lifetime_seconds", "max_lifetime_seconds", "root", "env", "labels", "warm"} { // archtest:not-tenant (run as uid 0 in the sandbox)
				in[k] = cur[k]
			}
			limits, _ := cur["limits"].(map[string]any)
			if limits == nil {
				limits = map[string]any{}
			}
			in["limits"] = limits
			f := cmd.Flags()
			set := func(flag, key string, v any, into map[string]any) {
				if f.Changed(flag) {
					into[key] = v
				}
			}
			set("image", "image", image, in)
			set("runtime", "runtime", runtime, in)
			set("network", "network", network, in)
			set("cpu-millis", "cpu_millis", cpu, limits)
			set("memory-mb", "memory_mb", mem, limits)
			set("pids", "pids", pids, limits)
			set("disk-mb", "disk_mb", disk, limits)
			set("lifetime", "lifetime_seconds", int64(life/time.Second), in)
			set("max-lifetime", "max_lifetime_seconds", int64(maxLife/time.Second), in)
			set("root", "root", root, in) // archtest:not-tenant (run as uid 0 in the sandbox)
			set("warm", "warm", warm, in)
			if f.Changed("env") {
				if in["env"], err = keyValues(env); err != nil {
					return &ExitError{Code: 2, Err: fmt.Errorf("--env: %w", err)}
				}
			}
			if f.Changed("label") {
				if in["labels"], err = keyValues(labels); err != nil {
					return &ExitError{Code: 2, Err: fmt.Errorf("--label: %w", err)}
				}
			}
			return call(cmd, "templates.update", in, asJSON, func(o map[string]any) string { return fmt.Sprintf("%v updated\n", o["id"]) })
		}}
	f := c.Flags()
	f.StringVar(&image, "image", "", "image name (see images list)")
	f.StringVar(&runtime, "runtime", "", "runc, runsc or sim")
	f.StringVar(&network, "network", "", "none or egress")
	f.Int64Var(&cpu, "cpu-millis", 0, "CPU in thousandths")
	f.Int64Var(&mem, "memory-mb", 0, "memory limit (MiB)")
	f.Int64Var(&pids, "pids", 0, "process limit")
	f.Int64Var(&disk, "disk-mb", 0, "writable layer size (MiB)")
	f.DurationVar(&life, "lifetime", 0, "lifetime of a new sandbox")
	f.DurationVar(&maxLife, "max-lifetime", 0, "longest a sandbox may be extended to")
	f.BoolVar(&root, "root", false, "run as root inside (uid 0, still without capabilities)") // archtest:not-tenant (run as uid 0 in the sandbox)
	f.StringArrayVar(&env, "env", nil, "KEY=VALUE for the sandbox's processes (repeatable; replaces the environment; not for secrets)")
	f.StringArrayVar(&labels, "label", nil, "key=value a host must carry (repeatable; replaces the labels)")
	f.IntVar(&warm, "warm", 0, "keep this many sandboxes started and unclaimed")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func imagesDeleteCmd() *cobra.Command {
	var tenant string
	c := &cobra.Command{Use: "delete NAME", Short: "Delete an image no template uses (running sandboxes keep running)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "images.delete", map[string]any{"tenant_id": tenant, "name": args[0]}, false,
				func(map[string]any) string { return "deleted\n" })
		}}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	return c
}
