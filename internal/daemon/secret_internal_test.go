package daemon

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"math/big"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// TestOpenSecretAnswerRefusesExpired checks the node's side of the JWE's
// expiry: an answer is opened only before its exp (header and sealed
// payload agreeing), only for this request's reference and id, only under
// the request's one-time key, and only when its type is the secret
// release's.
func TestOpenSecretAnswerRefusesExpired(t *testing.T) {
	otk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Unix(1_800_000_000, 0)
	typed := func(typ jose.ContentType, key *ecdsa.PublicKey, ref, req string, exp, headerExp int64) string {
		payload, _ := json.Marshal(map[string]any{"ref": ref, "version": 1, "value": "dmFsdWU=", "exp": exp, "request_id": req})
		enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.ECDH_ES_A256KW, Key: key},
			(&jose.EncrypterOptions{}).WithType(typ).WithHeader("exp", headerExp))
		if err != nil {
			t.Fatal(err)
		}
		obj, err := enc.Encrypt(payload)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := obj.CompactSerialize()
		return s
	}
	answer := func(key *ecdsa.PublicKey, ref, req string, exp, headerExp int64) string {
		return typed("bc-secret+jwe", key, ref, req, exp, headerExp)
	}
	exp := now.Add(5 * time.Minute).Unix()
	v, err := openSecretAnswer(answer(&otk.PublicKey, "secret://root/a", "req-1", exp, exp), otk, "secret://root/a", "req-1", now)
	if err != nil || string(v) != "value" {
		t.Fatalf("good answer: %q %v", v, err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for name, c := range map[string]struct {
		jwe string
		at  time.Time
	}{
		"expired":            {answer(&otk.PublicKey, "secret://root/a", "req-1", exp, exp), time.Unix(exp, 0)},
		"long expired":       {answer(&otk.PublicKey, "secret://root/a", "req-1", exp, exp), now.Add(time.Hour)},
		"header exp differs": {answer(&otk.PublicKey, "secret://root/a", "req-1", exp, exp+3600), now},
		"another reference":  {answer(&otk.PublicKey, "secret://root/b", "req-1", exp, exp), now},
		"another request":    {answer(&otk.PublicKey, "secret://root/a", "req-2", exp, exp), now},
		"another key":        {answer(&other.PublicKey, "secret://root/a", "req-1", exp, exp), now},
		"not a jwe":          {"e30.e30.e30", now},
		"another type":       {typed("JWT", &otk.PublicKey, "secret://root/a", "req-1", exp, exp), now},
		"untyped":            {typed("", &otk.PublicKey, "secret://root/a", "req-1", exp, exp), now},
	} {
		if v, err := openSecretAnswer(c.jwe, otk, "secret://root/a", "req-1", c.at); err == nil {
			t.Errorf("%s: opened %q", name, v)
		}
	}
}

// TestNodeStatementsSignedAsWireSignNode checks that every statement the
// node signs (update, sandbox report, secret request) is wire.SignNode's
// signature under its own context, with an ECDSA node key and with an
// Ed25519 one alike (the secret request once signed ECDSA only), and
// names the current certificate.
func TestNodeStatementsSignedAsWireSignNode(t *testing.T) {
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range map[string]crypto.Signer{"ecdsa": ecKey, "ed25519": edKey} {
		n := &Node{cfg: Config{Clock: clock.NewFake(time.Unix(1_800_000_000, 0)), Log: slog.New(slog.DiscardHandler)}, rec: &JoinRecord{NodeID: "n-1"},
			key: key, chain: []*x509.Certificate{{SerialNumber: big.NewInt(7)}}, reports: newReports()}
		upd, err := n.SignUpdate(&nodev1.UpdateBody{CommandId: "c1", State: string(wire.StateSucceeded)})
		if err != nil {
			t.Fatalf("%s: update: %v", name, err)
		}
		var u nodev1.CommandUpdate
		if err := proto.Unmarshal(upd, &u); err != nil {
			t.Fatal(err)
		}
		rep, err := n.SignReport(&nodev1.SandboxReportBody{SandboxId: "sbx-1", State: sandboxFailed})
		if err != nil {
			t.Fatalf("%s: report: %v", name, err)
		}
		req, err := n.SignSecretRequest(&nodev1.SecretRequestBody{NodeId: "n-1", Ref: "secret://t/a", RequestId: "r1"})
		if err != nil {
			t.Fatalf("%s: secret request: %v", name, err)
		}
		for _, c := range []struct {
			ctx, serial string
			body, sig   []byte
		}{
			{wire.UpdateSigContext, u.CertSerial, u.Body, u.NodeSig},
			{wire.SandboxReportSigContext, rep.CertSerial, rep.Body, rep.NodeSig},
			{wire.SecretRequestSigContext, req.CertSerial, req.Body, req.NodeSig},
		} {
			if !wire.VerifyNode(key.Public(), c.ctx, c.body, c.sig) {
				t.Errorf("%s: %q statement does not verify", name, c.ctx)
			}
			if wire.VerifyNode(key.Public(), wire.RenewSigContext, c.body, c.sig) {
				t.Errorf("%s: %q statement verifies under another context", name, c.ctx)
			}
			if c.serial != "07" {
				t.Errorf("%s: %q statement names serial %q", name, c.ctx, c.serial)
			}
		}
	}
}
