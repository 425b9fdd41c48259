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
	"github.com/bettercompute/bettercompute/internal/auditlog"
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

// auditFiles is a control plane's files for the audit commands: a
// SQLite database with five sealed rows of the root tenant, its PKI
// bundle and KEK, and the verifier key ('audit key').
type auditFiles struct {
	dir, dsn, pkiDir, kekFile, keyFile string
}

// newAuditFiles makes auditFiles, sealing and exporting the key through
// the CLI as an operator would.
func newAuditFiles(t *testing.T) auditFiles {
	t.Helper()
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
	recordRows(t, db, 5)
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
	return auditFiles{dir: dir, dsn: dsn, pkiDir: pkiDir, kekFile: kekFile, keyFile: keyFile}
}

// recordRows writes n audit rows of the root tenant.
func recordRows(t *testing.T, db *store.DB, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		err := db.Tx(ctx, func(tx *sql.Tx) error {
			return audit.Record(ctx, tx, time.UnixMilli(int64(1000+i)), audit.Entry{TenantID: "root", Actor: "user:alice", Action: "nodes.revoke", Resource: "node/x", Outcome: "allowed"})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestAuditCommands drives seal, key, verify, list, prove and check-proof
// as an operator would, then tampers with the database and checks verify's
// findings and exit status.
func TestAuditCommands(t *testing.T) {
	ctx := context.Background()
	af := newAuditFiles(t)
	dir, dsn, pkiDir, keyFile := af.dir, af.dsn, af.pkiDir, af.keyFile

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
	db, err := store.Open(ctx, dsn)
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

// TestAuditVerifySink: what the sink copied checks offline (verify-sink),
// and holds the database's log to what it saw (verify --held-sink): a log
// rolled back and sealed again, which verify alone cannot tell from an
// honest one, is log-rolled-back; a row edited in the sink is a finding
// of verify-sink. Findings exit 1, bad input 2.
func TestAuditVerifySink(t *testing.T) {
	ctx := context.Background()
	af := newAuditFiles(t)
	sinkFile := filepath.Join(af.dir, "audit-sink.jsonl")
	db, err := store.Open(ctx, af.dsn)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := auditlog.OpenFileSink(sinkFile)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := auditlog.NewPump(db, sink, sinkFile, clock.Real{}, nil).Run(ctx); err != nil || n != 5 {
		t.Fatalf("pump: %d %v", n, err)
	}
	sink.Close()

	if code, out, errs := run(t, "audit", "verify-sink", sinkFile, "--key", af.keyFile); code != 0 || out != "ok: cli.bc.local/audit/root: 5 rows, 1 checkpoints verified, 0 rows after the last\n" {
		t.Fatalf("verify-sink: %d %q %q", code, out, errs)
	}
	code, out, _ := run(t, "audit", "verify-sink", sinkFile, "--pki", af.pkiDir, "--json")
	var reps []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &reps) != nil || len(reps) != 1 || reps[0]["tenant"] != "root" || reps[0]["rows"] != float64(5) || reps[0]["covered"] != float64(5) {
		t.Fatalf("verify-sink --json: %d %q", code, out)
	}
	if code, out, errs := run(t, "audit", "verify", "--db", af.dsn, "--key", af.keyFile, "--held-sink", sinkFile); code != 0 || !strings.Contains(out, "ok: ") {
		t.Fatalf("verify --held-sink: %d %q %q", code, out, errs)
	}

	// Someone with the database rolls the log back to nothing and seals
	// two new rows: consistent in itself, but not with what the sink saw.
	for _, q := range []string{`DELETE FROM audit_events`, `DELETE FROM audit_checkpoints`, `DELETE FROM audit_log_nodes`, `DELETE FROM audit_log_state`, `DELETE FROM audit_sink_cursors`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	recordRows(t, db, 2)
	db.Close()
	if code, out, errs := run(t, "audit", "seal", "--db", af.dsn, "--pki", af.pkiDir, "--kek-file", af.kekFile); code != 0 {
		t.Fatalf("seal again: %d %q %q", code, out, errs)
	}
	if code, out, errs := run(t, "audit", "verify", "--db", af.dsn, "--key", af.keyFile); code != 0 {
		t.Fatalf("verify of the rolled-back log alone: %d %q %q, want ok (nothing inside shows it)", code, out, errs)
	}
	if code, out, _ := run(t, "audit", "verify", "--db", af.dsn, "--key", af.keyFile, "--held-sink", sinkFile); code != 1 || !strings.Contains(out, "log-rolled-back size=5") {
		t.Fatalf("verify --held-sink of the rolled-back log: %d %q, want exit 1 and log-rolled-back", code, out)
	}

	// A row edited in the sink's copy.
	b, _ := os.ReadFile(sinkFile)
	os.WriteFile(sinkFile, bytes.Replace(b, []byte(`"outcome":"allowed"`), []byte(`"outcome":"denied"`), 1), 0o600)
	if code, out, _ := run(t, "audit", "verify-sink", sinkFile, "--key", af.keyFile); code != 1 || !strings.HasPrefix(out, "root: sink-leaf-mismatch seq=0 ") {
		t.Fatalf("verify-sink of an edited copy: %d %q, want exit 1 and sink-leaf-mismatch", code, out)
	}
	if code, _, errs := run(t, "audit", "verify-sink", filepath.Join(af.dir, "missing.jsonl"), "--key", af.keyFile); code != 2 {
		t.Fatalf("verify-sink of a missing file: %d %q, want exit 2", code, errs)
	}
}
