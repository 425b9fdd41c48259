package cli

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// builtinAdmin is the id of the root tenant's built-in admin identity and
// of the built-in admin role (iam's migration 0002 seeds both and binds
// them).
const builtinAdmin = "admin"

// bootstrapActor is the audit actor of the bootstrap key's row.
const bootstrapActor = "bootstrap"

// bootstrapOptions are bootstrap's flags.
type bootstrapOptions struct {
	dsn, kekFile, pkiDir, out, name string
	force                           bool
}

// bootstrapCmd is `better-compute bootstrap`: it mints the first root admin
// API key on the database directly, once, as `nomad acl bootstrap` does.
func bootstrapCmd() *cobra.Command {
	var o bootstrapOptions
	c := &cobra.Command{
		Use:   "bootstrap --db DSN --kek-file F --pki DIR --out admin.key",
		Short: "Mint the first root admin API key on the database directly (once: refused when the root tenant has an admin key)",
		Long: "Migrate the database, then mint an API key for the root tenant's built-in admin identity and write it to a new\n" +
			"0600 file. Run it once, before or after the first `serve`, where the key-encryption key is (it must unseal the\n" +
			"bundle in --pki). Once the root tenant has an admin key it refuses: make further keys with `api-keys create`.\n" +
			"Its audit row (actor bootstrap, action compute:api-keys:create) is the first row of a fresh root tenant's log.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBootstrap(cmd, o) },
	}
	c.Flags().StringVar(&o.dsn, "db", os.Getenv("BC_DB"), "database: sqlite:PATH or postgres://… (default $BC_DB)")
	c.Flags().StringVar(&o.kekFile, "kek-file", "kek", "key-encryption key file; BC_KEK overrides")
	c.Flags().StringVar(&o.pkiDir, "pki", "pki", "PKI bundle directory (from pki init)")
	c.Flags().StringVar(&o.out, "out", "", "new 0600 file to write the admin key to (required)")
	c.Flags().StringVar(&o.name, "name", "bootstrap admin", "a name for the key")
	forceFlag(c, &o.force)
	return c
}

func runBootstrap(cmd *cobra.Command, o bootstrapOptions) error {
	ctx := contextOf(cmd)
	if o.out == "" || o.dsn == "" {
		return badInput(errors.New("--out and --db (or BC_DB) are required"))
	}
	if o.name == "" || len(o.name) > 200 {
		return badInput(errors.New("--name must be 1 to 200 characters"))
	}
	// The caller proves it holds the deployment's key-encryption key: the
	// bundle's internal CA key must unseal with it.
	kek, err := pki.LoadKEK(o.kekFile)
	if err != nil {
		return badInput(fmt.Errorf("INVALID_CONFIG: --kek-file: %w", err))
	}
	b, err := pki.Load(o.pkiDir)
	if err != nil {
		return badInput(fmt.Errorf("INVALID_CONFIG: --pki %s: %w", o.pkiDir, err))
	}
	if _, err := b.InternalCAKey(kek); err != nil {
		return badInput(fmt.Errorf("INVALID_CONFIG: the bundle in %s does not unseal with this key-encryption key: %w", o.pkiDir, err))
	}
	db, err := store.Open(ctx, o.dsn)
	if err != nil {
		return badInput(fmt.Errorf("INVALID_CONFIG: --db: %w", err))
	}
	defer db.Close()
	if err := db.Migrate(ctx); err != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("migrate the database: %w", err)}
	}
	f, err := openOut(o.out, o.force, secretFileMode)
	if err != nil {
		return err
	}
	id, key, err := mintFirstAdminKey(ctx, db, o.name)
	if err != nil {
		f.Abort()
		return err
	}
	if err := f.Commit([]byte(key + "\n")); err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "admin key %s for identity %s in the root tenant written to %s (0600)\n", id, builtinAdmin, o.out)
	fmt.Fprintf(w, "next: start the control plane (better-compute serve --db … --pki %s --kek-file %s), then\n", o.pkiDir, o.kekFile)
	fmt.Fprintf(w, "  export BC_ADDR=https://HOST:7780 BC_CA_FILE=%s BC_API_KEY_FILE=%s\n  better-compute nodes list\n", o.pkiDir, o.out)
	return nil
}

// mintFirstAdminKey makes the root admin key unless the root tenant has an
// admin key already: a key, revoked or not, of an identity bound to the
// built-in admin role there.
func mintFirstAdminKey(ctx context.Context, db *store.DB, name string) (id, key string, err error) {
	clk := clock.Real{}
	ids := iam.New(db, clk)
	bindings, err := ids.ListBindings(ctx, iam.RootTenant)
	if err != nil {
		return "", "", err
	}
	var holders []string
	adminBound := false
	for _, bd := range bindings {
		if bd.TenantID == iam.RootTenant && bd.RoleID == builtinAdmin {
			holders = append(holders, bd.IdentityID)
			adminBound = adminBound || (bd.IdentityID == builtinAdmin && bd.IdentityTenant == iam.RootTenant)
		}
	}
	if !adminBound {
		return "", "", &ExitError{Code: 1, Err: errors.New("the root tenant's admin identity no longer holds the built-in admin role, so bootstrap cannot make an admin key: use an existing admin key (api-keys create)")}
	}
	actor := audit.Entry{TenantID: iam.RootTenant, Actor: bootstrapActor}
	id, key, err = apikeys.New(db, clk, ids).CreateFirst(ctx, actor, iam.RootTenant, builtinAdmin, name, holders)
	if errors.Is(err, apikeys.ErrNotFirst) {
		return "", "", &ExitError{Code: 1, Err: errors.New("the root tenant already has an admin key, so bootstrap made none: " +
			"make further keys with `better-compute api-keys create --identity admin --out FILE` using an admin key (BC_API_KEY_FILE)")}
	}
	if err != nil {
		return "", "", fmt.Errorf("make the admin key: %w", err)
	}
	return id, key, nil
}
