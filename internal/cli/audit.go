package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/mod/sumdb/note"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// auditCmd is `better-compute audit`: the tamper-evident audit log. Seal
// and verify work on the database directly (--db, default $BC_DB), not
// through the API, so that an operator can check the log without trusting
// a running control plane; list and prove do too when a database is
// given, and otherwise ask the API (audit.list, audit.prove), which lets a
// tenant's admin read its own tenant's log. dev's DATA/env sets BC_DB,
// BC_PKI and BC_KEK_FILE. docs/audit.md describes them.
func auditCmd() *cobra.Command {
	c := &cobra.Command{Use: "audit", Short: "Seal, verify, prove and list the tamper-evident audit log (list and prove through the API without --db)"}
	c.AddCommand(auditSealCmd(), auditVerifyCmd(), auditVerifySinkCmd(), auditProveCmd(), auditCheckProofCmd(), auditKeyCmd(), auditListCmd())
	return c
}

func badInput(err error) error { return &ExitError{Code: 2, Err: err} }

func dbFlag(c *cobra.Command, dsn *string) {
	c.Flags().StringVar(dsn, "db", os.Getenv(envDB), "database: sqlite:PATH or postgres://… (default $BC_DB, which dev's DATA/env sets)")
}

func openAuditLog(ctx context.Context, dsn, deployment string, migrate bool) (*store.DB, *auditlog.Log, error) {
	if dsn == "" {
		return nil, nil, badInput(errors.New("--db (or BC_DB) is required"))
	}
	db, err := store.Open(ctx, dsn)
	if err != nil {
		return nil, nil, badInput(fmt.Errorf("database: %w", err))
	}
	if migrate {
		if err := db.Migrate(ctx); err != nil {
			db.Close()
			return nil, nil, err
		}
	}
	l, err := auditlog.New(auditlog.Config{DB: db, Deployment: deployment, Clock: clock.Real{}, Log: newLogger(io.Discard, "error")})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, l, nil
}

// auditVerifier reads the verifier keys from --key FILE (one per line, as
// `audit key` prints them), or from the bundle in --pki DIR: every audit
// key the deployment has used, so checkpoints signed before a rotation
// still verify.
func auditVerifier(keyFile, pkiDir string) (note.Verifier, string, error) {
	switch {
	case keyFile != "" && pkiDir != "":
		return nil, "", badInput(errors.New("give --key or --pki, not both"))
	case keyFile != "":
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, "", badInput(fmt.Errorf("verifier key: %w", err))
		}
		v, dep, err := auditlog.ParseKeyRing(string(b))
		if err != nil {
			return nil, "", badInput(err)
		}
		return v, dep, nil
	case pkiDir != "":
		b, err := pki.LoadPublic(pkiDir)
		if err != nil {
			return nil, "", badInput(fmt.Errorf("PKI bundle in %s: %w", pkiDir, err))
		}
		v, err := auditlog.NewKeyRing(b.Deployment, b.AuditKeys())
		if err != nil {
			return nil, "", badInput(err)
		}
		return v, b.Deployment, nil
	default:
		return nil, "", badInput(errors.New("--key FILE or --pki DIR is required"))
	}
}

