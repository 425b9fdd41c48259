package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/clisafe"
)

// sandboxCommands are the sandbox, templates and images command groups.
func sandboxCommands() []*cobra.Command {
	return []*cobra.Command{sandboxCmd(), templatesCmd(), imagesCmd(), checkpointsCmd(), previewCmd()}
}

func sandboxCmd() *cobra.Command {
	c := &cobra.Command{Use: "sandbox", Short: "Sandboxes: isolated machines for untrusted code, made from templates"}
	create, exe := sandboxCreateCmd(), sandboxExecCmd()
	var lt string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List sandboxes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "sandboxes.list", map[string]any{"tenant_id": lt}, lj, table("sandboxes", "id", "state", "template_id", "node_id", "runtime", "expires_at"))
		}}
	list.Flags().StringVar(&lt, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	var gj bool
	get := &cobra.Command{Use: "show ID", Short: "Show a sandbox", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "sandboxes.get", map[string]any{"id": args[0]}, gj, nil)
		}}
	get.Flags().BoolVar(&gj, "json", true, "print JSON")
	var by time.Duration
	extend := &cobra.Command{Use: "extend ID --by DURATION", Short: "Move a sandbox's expiry to now + DURATION (within its template's maximum)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "sandboxes.extend", map[string]any{"id": args[0], "seconds": int64(by / time.Second)}, false,
				func(o map[string]any) string { return fmt.Sprintf("%v expires %v\n", o["id"], o["expires_at"]) })
		}}
	extend.Flags().DurationVar(&by, "by", time.Hour, "new lifetime from now")
	del := &cobra.Command{Use: "delete ID", Short: "Delete a sandbox; its host stops it and frees its resources", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "sandboxes.delete", map[string]any{"id": args[0]}, false, func(o map[string]any) string {
				if o["freed"] == true {
					return "deleted\n"
				}
				return "deleted (the host will remove it when it reconnects, or at its deadline)\n"
			})
		}}
	c.AddCommand(create, exe, list, get, extend, del, sandboxCheckpointCmd(), sandboxPreviewCmd(), hiddenAlias(get, "get"))
	return c
}

// sandboxCreateCmd creates a sandbox from a template and waits until it
// runs.
func sandboxCreateCmd() *cobra.Command {
	var tpl, tenant, from string
	var cj bool
	create := &cobra.Command{Use: "create --template T | --from-checkpoint CKPT", Short: "Create a sandbox (or restore a checkpoint of yours) and wait until it runs", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tpl == "" && from == "" {
				return &ExitError{Code: 2, Err: errors.New("--template or --from-checkpoint is required")}
			}
			in := map[string]any{"tenant_id": tenant, "template": tpl}
			if from != "" {
				in["from_checkpoint"] = from
			}
			return call(cmd, "sandboxes.create", in, cj, func(o map[string]any) string { return fmt.Sprintf("%v\n", o["id"]) })
		}}
	create.Flags().StringVar(&tpl, "template", "", "template name or id")
	create.Flags().StringVar(&from, "from-checkpoint", "", "restore this checkpoint of yours (under its own template)")
	create.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	create.Flags().BoolVar(&cj, "json", false, "print JSON")
	return create
}

