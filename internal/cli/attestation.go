package cli

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/commands/attestation"
)

// attestationCmd is `commands attestation ID --out F`: it fetches a
// command's attestation and writes it as an attestation file (public
// evidence, so mode 0644).
func attestationCmd() *cobra.Command {
	var out string
	var force bool
	c := &cobra.Command{
		Use:   "attestation ID",
		Short: "Write a command's attested result (signed bytes, signature, node certificate) to a file anyone can verify offline",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return &ExitError{Code: 2, Err: errors.New("--out is required")}
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			if err := resolveArg(cmd, cl, "command", &args[0]); err != nil {
				return err
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
			a, err := cl.CommandAttestation(contextOf(cmd), args[0])
			if err != nil {
				return apiErr(err)
			}
			if a.Context != attestation.SigContext {
				return &ExitError{Code: 1, Err: errors.New("the server names an unknown signature context")}
			}
			var chain [][]byte
			rest := []byte(a.CertChainPEM)
			for {
				var blk *pem.Block
				blk, rest = pem.Decode(rest)
				if blk == nil {
					break
				}
				if blk.Type == "CERTIFICATE" {
					chain = append(chain, blk.Bytes)
				}
			}
			data := attestation.Encode(a.SignedBody, a.Signature, chain)
			if _, err := attestation.Parse(data); err != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("the server's attestation is malformed: %w", err)}
			}
			committed = true
			if err := of.Commit(data); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote the attestation of %s to %s\n", attestText(a.CommandID), out)
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "file to write")
	forceFlag(c, &force)
	return c
}

// verifyAttestationCmd is `commands verify-attestation F --ca CA`: it
// checks an attestation file offline, with no server. Exit 0 when it
// verifies, 1 when it does not, 2 on a usage error.
func verifyAttestationCmd() *cobra.Command {
	var caFile, trustDomain string
	var asJSON bool
	c := &cobra.Command{
		Use:   "verify-attestation FILE",
		Short: "Check an attestation file offline against the node CA: chain, node SPIFFE ID, signature over the exact bytes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if caFile == "" {
				return &ExitError{Code: 2, Err: errors.New("--ca is required (the node CA certificate, PEM)")}
			}
			caPEM, err := os.ReadFile(caFile)
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("read --ca: %w", err)}
			}
			roots := x509.NewCertPool()
			if !roots.AppendCertsFromPEM(caPEM) {
				return &ExitError{Code: 2, Err: errors.New("--ca holds no PEM certificate")}
			}
			data, err := readLimited(args[0], attestation.MaxFileBytes)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			f, err := attestation.Parse(data)
			if err != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("not verified: %w", err)}
			}
			r, err := attestation.Verify(f, roots, trustDomain)
			if err != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("not verified: %w", err)}
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), r)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "verified: signed by %s (certificate %s) at %s\n", attestText(r.SPIFFEID), attestText(r.CertSerial), timeText(r.SignedAt))
			fmt.Fprintf(&b, "command:        %s\n", attestText(r.CommandID))
			fmt.Fprintf(&b, "kind:           %s\n", attestText(r.Kind))
			fmt.Fprintf(&b, "state:          %s\n", attestText(r.State))
			if r.Reason != "" {
				fmt.Fprintf(&b, "reason:         %s\n", attestText(r.Reason))
			}
			fmt.Fprintf(&b, "payload sha256: %s\n", r.PayloadSHA256)
			_, err = fmt.Fprint(cmd.OutOrStdout(), b.String())
			return err
		},
	}
	c.Flags().StringVar(&caFile, "ca", "", "node CA certificate (PEM) the node certificate must chain to")
	c.Flags().StringVar(&trustDomain, "trust-domain", "", "require this SPIFFE trust domain (default: the certificate's own)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// readLimited reads at most limit bytes of path; a larger file is refused.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read attestation file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read attestation file: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, errors.New("attestation file larger than 1 MiB")
	}
	return data, nil
}

// attestText drops control characters from a string printed to a terminal.
func attestText(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 {
			return -1
		}
		return r
	}, s)
}
