package cli_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestAuditCommands drives seal, key, verify, list, prove and check-proof
// as an operator would, then tampers with the database and checks verify's
// findings and exit status.
func TestAuditCommands(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	kekFile, pkiDir := filepath.Join(dir, "kek"), filepath.Join(dir, "pki")
	kek, err := pki.CreateKEK(kekFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Init(pkiDir, "cli.bc.local", kek, clock.Real{}); err != nil {
		t.Fatal(err)
	}
	dsn := "sqlite:" + filepath.Join(dir, "control.db")
	db, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		err := db.Tx(ctx, func(tx *sql.Tx) error {
			return audit.Record(ctx, tx, time.UnixMilli(int64(1000+i)), audit.Entry{TenantID: "root", Actor: "user:alice", Action: "nodes.revoke", Resource: "node/x", Outcome: "allowed"})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	db.Close() // the CLI opens it itself (SQLite: one connection)

	if code, out, errs := run(t, "audit", "seal", "--db", dsn, "--pki", pkiDir, "--kek-file", kekFile); code != 0 || !strings.Contains(out, "sealed 5 rows of tenant root: checkpoint size 5") {
		t.Fatalf("seal: %d %q %q", code, out, errs)
	}
	code, vkey, _ := run(t, "audit", "key", "--pki", pkiDir)
	if code != 0 || !strings.HasPrefix(vkey, "cli.bc.local/audit+") || strings.Count(strings.TrimSpace(vkey), "+") < 2 {
		t.Fatalf("key: %d %q", code, vkey)
	}
	keyFile := filepath.Join(dir, "audit.vkey")
	os.WriteFile(keyFile, []byte(vkey), 0o644)

	for _, keyArgs := range [][]string{{"--pki", pkiDir}, {"--key", keyFile}} {
		args := append([]string{"audit", "verify", "--tenant", "root", "--db", dsn}, keyArgs...)
		if code, out, errs := run(t, args...); code != 0 || !strings.Contains(out, "ok: cli.bc.local/audit/root: 5 rows, 1 checkpoints verified") {
			t.Fatalf("verify %v: %d %q %q", keyArgs, code, out, errs)
		}
	}

	code, out, _ := run(t, "audit", "list", "--tenant", "root", "--db", dsn, "--json")
	var list struct {
		Events []map[string]any `json:"events"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Events) != 5 {
		t.Fatalf("list: %d %q", code, out)
	}
	for i, e := range list.Events {
		if e["id"] == "" || e["seq"] != float64(i) || e["action"] != "nodes.revoke" || e["sealed"] != true {
			t.Fatalf("list entry %d: %v", i, e)
		}
	}
	event := list.Events[3]["id"].(string)

	proofFile := filepath.Join(dir, "proof.txt")
	if code, out, errs := run(t, "audit", "prove", "--tenant", "root", "--event", event, "--out", proofFile, "--db", dsn); code != 0 {
		t.Fatalf("prove: %d %q %q", code, out, errs)
	}
	proofBytes, _ := os.ReadFile(proofFile)
	if !strings.HasPrefix(string(proofBytes), "c2sp.org/tlog-proof@v1\nextra ") || !strings.Contains(string(proofBytes), "\nindex 3\n") {
		t.Fatalf("proof file:\n%s", proofBytes)
	}
	code, out, _ = run(t, "audit", "check-proof", proofFile, "--key", keyFile)
	if code != 0 || !strings.Contains(out, `"id": "`+event+`"`) || !strings.Contains(out, `"verified": true`) {
		t.Fatalf("check-proof: %d %q", code, out)
	}
	flipped := bytes.Clone(proofBytes)
	flipped[len("c2sp.org/tlog-proof@v1\nextra ")+10] ^= 1
	os.WriteFile(proofFile, flipped, 0o644)
	if code, _, errs := run(t, "audit", "check-proof", proofFile, "--key", keyFile); code != 1 || !strings.Contains(errs, "proof refused") {
		t.Fatalf("flipped proof: %d %q", code, errs)
	}

	// Bad input exits 2.
	if code, out, errs := run(t, "audit", "verify", "--db", dsn, "--key", keyFile); code != 0 || !strings.Contains(out, "ok: cli.bc.local/audit/root: 5 rows") {
		t.Fatalf("verify without --tenant (the root tenant): %d %q %q", code, out, errs)
	}
	if code, _, _ := run(t, "audit", "verify", "--tenant", "root", "--db", dsn, "--key", filepath.Join(dir, "missing")); code != 2 {
		t.Fatalf("verify with a missing key file: exit %d, want 2", code)
	}
	// A tenant's log with no checkpoint yet has none to save.
	if code, _, errs := run(t, "audit", "verify", "--db", dsn, "--key", keyFile, "--tenant", "tnobody", "--save-checkpoint", filepath.Join(dir, "none.txt")); code != 2 || !strings.Contains(errs, "no verified checkpoint") {
		t.Fatalf("verify --save-checkpoint of an empty log: %d %q, want exit 2", code, errs)
	}
	if _, err := os.Stat(filepath.Join(dir, "none.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an empty log's checkpoint file: %v, want none written", err)
	}
	// A checkpoint saved by one verify is held by the next; a held file
	// that does not verify (the flipped proof) is bad input.
	held := filepath.Join(dir, "held.txt")
	if code, out, errs := run(t, "audit", "verify", "--db", dsn, "--key", keyFile, "--save-checkpoint", held); code != 0 {
		t.Fatalf("verify --save-checkpoint: %d %q %q", code, out, errs)
	}
	if b, err := os.ReadFile(held); err != nil || !strings.HasPrefix(string(b), "cli.bc.local/audit/root\n5\n") {
		t.Fatalf("saved checkpoint: %q %v", b, err)
	}
	if code, out, errs := run(t, "audit", "verify", "--db", dsn, "--key", keyFile, "--held", held); code != 0 || !strings.Contains(out, "ok: ") {
		t.Fatalf("verify --held its own checkpoint: %d %q %q", code, out, errs)
	}
	if code, _, errs := run(t, "audit", "verify", "--db", dsn, "--key", keyFile, "--held", proofFile); code != 2 || !strings.Contains(errs, "--held") {
		t.Fatalf("verify --held a flipped proof: exit %d %q, want 2", code, errs)
	}

	// Tamper: verify names it and exits 1, in text and JSON.
	db, err = store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE audit_events SET outcome = 'denied' WHERE id = $1`, event); err != nil {
		t.Fatal(err)
	}
	db.Close()
	code, out, _ = run(t, "audit", "verify", "--tenant", "root", "--db", dsn, "--key", keyFile)
	if code != 1 || strings.TrimSpace(out) != "row-edited seq=3 event="+event {
		t.Fatalf("verify tampered: %d %q", code, out)
	}
	code, out, _ = run(t, "audit", "verify", "--tenant", "root", "--db", dsn, "--key", keyFile, "--json")
	var fs []map[string]any
	if code != 1 || json.Unmarshal([]byte(out), &fs) != nil || len(fs) != 1 || fs[0]["kind"] != "row-edited" || fs[0]["seq"] != float64(3) || fs[0]["event"] != event {
		t.Fatalf("verify --json tampered: %d %q", code, out)
	}
}
