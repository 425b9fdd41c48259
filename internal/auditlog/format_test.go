package auditlog_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

func sampleRow() auditlog.Row {
	return auditlog.Row{Seq: 17, ID: "ev_abc", TenantID: iam.RootTenant, At: 1700000000000, Actor: "user:alice", Action: "nodes.revoke",
		Resource: "node/n1", Outcome: "allowed", RequestID: "req-1", Caller: "127.0.0.1", Details: `{"serial":"01"}`}
}

func TestRowEncodingCoversEveryField(t *testing.T) {
	base := sampleRow()
	enc := auditlog.EncodeRow(base)
	got, err := auditlog.DecodeRow(enc)
	if err != nil || got != base {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	edits := map[string]func(*auditlog.Row){
		"seq": func(r *auditlog.Row) { r.Seq++ }, "id": func(r *auditlog.Row) { r.ID += "x" },
		"tenant": func(r *auditlog.Row) { r.TenantID = "t2" }, "at": func(r *auditlog.Row) { r.At++ },
		"actor": func(r *auditlog.Row) { r.Actor = "user:bob" }, "action": func(r *auditlog.Row) { r.Action = "x" },
		"resource": func(r *auditlog.Row) { r.Resource = "" }, "outcome": func(r *auditlog.Row) { r.Outcome = "denied" },
		"request_id": func(r *auditlog.Row) { r.RequestID = "req-2" }, "caller": func(r *auditlog.Row) { r.Caller = "::1" },
		"details": func(r *auditlog.Row) { r.Details = `{"serial":"02"}` },
		// Moving bytes between adjacent fields must change the encoding too.
		"boundary": func(r *auditlog.Row) { r.Actor, r.Action = "user:alicen", "odes.revoke" },
	}
	for name, edit := range edits {
		r := base
		edit(&r)
		if bytes.Equal(auditlog.LeafHash(r), auditlog.LeafHash(base)) {
			t.Errorf("%s: edit does not change the leaf hash", name)
		}
	}
	for _, bad := range [][]byte{nil, enc[:len(enc)-1], append(bytes.Clone(enc), 0), append([]byte("bcaudit2"), enc[8:]...)} {
		if _, err := auditlog.DecodeRow(bad); !errors.Is(err, auditlog.ErrBadRow) {
			t.Errorf("DecodeRow(%q) = %v, want ErrBadRow", bad, err)
		}
	}
}

func TestParseCheckpointStrict(t *testing.T) {
	good := "example/audit/root\n12\n" + "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=" + "\n"
	c, err := auditlog.ParseCheckpoint([]byte(good))
	if err != nil || c.Origin != "example/audit/root" || c.Size != 12 || len(c.Root) != 32 {
		t.Fatalf("parse: %+v %v", c, err)
	}
	if !bytes.Equal(c.Marshal(), []byte(good)) {
		t.Fatalf("marshal differs")
	}
	for _, bad := range []string{
		"", good[:len(good)-1], "example\n012\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n",
		"example\n-1\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n", "example\n1\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFV=\n",
		"example\n1\nAAAA\n", good + "extension\n", " example\n1\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n",
	} {
		if _, err := auditlog.ParseCheckpoint([]byte(bad)); !errors.Is(err, auditlog.ErrBadCheckpoint) {
			t.Errorf("ParseCheckpoint(%q) = %v, want ErrBadCheckpoint", bad, err)
		}
	}
}

// TestCheckProofRefusesEveryBitFlip makes a proof with prove, checks it
// passes, then flips every bit of the file, one at a time: every variant
// must fail.
func TestCheckProofRefusesEveryBitFlip(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	f := newFixture(t, db, 5)
	ids := f.record(t, iam.RootTenant, 13)
	f.seal(t, iam.RootTenant)
	p, err := f.log.Prove(context.Background(), iam.RootTenant, ids[6])
	if err != nil {
		t.Fatal(err)
	}
	file := p.Marshal()
	if _, err := auditlog.CheckProof(file, f.v); err != nil {
		t.Fatalf("untouched proof: %v", err)
	}
	if len(p.Hashes) < 3 {
		t.Fatalf("proof has %d hashes; want a real path", len(p.Hashes))
	}
	for i := range file {
		for bit := 0; bit < 8; bit++ {
			flipped := bytes.Clone(file)
			flipped[i] ^= 1 << bit
			if v, err := auditlog.CheckProof(flipped, f.v); err == nil {
				t.Fatalf("byte %d bit %d flipped: proof still checks (%+v)", i, bit, v.Row)
			}
		}
	}
	other, err := auditlog.NewSigningKey(deployment, seedKey(8))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auditlog.CheckProof(file, other.Verifier); err == nil {
		t.Fatal("proof checks under another key")
	}
}

func FuzzParseProof(f *testing.F) {
	f.Add([]byte("c2sp.org/tlog-proof@v1\nextra AAAA\nindex 0\n\nexample/audit/root\n1\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n\n— example/audit AAAAAAAA\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := auditlog.ParseProof(b)
		if err != nil {
			if !errors.Is(err, auditlog.ErrBadProof) {
				t.Fatalf("error %v is not ErrBadProof", err)
			}
			return
		}
		// What parses re-marshals to the same bytes: one encoding per proof.
		if !bytes.Equal(p.Marshal(), b) {
			t.Fatalf("parse/marshal not identical:\n%q\n%q", b, p.Marshal())
		}
	})
}

func FuzzParseCheckpoint(f *testing.F) {
	f.Add([]byte("example/audit/root\n12\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := auditlog.ParseCheckpoint(b)
		if err != nil {
			if !errors.Is(err, auditlog.ErrBadCheckpoint) {
				t.Fatalf("error %v is not ErrBadCheckpoint", err)
			}
			return
		}
		if !bytes.Equal(c.Marshal(), b) {
			t.Fatalf("parse/marshal not identical: %q", b)
		}
	})
}

func FuzzDecodeRow(f *testing.F) {
	f.Add(auditlog.EncodeRow(sampleRow()))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := auditlog.DecodeRow(b)
		if err != nil {
			if !errors.Is(err, auditlog.ErrBadRow) {
				t.Fatalf("error %v is not ErrBadRow", err)
			}
			return
		}
		if !bytes.Equal(auditlog.EncodeRow(r), b) {
			t.Fatalf("decode/encode not identical")
		}
	})
}

func TestSigningKeyForAnyKey(t *testing.T) {
	// A verifier key's base64 may hold '+', the field separator: every key
	// must still make a signer whose signatures verify.
	for b := 0; b < 64; b++ {
		k, err := auditlog.NewSigningKey(deployment, seedKey(byte(b)))
		if err != nil {
			t.Fatalf("seed %d: %v", b, err)
		}
		if k.Signer.KeyHash() != k.Verifier.KeyHash() || k.Signer.Name() != "test.bc.local/audit" {
			t.Fatalf("seed %d: signer and verifier differ", b)
		}
	}
}