func auditSealCmd() *cobra.Command {
	var dsn, pkiDir, kekFile, tenant string
	var asJSON bool
	c := &cobra.Command{
		Use:   "seal",
		Short: "Seal new audit rows now: append them to each tenant's log and sign a checkpoint (needs the audit key)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := contextOf(cmd)
			kek, err := pki.LoadKEK(kekFile)
			if err != nil {
				return badInput(fmt.Errorf("key-encryption key: %w", err))
			}
			b, err := pki.Load(pkiDir)
			if err != nil {
				return badInput(fmt.Errorf("PKI bundle in %s: %w", pkiDir, err))
			}
			priv, err := b.AuditSigningKey(kek)
			if err != nil {
				return badInput(fmt.Errorf("the audit key does not unseal with this key-encryption key: %w", err))
			}
			key, err := auditlog.NewSigningKey(b.Deployment, priv)
			if err != nil {
				return err
			}
			if key.Verifier, err = auditlog.NewKeyRing(b.Deployment, b.AuditKeys()); err != nil {
				return err
			}
			db, l, err := openAuditLog(ctx, dsn, b.Deployment, true)
			if err != nil {
				return err
			}
			defer db.Close()
			var res []auditlog.SealResult
			if tenant != "" {
				res, err = l.Seal(ctx, tenant, key)
			} else {
				res, err = l.SealAll(ctx, key)
			}
			if err != nil {
				return err
			}
			if asJSON {
				if res == nil {
					res = []auditlog.SealResult{}
				}
				return printJSON(cmd.OutOrStdout(), res)
			}
			for _, r := range res {
				fmt.Fprintf(cmd.OutOrStdout(), "sealed %d rows of tenant %s: checkpoint size %d\n", r.Added, r.Tenant, r.Size)
			}
			if len(res) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing to seal")
			}
			return nil
		},
	}
	dbFlag(c, &dsn)
	c.Flags().StringVar(&pkiDir, "pki", envOr(envPKI, "pki"), "PKI bundle directory (default $BC_PKI, else pki)")
	c.Flags().StringVar(&kekFile, "kek-file", envOr(envKEKFile, "kek"), "key-encryption key file (0600; default $BC_KEK_FILE, else kek); BC_KEK overrides")
	c.Flags().StringVar(&tenant, "tenant", "", "seal only this tenant (default: every tenant with new rows)")
	c.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of checkpoints written")
	return c
}

func auditVerifyCmd() *cobra.Command {
	var dsn, pkiDir, keyFile, tenant, save, heldSink string
	var held []string
	var asJSON bool
	c := &cobra.Command{
		Use:   "verify",
		Short: "Recompute a tenant's log from its rows and check every checkpoint; exit 0 all holds, 1 a finding, 2 bad input",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := contextOf(cmd)
			if keyFile == "" && pkiDir == "" {
				pkiDir = os.Getenv(envPKI)
			}
			v, dep, err := auditVerifier(keyFile, pkiDir)
			if err != nil {
				return err
			}
			hs, err := readHeld(held, v, v.Name()+"/"+dbTenant(tenant))
			if err != nil {
				return err
			}
			if hs, err = appendHeldSink(ctx, hs, heldSink, dbTenant(tenant), v); err != nil {
				return err
			}
			db, l, err := openAuditLog(ctx, dsn, dep, false)
			if err != nil {
				return err
			}
			defer db.Close()
			var progress func(done, total int64)
			if f, ok := cmd.ErrOrStderr().(*os.File); ok && isTerminal(f) {
				progress = func(done, total int64) { fmt.Fprintf(f, "\rverified %d of %d rows", done, total) }
			}
			rep, err := l.VerifyHeld(ctx, dbTenant(tenant), v, hs, progress)
			if progress != nil {
				fmt.Fprintln(cmd.ErrOrStderr())
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := printJSON(out, rep.Findings); err != nil {
					return err
				}
			} else {
				for _, f := range rep.Findings {
					fmt.Fprintln(out, f.String())
				}
				if rep.OK() {
					fmt.Fprintf(out, "ok: %s: %d rows, %d checkpoints verified\n", rep.Origin, rep.Rows, rep.Checkpoints)
				}
			}
			if !rep.OK() {
				return &ExitError{Code: 1}
			}
			if save != "" {
				if rep.Latest == nil {
					return badInput(errors.New("--save-checkpoint: the log has no verified checkpoint yet (seal it first); nothing saved"))
				}
				if err := atomicfile.Write(save, rep.Latest, publicFileMode); err != nil {
					return err
				}
			}
			return nil
		},
	}
	dbFlag(c, &dsn)
	c.Flags().StringArrayVar(&held, "held", nil, "a checkpoint `FILE` kept from before (--save-checkpoint's, or a proof from audit prove): the log must not be shorter, nor have another root at its size (repeatable)")
	c.Flags().StringVar(&save, "save-checkpoint", "", "when everything holds, write the last verified checkpoint to `FILE`, to hold with --held next time")
	c.Flags().StringVar(&heldSink, "held-sink", "", "hold the log against every signed checkpoint of the tenant in the audit sink `SPEC` (serve --audit-sink's file or bucket URL)")
	c.Flags().StringVar(&tenant, "tenant", "", "tenant id (default: the root tenant)")
	c.Flags().StringVar(&pkiDir, "pki", "", "PKI bundle directory, only its public audit key is used (default $BC_PKI unless --key)")
	c.Flags().StringVar(&keyFile, "key", "", "audit verifier key `FILE` (made by 'audit key')")
	c.Flags().BoolVar(&asJSON, "json", false, "print the findings as a JSON array")
	return c
}