// sandboxExecCmd runs an argument vector in a sandbox and exits with its
// exit code.
func sandboxExecCmd() *cobra.Command {
	var timeout time.Duration
	var interactive, tty bool
	exe := &cobra.Command{Use: "exec [-it] ID -- ARGV...", Short: "Run an argument vector in a sandbox (no shell unless you run one); exits with its exit code",
		Long: "Run an argument vector in a sandbox (no shell unless you run one). The exit status is docker exec's: the program's own,\n" +
			"126 when it cannot be executed, 127 when it is not found, and 125 when the CLI or the server failed (usage errors included).\n\n" +
			"With -it the program runs on a terminal in the sandbox, over a ticketed stream through its node's own session\n" +
			"(sandboxes.execTicket, decided compute:sandboxes:exec on the sandbox and again every few seconds while it runs):\n" +
			"your terminal is put in raw mode, its size follows yours, and closing it kills the program. --timeout does not apply;\n" +
			"the sandbox's deadline does, and a sandbox expiring within a minute is refused.",
		Annotations: map[string]string{programExitCodes: "docker"},
		Args:        cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				//lint:ignore ST1005 the usage line is printed to the user as it is, ARGV... included
				return &ExitError{Code: 2, Err: errors.New("usage: sandbox exec ID -- ARGV...")}
			}
			if interactive != tty {
				return &ExitError{Code: 2, Err: errors.New("-i and -t go together (-it): an interactive program on a terminal")}
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			if err := resolveArg(cmd, cl, "sandbox", &args[0]); err != nil {
				return err
			}
			if tty {
				return runShell(cmd, cl, args[0], args[1:])
			}
			cl.HTTP.Timeout = timeout + time.Minute
			r, err := cl.Exec(contextOf(cmd), args[0], args[1:], int64((timeout+time.Second-1)/time.Second))
			if err != nil {
				return apiErr(err)
			}
			// The program's own output, raw as ssh would pass it.
			_, _ = clisafe.Raw(cmd.OutOrStdout()).Write(r.Stdout)
			_, _ = clisafe.Raw(cmd.ErrOrStderr()).Write(r.Stderr)
			for _, note := range []struct {
				on  bool
				why string
			}{{r.StdoutTruncated, "stdout truncated"}, {r.StderrTruncated, "stderr truncated"}, {r.TimedOut, "timed out and killed"}} {
				if note.on {
					fmt.Fprintf(cmd.ErrOrStderr(), "better-compute: %s\n", note.why)
				}
			}
			if r.ExitCode != 0 {
				return &programExit{code: r.ExitCode}
			}
			return nil
		}}
	exe.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "kill the command after this long (at most 10m)")
	exe.Flags().BoolVarP(&interactive, "interactive", "i", false, "keep standard input open (with -t)")
	exe.Flags().BoolVarP(&tty, "tty", "t", false, "run the program on a terminal (with -i)")
	return exe
}

func templatesCmd() *cobra.Command {
	c := &cobra.Command{Use: "templates", Short: "Sandbox templates: image, limits, lifetime, network, environment, warm pool"}
	var tenant, image, runtime, network string
	var cpu, mem, pids, disk int64
	var life, maxLife time.Duration
	var root, cj bool
	var env, labels []string
	var warm int
	create := &cobra.Command{Use: "create NAME --image IMAGE", Short: "Create a template", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := keyValues(env)
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("--env: %w", err)}
			}
			l, err := keyValues(labels)
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("--label: %w", err)}
			}
			in := map[string]any{"tenant_id": tenant, "name": args[0], "image": image, "runtime": runtime, "network": network,
				"limits":           map[string]any{"cpu_millis": cpu, "memory_mb": mem, "pids": pids, "disk_mb": disk},
				"lifetime_seconds": int64(life / time.Second), "max_lifetime_seconds": int64(maxLife / time.Second),
				"root": root, "env": e, "labels": l, "warm": warm} // archtest:not-tenant (run as uid 0 in the sandbox)
			return call(cmd, "templates.create", in, cj, func(o map[string]any) string { return fmt.Sprintf("%v\n", o["id"]) })
		}}
	f := create.Flags()
	f.StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	f.StringVar(&image, "image", "", "image name (see images list)")
	f.StringVar(&runtime, "runtime", "runc", "runc, runsc or sim")
	f.StringVar(&network, "network", "none", "none (only loopback) or egress (the public internet through the host's egress proxy only)")
	f.Int64Var(&cpu, "cpu-millis", 1000, "CPU in thousandths")
	f.Int64Var(&mem, "memory-mb", 256, "memory limit (MiB)")
	f.Int64Var(&pids, "pids", 256, "process limit")
	f.Int64Var(&disk, "disk-mb", 256, "writable layer size (MiB)")
	f.DurationVar(&life, "lifetime", time.Hour, "lifetime of a new sandbox")
	f.DurationVar(&maxLife, "max-lifetime", 24*time.Hour, "longest a sandbox may be extended to")
	f.BoolVar(&root, "root", false, "run as root inside (uid 0, still without capabilities)") // archtest:not-tenant (run as uid 0 in the sandbox)
	f.StringArrayVar(&env, "env", nil, "KEY=VALUE for the sandbox's processes (repeatable; not for secrets)")
	f.StringArrayVar(&labels, "label", nil, "key=value a host must carry (repeatable)")
	f.IntVar(&warm, "warm", 0, "keep this many sandboxes started and unclaimed")
	f.BoolVar(&cj, "json", false, "print JSON")
	var lt string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List templates", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "templates.list", map[string]any{"tenant_id": lt}, lj, table("templates", "id", "name", "image", "runtime", "network", "warm"))
		}}
	list.Flags().StringVar(&lt, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	var dj bool
	del := &cobra.Command{Use: "delete ID", Short: "Delete a template and drain its warm pool (sandboxes made from it keep running)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "templates.delete", map[string]any{"id": args[0]}, dj,
				func(o map[string]any) string {
					return fmt.Sprintf("deleted; %v warm sandboxes drained\n", o["drained"])
				})
		}}
	del.Flags().BoolVar(&dj, "json", false, "print JSON")
	c.AddCommand(create, list, del)
	return c
}

