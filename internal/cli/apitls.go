package cli

import (
	"crypto/tls"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bettercompute/bettercompute/internal/config"
)

// caFileFlag is the value of the persistent --ca-file flag of the command
// being run ("" when not given).
var caFileFlag string

// addCAFlag adds --ca-file to every command: the CA the CLI verifies the
// API's TLS certificate against.
func addCAFlag(root *cobra.Command) {
	root.PersistentFlags().StringVar(&caFileFlag, "ca-file", "",
		"the control plane's CA to verify the API against: the PKI bundle directory or its API CA PEM (default $BC_CA_FILE; dev writes DATA/api-ca.pem)")
}

// caFile is --ca-file ("" when not given: client.FromEnvCA then reads
// BC_CA_FILE).
func caFile() string { return caFileFlag }

// loadAPICert reads the API's own certificate chain and key (api.cert_file
// and api.key_file); the key file must not be open to group or other.
func loadAPICert(certFile, keyFile string) (*tls.Certificate, error) {
	fi, err := os.Stat(keyFile)
	if err != nil {
		return nil, fmt.Errorf("api.key_file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("api.key_file: %s is readable or writable by group or other (chmod 600 it)", keyFile)
	}
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("api.cert_file: %w", err)
	}
	return &c, nil
}

// addServeTLSFlags adds serve's flags of the API's TLS ([api] names,
// cert_file, key_file, plain_http).
func addServeTLSFlags(f *pflag.FlagSet, cfg *config.Config, apiNames *string) {
	f.StringVar(apiNames, "api-names", *apiNames, "comma-separated DNS names or IPs for the API's certificate, issued from the internal CA (loopback is always included)")
	f.StringVar(&cfg.API.CertFile, "tls-cert", cfg.API.CertFile, "the API's own TLS certificate chain (PEM) instead of one from the internal CA")
	f.StringVar(&cfg.API.KeyFile, "tls-key", cfg.API.KeyFile, "the key of --tls-cert (PEM, 0600)")
	f.BoolVar(&cfg.API.PlainHTTP, "plain-http", cfg.API.PlainHTTP, "serve the API without TLS: only on a loopback --api, or behind --trusted-proxies (then only they are answered)")
}