func auditVerifySinkCmd() *cobra.Command {
	var pkiDir, keyFile, tenant string
	var asJSON bool
	c := &cobra.Command{
		Use:   "verify-sink SPEC",
		Short: "Check an audit sink's copy without the database: every row, every checkpoint's signature and root; exit 0 all holds, 1 a finding, 2 bad input",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := contextOf(cmd)
			if keyFile == "" && pkiDir == "" {
				pkiDir = os.Getenv(envPKI)
			}
			v, _, err := auditVerifier(keyFile, pkiDir)
			if err != nil {
				return err
			}
			sc, err := auditlog.ReadSink(ctx, args[0])
			if err != nil {
				return badInput(err)
			}
			tenants := sc.Tenants()
			if tenant != "" {
				tenants = []string{tenant}
			}
			if len(tenants) == 0 {
				return badInput(fmt.Errorf("%s holds no audit rows or checkpoints", args[0]))
			}
			reps := make([]*auditlog.SinkReport, 0, len(tenants))
			ok := true
			for _, t := range tenants {
				rep := auditlog.VerifySink(sc, t, v)
				reps = append(reps, rep)
				ok = ok && rep.OK()
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := printJSON(out, reps); err != nil {
					return err
				}
			} else {
				for _, rep := range reps {
					for _, f := range rep.Findings {
						fmt.Fprintf(out, "%s: %s\n", rep.Tenant, f.String())
					}
					if rep.OK() {
						fmt.Fprintf(out, "ok: %s: %d rows, %d checkpoints verified, %d rows after the last\n", rep.Origin, rep.Rows, rep.Checkpoints, rep.Rows-rep.Covered)
					}
				}
				if sc.Unreadable > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: %d lines or objects did not parse and were skipped (a line cut short by a crash is one)\n", sc.Unreadable)
				}
			}
			if !ok {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "check only this tenant (default: every tenant the sink holds)")
	c.Flags().StringVar(&pkiDir, "pki", "", "PKI bundle directory, only its public audit key is used (default $BC_PKI unless --key)")
	c.Flags().StringVar(&keyFile, "key", "", "audit verifier key `FILE` (made by 'audit key')")
	c.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of reports, one a tenant")
	return c
}

// appendHeldSink adds to hs the tenant's signed checkpoints in the audit
// sink at spec (none when spec is empty): they were copied out of the
// database as they were sealed, so the log must still hold each of them.
func appendHeldSink(ctx context.Context, hs []auditlog.Checkpoint, spec, tenant string, v note.Verifier) ([]auditlog.Checkpoint, error) {
	if spec == "" {
		return hs, nil
	}
	sc, err := auditlog.ReadSink(ctx, spec)
	if err != nil {
		return nil, badInput(fmt.Errorf("--held-sink: %w", err))
	}
	return append(hs, auditlog.VerifySink(sc, tenant, v).Held...), nil
}

// readHeld opens each checkpoint file kept from before for verify --held:
// a signed checkpoint note, or a proof file (its checkpoint, once the
// proof checks), under v for origin; anything else is bad input.
func readHeld(paths []string, v note.Verifier, origin string) ([]auditlog.Checkpoint, error) {
	var out []auditlog.Checkpoint
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, badInput(fmt.Errorf("--held: %w", err))
		}
		var cp auditlog.Checkpoint
		if bytes.HasPrefix(b, []byte(auditlog.ProofHeader+"\n")) {
			got, err := auditlog.CheckProof(b, v)
			if err != nil {
				return nil, badInput(fmt.Errorf("--held %s: %w", p, err))
			}
			cp = got.Checkpoint
		} else if cp, err = auditlog.OpenCheckpoint(b, v, origin); err != nil {
			return nil, badInput(fmt.Errorf("--held %s: %w", p, err))
		}
		if cp.Origin != origin {
			return nil, badInput(fmt.Errorf("--held %s: a checkpoint of %s, not %s", p, cp.Origin, origin))
		}
		out = append(out, cp)
	}
	return out, nil
}

