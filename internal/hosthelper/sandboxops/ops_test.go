package sandboxops_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/hosthelper/sandboxops"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes/checkpoint"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// signer is a worker key chained to a real command root, as the control
// plane's workers sign commands.
type signer struct {
	td    string
	roots []*x509.Certificate
	priv  ed25519.PrivateKey
	cert  []byte
}

// newSigner makes a PKI (pki.Init) and a worker certificate under its
// command root, as internal/daemon's verify tests do.
func newSigner(t testing.TB, now time.Time) signer {
	t.Helper()
	kek, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(filepath.Join(t.TempDir(), "pki"), "unit.bc.local", kek, clock.NewFake(now.Add(-48*time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	rk, err := b.CommandRootKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	cert, err := pki.IssueWorkerCert(b.CommandRoot, rk, b.TrustDomain, "w1", pub, 24*time.Hour, now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return signer{td: b.TrustDomain, roots: []*x509.Certificate{b.CommandRoot}, priv: priv, cert: cert}
}

// command signs a command of kind with payload (any JSON value) for node,
// issued at now; mut may change the body before it is signed.
func (s signer) command(t testing.TB, now time.Time, node, kind string, payload any, mut func(*nodev1.CommandBody)) []byte {
	t.Helper()
	p, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	b := &nodev1.CommandBody{CommandId: ids.New("cmd"), NodeId: node, Kind: kind, Payload: p,
		IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(10 * time.Minute).UnixMilli(), Nonce: "x"}
	if mut != nil {
		mut(b)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(&nodev1.SignedCommand{Id: b.CommandId, Body: body,
		Signature: ed25519.Sign(s.priv, append([]byte(wire.CommandSigContext), body...)), SignerCertDer: s.cert})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// trust is the helper's Trust for node n1 under s's roots, for a node role.
func (s signer) trust() sandboxops.Trust {
	return sandboxops.Trust{NodeID: "n1", TrustDomain: s.td, Roots: s.roots, Role: pki.RoleNode}
}

// imageStore writes tarball into a fresh file:// image store and returns
// its URL and the image's digest.
func imageStore(t testing.TB, tarball []byte) (string, string) {
	t.Helper()
	dir := t.TempDir()
	digest := imagetar.Digest(tarball)
	p := filepath.Join(dir, spec.ImageKey(digest))
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, tarball, 0o600); err != nil {
		t.Fatal(err)
	}
	return "file://" + dir, digest
}

// tinyImage is a one-file image, enough for the sim runtime.
func tinyImage(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "hello", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	_, _ = tw.Write([]byte("hi"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// openHost opens a real sandbox host on rt in a fresh state directory
// (short: overlay options hold paths), with the image store at store.
func openHost(t testing.TB, rt func(dir string) sandbox.Runtime, store string, clk clock.Clock) *sandbox.Host {
	t.Helper()
	dir, err := os.MkdirTemp("", "bcsbo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return openHostIn(t, dir, rt, store, clk)
}

// openHostIn is openHost in dir (a host opening again, as after a
// restart, when dir already holds one's state).
func openHostIn(t testing.TB, dir string, rt func(dir string) sandbox.Runtime, store string, clk clock.Clock) *sandbox.Host {
	t.Helper()
	ctx := context.Background()
	im, err := sandbox.OpenImages(ctx, store, filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Close() })
	cs, err := checkpoint.OpenStore(ctx, filepath.Join(dir, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	h, err := sandbox.OpenHost(ctx, sandbox.HostConfig{Dir: dir, Runtime: rt(filepath.Join(dir, "rt")), Images: im, Clock: clk,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Slots: 4, MemoryMB: 1024, Checkpoints: cs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, id := range h.Sandboxes() {
			raw, _ := json.Marshal(spec.Delete{SandboxID: id})
			_, _ = h.Delete(context.Background(), raw)
		}
	})
	return h
}

// newOps makes Ops on h with stateDir, trusting what trust returns.
func newOps(t testing.TB, h *sandbox.Host, stateDir string, clk clock.Clock, trust sandboxops.TrustFunc) *sandboxops.Ops {
	t.Helper()
	o, err := sandboxops.New(sandboxops.Config{Host: h, Trust: trust, StateDir: stateDir, Clock: clk, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func fixed(tr sandboxops.Trust) sandboxops.TrustFunc {
	return func(context.Context, *helperwire.Request) (sandboxops.Trust, error) { return tr, nil }
}

func req(op string, cmd []byte) *helperwire.Request {
	return &helperwire.Request{Version: helperwire.Version, Op: op, Command: cmd}
}

// wantRefusal fails unless err is the refusal code/reason.
func wantRefusal(t *testing.T, err error, code, reason string) {
	t.Helper()
	var r *helperwire.Refusal
	if !errors.As(err, &r) || r.Code != code || r.Reason != reason {
		t.Fatalf("got %v, want refusal %s/%s", err, code, reason)
	}
}

func createPayload(digest, runtime string, deadline time.Time) spec.Create {
	return spec.Create{SandboxID: ids.New("sbx"), ImageDigest: digest, Runtime: runtime,
		Limits: spec.Limits{CPUMillis: 500, MemoryMB: 128, Pids: 64, DiskMB: 64}, Network: spec.NetworkNone,
		DeadlineMS: deadline.UnixMilli()}
}