func imagesCmd() *cobra.Command {
	c := &cobra.Command{Use: "images", Short: "Sandbox images: content-addressed root filesystems"}
	imp := imageImportCmd()
	var lt string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List images", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "images.list", map[string]any{"tenant_id": lt}, lj, func(o map[string]any) string {
				// JSON numbers decode as float64: show sizes as integers.
				if rows, ok := o["images"].([]any); ok {
					for _, r := range rows {
						if m, ok := r.(map[string]any); ok {
							if f, ok := m["size_bytes"].(float64); ok {
								m["size_bytes"] = int64(f)
							}
						}
					}
				}
				return table("images", "name", "digest", "size_bytes", "created_at")(o)
			})
		}}
	list.Flags().StringVar(&lt, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	c.AddCommand(imp, list)
	return c
}

// keyValues parses KEY=VALUE pairs.
func keyValues(kvs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not KEY=VALUE", kv)
		}
		out[k] = v
	}
	return out, nil
}

// sandboxCheckpointCmd captures a sandbox's writable layer (and with
// --memory on runsc, its processes' memory) as a checkpoint.
func sandboxCheckpointCmd() *cobra.Command {
	var memory, j bool
	c := &cobra.Command{Use: "checkpoint ID [--memory]", Short: "Capture a running sandbox's files (and with --memory on runsc, its processes' memory) as a checkpoint you own; the sandbox keeps running",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "sandboxes.checkpoint", map[string]any{"id": args[0], "memory": memory}, j,
				func(o map[string]any) string { return fmt.Sprintf("%v %v %v bytes\n", o["id"], o["digest"], o["size"]) })
		}}
	c.Flags().BoolVar(&memory, "memory", false, "also capture the processes' memory (runsc sandboxes only)")
	c.Flags().BoolVar(&j, "json", false, "print JSON")
	return c
}

// checkpointsCmd lists and deletes the caller's own checkpoints.
func checkpointsCmd() *cobra.Command {
	c := &cobra.Command{Use: "checkpoints", Short: "Your sandbox checkpoints: restore with sandbox create --from-checkpoint"}
	var tenant string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List your checkpoints (another identity's are never shown)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "checkpoints.list", map[string]any{"tenant_id": tenant}, lj,
				table("checkpoints", "id", "sandbox_id", "template_id", "runtime", "size", "memory_size", "created_at"))
		}}
	list.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	del := &cobra.Command{Use: "delete ID", Short: "Delete a checkpoint of yours; its objects are removed once no live sandbox restores from them", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "checkpoints.delete", map[string]any{"id": args[0]}, false, func(map[string]any) string { return "deleted\n" })
		}}
	c.AddCommand(list, del)
	return c
}