func auditProveCmd() *cobra.Command {
	var dsn, tenant, event, out string
	var force bool
	c := &cobra.Command{
		Use:   "prove",
		Short: "Write the inclusion proof of one event (C2SP tlog-proof@v1) for check-proof; through the API without --db",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := contextOf(cmd)
			if event == "" || out == "" {
				return badInput(errors.New("--event and --out are required"))
			}
			of, err := openOut(out, force, publicFileMode)
			if err != nil {
				return err
			}
			committed := false
			defer func() {
				if !committed {
					of.Abort()
				}
			}()
			file, index, err := auditProveFile(ctx, dsn, tenant, event)
			if errors.Is(err, auditlog.ErrNotFound) {
				return badInput(err)
			}
			if err != nil {
				return err
			}
			committed = true
			if err := of.Commit(file); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: event %s at index %d\n", out, event, index)
			return nil
		},
	}
	dbFlag(c, &dsn)
	c.Flags().StringVar(&tenant, "tenant", "", "tenant id (default: the root tenant with --db, your own through the API)")
	c.Flags().StringVar(&event, "event", "", "event id (ev_…)")
	c.Flags().StringVar(&out, "out", "", "proof file to write")
	forceFlag(c, &force)
	return c
}

func auditCheckProofCmd() *cobra.Command {
	var keyFile string
	c := &cobra.Command{
		Use:   "check-proof FILE",
		Short: "Check a proof offline (no server, no database) and print the verified event; exit 1 when it fails",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if keyFile == "" {
				return badInput(errors.New("--key is required"))
			}
			v, _, err := auditVerifier(keyFile, "")
			if err != nil {
				return err
			}
			file, err := os.ReadFile(args[0])
			if err != nil {
				return badInput(err)
			}
			got, err := auditlog.CheckProof(file, v)
			if err != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("proof refused: %w", err)}
			}
			return printJSON(cmd.OutOrStdout(), map[string]any{
				"verified": true, "origin": got.Checkpoint.Origin, "tree_size": got.Checkpoint.Size, "event": got.Row,
			})
		},
	}
	c.Flags().StringVar(&keyFile, "key", "", "audit verifier key `FILE` (made by 'audit key')")
	return c
}

func auditKeyCmd() *cobra.Command {
	var pkiDir string
	c := &cobra.Command{
		Use:   "key",
		Short: "Print the audit verifier keys (signed-note verifier format name+hash+base64), the active one first",
		Long: "Print the audit verifier keys, one per line: the active one first, then a staged, a previous and every\n" +
			"retired audit key, so that checkpoints signed before a rotation still verify. audit verify --key FILE reads the same form.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := pki.LoadPublic(pkiDir)
			if err != nil {
				return badInput(fmt.Errorf("PKI bundle in %s: %w", pkiDir, err))
			}
			for _, k := range b.AuditKeys() {
				vkey, err := auditlog.VerifierKey(b.Deployment, k)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), vkey)
			}
			return nil
		},
	}
	c.Flags().StringVar(&pkiDir, "pki", envOr(envPKI, "pki"), "PKI bundle directory (default $BC_PKI, else pki)")
	return c
}

func auditListCmd() *cobra.Command {
	var dsn, tenant string
	var since int64
	var limit int
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's audit events: sealed ones in seq order, then unsealed ones; through the API without --db",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := contextOf(cmd)
			var evs []client.AuditEvent
			var err error
			if dsn == "" {
				evs, err = auditListAPI(ctx, tenant, since, limit)
			} else {
				evs, err = auditListDB(ctx, dsn, tenant, since, limit)
			}
			if err != nil {
				return err
			}
			if asJSON {
				if evs == nil {
					evs = []client.AuditEvent{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"events": evs})
			}
			return printAuditEvents(cmd.OutOrStdout(), evs)
		},
	}
	dbFlag(c, &dsn)
	c.Flags().StringVar(&tenant, "tenant", "", "tenant id (default: the root tenant with --db, your own through the API)")
	c.Flags().Int64Var(&since, "since", 0, "list sealed events from this seq on")
	c.Flags().IntVar(&limit, "limit", 1000, "at most this many events (0: all with --db; the API answers at most 1000)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON: {\"events\": [...]}")
	return c
}
