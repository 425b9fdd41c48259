package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/pki"
)

// rotateStep is one of the three rotation steps.
type rotateStep string

const (
	stepStage    rotateStep = "stage"
	stepActivate rotateStep = "activate"
	stepRetire   rotateStep = "retire"
)

// rotateResult is what `pki rotate STEP KEY --json` prints.
type rotateResult struct {
	Key      string             `json:"key"`
	Step     string             `json:"step"`
	IssuedAt time.Time          `json:"issued_at"`
	Rotation []pki.RotationInfo `json:"rotation"`
	Next     string             `json:"next"`
}

// pkiRotateCmd is `pki rotate stage|activate|retire KEY`.
func pkiRotateCmd(clk clock.Clock) *cobra.Command {
	c := &cobra.Command{
		Use:   "rotate",
		Short: "Rotate a CA or key of the bundle in three steps: stage, activate, retire",
		Long: "Rotate one of node-ca, internal-ca, command-root, join-key, audit-key with an overlap, so that\n" +
			"nothing signed with either key is refused while the new one spreads:\n\n" +
			"  stage KEY     make a new key, trusted everywhere (trust bundle, roots, verifiers) but unused\n" +
			"  activate KEY  the staged key signs from now on; the old one stays trusted as \"previous\"\n" +
			"  retire KEY    stop trusting the previous key (refused within 24h of activate unless --force)\n\n" +
			"After each step restart the control plane's processes so they load the bundle; joined nodes\n" +
			"fetch the new trust bundle on their next session and every 10 minutes (see docs/operations.md).",
	}
	for _, step := range []rotateStep{stepStage, stepActivate, stepRetire} {
		c.AddCommand(rotateStepCmd(step, clk))
	}
	return c
}

func rotateStepCmd(step rotateStep, clk clock.Clock) *cobra.Command {
	var dir, kekFile string
	var force, asJSON bool
	c := &cobra.Command{
		Use:       string(step) + " KEY",
		Short:     rotateShort[step],
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"node-ca", "internal-ca", "command-root", "join-key", "audit-key"},
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := pki.ParseKind(args[0])
			if err != nil {
				return badInput(err)
			}
			var b *pki.Bundle
			if step == stepRetire {
				b, err = pki.RotateRetire(dir, kind, clk, force)
			} else {
				kek, kerr := pki.LoadKEK(kekFile)
				if kerr != nil {
					return badInput(fmt.Errorf("--kek-file: %w", kerr))
				}
				if step == stepStage {
					b, err = pki.RotateStage(dir, kek, kind, clk)
				} else {
					b, err = pki.RotateActivate(dir, kek, kind, clk)
				}
			}
			if err != nil {
				return rotateError(step, kind, err)
			}
			res := rotateResult{Key: string(kind), Step: string(step), IssuedAt: b.IssuedAt, Rotation: b.Show().Rotation, Next: rotateNext(step, kind)}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), res)
			}
			return printRotate(cmd.OutOrStdout(), res)
		},
	}
	c.Flags().StringVar(&dir, "dir", envOr(envPKI, "pki"), "bundle directory (default $BC_PKI, else pki)")
	if step != stepRetire {
		c.Flags().StringVar(&kekFile, "kek-file", envOr(envKEKFile, "kek"), "key-encryption key file (0600; default $BC_KEK_FILE, else kek); BC_KEK overrides")
	} else {
		c.Flags().BoolVar(&force, "force", false, "retire within 24h of activate (nodes that have not renewed lose their session)")
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

var rotateShort = map[rotateStep]string{
	stepStage:    "Make a new key, trusted everywhere but unused until activate",
	stepActivate: "Sign with the staged key from now on; the old one stays trusted until retire",
	stepRetire:   "Stop trusting the previous key (24h after activate, or --force)",
}

// rotateError turns a refused step into an error that names the next step.
func rotateError(step rotateStep, kind pki.Kind, err error) error {
	var hint string
	switch {
	case errors.Is(err, pki.ErrAlreadyStaged):
		hint = fmt.Sprintf("a staged %s exists; activate it first: better-compute pki rotate activate %s", kind, kind)
	case errors.Is(err, pki.ErrNothingStaged):
		hint = fmt.Sprintf("no staged %s; stage one first: better-compute pki rotate stage %s", kind, kind)
	case errors.Is(err, pki.ErrPreviousKept):
		hint = fmt.Sprintf("the previous %s is still trusted; retire it first: better-compute pki rotate retire %s", kind, kind)
	case errors.Is(err, pki.ErrNothingToRetire):
		hint = fmt.Sprintf("no previous %s to retire (activate replaces the active key with the staged one)", kind)
	case errors.Is(err, pki.ErrTooEarly):
		hint = fmt.Sprintf("the previous %s was replaced less than 24h ago: nodes or commands may still rely on it; wait, or pass --force", kind)
	default:
		return fmt.Errorf("pki rotate %s %s: %w", step, kind, err)
	}
	return &ExitError{Code: 1, Err: fmt.Errorf("FAILED_PRECONDITION: pki rotate %s %s: %s", step, kind, hint)}
}

// rotateNext is what to do after step on kind.
func rotateNext(step rotateStep, kind pki.Kind) string {
	restart := "restart the api, workers and gateway processes so they load the bundle (a gateway-only host: pki issue-gateway --force again and copy it there)"
	switch step {
	case stepStage:
		extra := ""
		switch kind {
		case pki.KindInternalCA:
			extra = "; give API clients the new CA file (pki show --api-ca > api-ca.pem)"
		case pki.KindAuditKey:
			extra = "; give audit verifiers the new key list (audit key)"
		}
		return fmt.Sprintf("%s%s; nodes fetch the new trust bundle within 10 minutes of their session; then: better-compute pki rotate activate %s", restart, extra, kind)
	case stepActivate:
		return fmt.Sprintf("%s; after 24h (every node certificate renewed, every worker key under the old root expired): better-compute pki rotate retire %s", restart, kind)
	}
	return restart + "; nodes fetch the new trust bundle within 10 minutes of their session"
}

func printRotate(w io.Writer, r rotateResult) error {
	fmt.Fprintf(w, "%s: %s done; trust bundle issued at %s\n", r.Key, r.Step, r.IssuedAt.Format(time.RFC3339))
	for _, ri := range r.Rotation {
		fmt.Fprintf(w, "  %s %s since %s\n", ri.Key, ri.State, ri.Since.Format(time.RFC3339))
	}
	_, err := fmt.Fprintf(w, "next: %s\n", r.Next)
	return err
}
