package devenv

import (
	"fmt"
	"path/filepath"
)

// envFile is the text of DATA/env: what the CLI needs to reach this dev
// system, through the API (BC_ADDR, BC_API_KEY_FILE, BC_CA_FILE) and, for the audit
// commands that work on the database directly, the database, the PKI
// bundle and the key-encryption key file (BC_DB, BC_PKI, BC_KEK_FILE).
// With a bastion (bastionID not ""), BC_BASTION_ID names it for the
// README's examples.
func envFile(apiURL, keyFile, caFile, dataDir, bastionID string) string {
	s := fmt.Sprintf("export BC_ADDR=%s\nexport BC_API_KEY_FILE=%s\nexport BC_CA_FILE=%s\nexport BC_DB=%s\nexport BC_PKI=%s\nexport BC_KEK_FILE=%s\n",
		shellQuote(apiURL), shellQuote(keyFile), shellQuote(caFile), shellQuote("sqlite:"+filepath.Join(dataDir, "control.db")),
		shellQuote(filepath.Join(dataDir, "pki")), shellQuote(filepath.Join(dataDir, "kek")))
	if bastionID != "" {
		s += fmt.Sprintf("export BC_BASTION_ID=%s\n", shellQuote(bastionID))
	}
	return s
}
