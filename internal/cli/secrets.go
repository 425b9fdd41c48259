package cli

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

func secretsCmd() *cobra.Command {
	c := &cobra.Command{Use: "secrets", Short: "Sealed secrets: write-only values, referenced as secret://TENANT/NAME"}
	var tenant, name, scope, valueFile string
	var fromStdin, asJSON bool
	put := &cobra.Command{
		Use:   "put --name NAME (--value-file FILE | --stdin)",
		Short: "Store a new version of a secret; the value comes only from a file or standard input",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return &ExitError{Code: 2, Err: errors.New("--name is required")}
			}
			if (valueFile == "") == !fromStdin {
				return &ExitError{Code: 2, Err: errors.New("give exactly one of --value-file or --stdin (never the value as an argument)")}
			}
			var v []byte
			var err error
			if fromStdin {
				v, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 32<<10+1))
			} else {
				v, err = os.ReadFile(valueFile)
			}
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("read the value: %w", err)}
			}
			defer clear(v)
			return call(cmd, "secrets.put", map[string]any{"tenant_id": tenant, "name": name, "scope": scope,
				"value_base64": base64.StdEncoding.EncodeToString(v)}, asJSON,
				func(o map[string]any) string { return fmt.Sprintf("%v version %v\n", o["ref"], o["version"]) })
		},
	}
	put.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	put.Flags().StringVar(&name, "name", "", "secret name")
	put.Flags().StringVar(&scope, "scope", "tenant", "tenant, or fleet (root tenant only)")
	put.Flags().StringVar(&valueFile, "value-file", "", "read the value from this file")
	put.Flags().BoolVar(&fromStdin, "stdin", false, "read the value from standard input")
	put.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var lt string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List secrets (metadata only)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "secrets.list", map[string]any{"tenant_id": lt}, lj, table("secrets", "ref", "version", "scope", "created_by", "created_at"))
		}}
	list.Flags().StringVar(&lt, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	var sj bool
	show := &cobra.Command{Use: "show REF", Short: "Show a secret's metadata (never its value)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "secrets.get", map[string]any{"ref": args[0]}, sj,
				func(o map[string]any) string {
					return fmt.Sprintf("ref      %v\nversion  %v\nscope    %v\ncreated  %v by %v\n", o["ref"], o["version"], o["scope"], o["created_at"], o["created_by"])
				})
		}}
	show.Flags().BoolVar(&sj, "json", false, "print JSON")
	var ds string
	del := &cobra.Command{Use: "delete REF", Short: "Delete every version of a secret", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "secrets.delete", map[string]any{"ref": args[0], "scope": ds}, false, func(map[string]any) string { return "deleted\n" })
		}}
	del.Flags().StringVar(&ds, "scope", "tenant", "tenant, or fleet")
	c.AddCommand(put, list, show, del)
	return c
}
