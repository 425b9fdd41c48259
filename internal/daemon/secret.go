package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// FetchSecret asks the broker for ref, for the command commandID, over
// conn. It makes a P-256 key for this one request, signs the request with
// the node key, opens the JWE and returns the value; the one-time key is
// dropped when it returns. The value is never journaled or logged.
func (n *Node) FetchSecret(ctx context.Context, conn *grpc.ClientConn, commandID, ref string) ([]byte, error) {
	otk, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("daemon: one-time key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&otk.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("daemon: one-time key: %w", err)
	}
	reqID := ids.Secret(18)
	req, err := n.SignSecretRequest(&nodev1.SecretRequestBody{NodeId: n.rec.NodeID, Ref: ref, RequestId: reqID, OneTimeKey: pub, CommandId: commandID})
	if err != nil {
		return nil, err
	}
	resp, err := nodev1.NewGatewayClient(conn).Secret(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("daemon: secret refused: %w", err)
	}
	return openSecretAnswer(resp.Jwe, otk, ref, reqID, n.now())
}

// openSecretAnswer opens the broker's JWE with the request's one-time key
// and returns the value. It refuses an answer that is not a compact
// ECDH-ES+A256KW/A256GCM JWE of type wire.SecretReleaseType to that key,
// names another reference or request, or has expired at now (in its
// protected header or its sealed payload).
func openSecretAnswer(jwe string, otk *ecdsa.PrivateKey, ref, reqID string, now time.Time) ([]byte, error) {
	obj, err := jose.ParseEncryptedCompact(jwe, []jose.KeyAlgorithm{jose.ECDH_ES_A256KW}, []jose.ContentEncryption{jose.A256GCM})
	if err != nil {
		return nil, fmt.Errorf("daemon: secret answer: %w", err)
	}
	if typ, _ := obj.Header.ExtraHeaders[jose.HeaderType].(string); typ != wire.SecretReleaseType {
		return nil, errors.New("daemon: secret answer is not a secret release")
	}
	plain, err := obj.Decrypt(otk)
	if err != nil {
		return nil, fmt.Errorf("daemon: secret answer does not open: %w", err)
	}
	defer clear(plain)
	var p wire.SecretRelease
	if err := json.Unmarshal(plain, &p); err != nil {
		return nil, fmt.Errorf("daemon: secret answer: %w", err)
	}
	hexp, ok := obj.Header.ExtraHeaders["exp"].(float64)
	if p.Ref != ref || p.Request != reqID || !ok || int64(hexp) != p.Exp || !now.Before(time.Unix(p.Exp, 0)) {
		return nil, errors.New("daemon: secret answer is for another request or expired")
	}
	return base64.StdEncoding.DecodeString(p.Value)
}

// SignSecretRequest stamps b with the node's time and signs it with the
// node key.
func (n *Node) SignSecretRequest(b *nodev1.SecretRequestBody) (*nodev1.SecretRequest, error) {
	if b.TimeMs == 0 {
		b.TimeMs = n.now().UnixMilli()
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("daemon: encode secret request: %w", err)
	}
	sig, serial, err := n.sign(wire.SecretRequestSigContext, body)
	if err != nil {
		return nil, fmt.Errorf("daemon: sign secret request: %w", err)
	}
	return &nodev1.SecretRequest{Body: body, NodeSig: sig, CertSerial: serial}, nil
}
