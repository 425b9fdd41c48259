package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/secrets"
	"github.com/bettercompute/bettercompute/internal/signing"
	"github.com/bettercompute/bettercompute/internal/store"
)

// rotateKEKOptions are pki rotate-kek's flags.
type rotateKEKOptions struct {
	pkiDir, dsn, kekFile, newKEKFile string
	asJSON                           bool
}

// RotateKEKResult is what pki rotate-kek did, its --json output: how many
// sealed items of each kind it re-sealed under the new key-encryption key
// and how many an earlier run had already done.
type RotateKEKResult struct {
	// CreatedNewKEK is true when the run made the new KEK file.
	CreatedNewKEK bool           `json:"created_new_kek"`
	BundleSlots   pki.RekeyCount `json:"bundle_slots"`
	Secrets       pki.RekeyCount `json:"secrets"`
	TemplateEnvs  pki.RekeyCount `json:"template_envs"`
	WorkerKeys    pki.RekeyCount `json:"worker_keys"`
	// BastionKeys are the control plane's bastion keys (grant, lanes).
	BastionKeys pki.RekeyCount `json:"bastion_keys"`
	// PreviewKey is the sandbox preview key.
	PreviewKey pki.RekeyCount `json:"preview_key"`
}

// rotateKEKCmd is `better-compute pki rotate-kek`: it re-seals everything
// the key-encryption key seals (the bundle's private keys, secret values,
// worker signing keys) under a new one. It is run with the api and workers
// processes stopped, and run again with the same two files finishes an
// interrupted run.
func rotateKEKCmd() *cobra.Command {
	var o rotateKEKOptions
	c := &cobra.Command{
		Use:   "rotate-kek --pki DIR --db DSN --kek-file OLD --new-kek-file NEW",
		Short: "Re-seal every private key, secret value and worker key under a new key-encryption key",
		Long: "Stop the api and workers processes first. rotate-kek makes NEW (0600) if it is missing, else reads it, then\n" +
			"re-seals the secret values and worker signing keys in the database and, last, the bundle's private keys under\n" +
			"NEW. Each item already sealed under NEW is left as it is, so an interrupted run is finished by running it again\n" +
			"with the same two files. An item that opens under neither key stops it, named. Then start the processes with\n" +
			"--kek-file NEW and delete OLD once they run. Idempotency-Key records made before the rotation no longer match:\n" +
			"a retry that spans it runs again.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runRotateKEK(cmd, o) },
	}
	f := c.Flags()
	f.StringVar(&o.pkiDir, "pki", envOr(envPKI, "pki"), "PKI bundle directory (default $BC_PKI, else pki)")
	dbFlag(c, &o.dsn)
	f.StringVar(&o.kekFile, "kek-file", envOr(envKEKFile, "kek"), "the key-encryption key in use (0600; default $BC_KEK_FILE, else kek); BC_KEK overrides")
	f.StringVar(&o.newKEKFile, "new-kek-file", "", "the new key-encryption key: made 0600 if missing, else read (never from BC_KEK; required)")
	f.BoolVar(&o.asJSON, "json", false, "print the counts as JSON")
	return c
}

func runRotateKEK(cmd *cobra.Command, o rotateKEKOptions) error {
	ctx := contextOf(cmd)
	if o.newKEKFile == "" || o.dsn == "" {
		return badInput(errors.New("INVALID_INPUT: --new-kek-file and --db (or BC_DB) are required"))
	}
	old, err := pki.LoadKEK(o.kekFile)
	if err != nil {
		return badInput(fmt.Errorf("INVALID_CONFIG: --kek-file: %w", err))
	}
	if _, err := pki.Load(o.pkiDir); err != nil {
		return badInput(fmt.Errorf("INVALID_CONFIG: --pki %s: %w", o.pkiDir, err))
	}
	db, err := store.Open(ctx, o.dsn)
	if err != nil {
		return badInput(fmt.Errorf("INVALID_CONFIG: --db: %w", err))
	}
	defer db.Close()
	if err := db.Migrate(ctx); err != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("migrate the database: %w", err)}
	}
	var res RotateKEKResult
	next, err := pki.LoadKEKFile(o.newKEKFile)
	if errors.Is(err, os.ErrNotExist) {
		next, err = pki.CreateKEK(o.newKEKFile)
		res.CreatedNewKEK = err == nil
	}
	if err != nil {
		return badInput(fmt.Errorf("INVALID_CONFIG: --new-kek-file: %w", err))
	}
	if err := pki.CheckRekeyPair(old, next); err != nil {
		return badInput(fmt.Errorf("INVALID_INPUT: %w", err))
	}
	// A wrong old key stops the rotation before anything changes: every
	// bundle slot must open under one of the two keys.
	if _, err := pki.CheckRekeyBundle(o.pkiDir, old, next); err != nil {
		return badInput(fmt.Errorf("INVALID_CONFIG: the bundle in %s does not unseal with --kek-file or --new-kek-file: %w", o.pkiDir, err))
	}
	progress := cmd.ErrOrStderr()
	if res.CreatedNewKEK {
		fmt.Fprintf(progress, "made a new key-encryption key in %s (0600)\n", o.newKEKFile)
	}
	if err := rotateKEK(ctx, progress, db, o.pkiDir, old, next, &res); err != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("%w (nothing after it changed; run again with the same two files once it is fixed)", err)}
	}
	if o.asJSON {
		return printJSON(cmd.OutOrStdout(), res)
	}
	printRotateKEK(cmd.OutOrStdout(), o, res)
	return nil
}

// rotateKEK re-seals the database's rows first and the bundle last, so
// that every process that can still start with the old key finds the
// bundle it expects until the very end.
func rotateKEK(ctx context.Context, progress io.Writer, db *store.DB, dir string, old, next pki.KEK, res *RotateKEKResult) error {
	var err error
	fmt.Fprintln(progress, "re-sealing secret values")
	if res.Secrets, err = secrets.Reseal(ctx, db, old, next); err != nil {
		return err
	}
	fmt.Fprintln(progress, "re-sealing sandbox templates' environments")
	if res.TemplateEnvs, err = sandboxes.ResealEnv(ctx, db, old, next); err != nil {
		return err
	}
	fmt.Fprintln(progress, "re-sealing worker signing keys")
	if res.WorkerKeys, err = signing.Reseal(ctx, db, old, next); err != nil {
		return err
	}
	fmt.Fprintln(progress, "re-sealing the bastion keys")
	if res.BastionKeys, err = bastions.Reseal(ctx, db, old, next); err != nil {
		return err
	}
	fmt.Fprintln(progress, "re-sealing the preview key")
	if res.PreviewKey, err = previews.Reseal(ctx, db, old, next); err != nil {
		return err
	}
	fmt.Fprintln(progress, "re-sealing the bundle's private keys")
	res.BundleSlots, err = pki.RekeyBundle(dir, old, next)
	return err
}

// printRotateKEK prints res and the next steps for humans.
func printRotateKEK(w io.Writer, o rotateKEKOptions, res RotateKEKResult) {
	fmt.Fprintln(w, "every sealed item is now under the new key-encryption key:")
	for _, r := range []struct {
		name string
		c    pki.RekeyCount
	}{{"bundle slots", res.BundleSlots}, {"secrets", res.Secrets}, {"template environments", res.TemplateEnvs}, {"worker keys", res.WorkerKeys},
		{"bastion keys", res.BastionKeys}, {"preview key", res.PreviewKey}} {
		fmt.Fprintf(w, "  %-13s %d re-sealed, %d already done\n", r.name+":", r.c.Resealed, r.c.AlreadyDone)
	}
	fmt.Fprintf(w, "next: with the api and workers processes stopped (as they must be while this runs), point --kek-file at %s\n", o.newKEKFile)
	fmt.Fprintf(w, "  (or replace %s with it; unset BC_KEK or set it to the new key), start them, and delete %s once they run.\n", o.kekFile, o.kekFile)
	fmt.Fprintln(w, "  API retries with an Idempotency-Key that span the rotation are not deduplicated (those records are keyed by the KEK).")
}
