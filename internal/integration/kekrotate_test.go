package integration

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/config"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// digestSecret runs secret.digest of ref on nodeID and checks the node got
// value: the broker unsealed it, and a worker signed the command.
func digestSecret(t *testing.T, e *testenv.Env, nodeID, ref string, value []byte) {
	t.Helper()
	nonce := []byte(ids.Secret(16))
	c, err := e.Client.CreateCommand(context.Background(), nodeID, "secret.digest", json.RawMessage(`{"ref":"`+ref+`","nonce":"`+hex.EncodeToString(nonce)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	got := e.WaitCommand(t, c.ID)
	mac := hmac.New(sha256.New, value)
	mac.Write(nonce)
	var res struct {
		HMAC string `json:"hmac_sha256"`
	}
	if err := json.Unmarshal(got.Result, &res); err != nil || got.State != "succeeded" || !got.Attested || res.HMAC != hex.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("secret.digest: %s attested=%v result=%s reason=%q", got.State, got.Attested, got.Result, got.Reason)
	}
}

// rotateKEK runs `pki rotate-kek --json` and returns its counts.
func rotateKEK(t *testing.T, args ...string) cli.RotateKEKResult {
	t.Helper()
	var out, errb bytes.Buffer
	if code := cli.Main(append([]string{"pki", "rotate-kek", "--json"}, args...), &out, &errb); code != 0 {
		t.Fatalf("rotate-kek: exit %d: %s", code, errb.String())
	}
	var res cli.RotateKEKResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("rotate-kek --json: %v: %s", err, out.String())
	}
	return res
}

// serveKeyed starts the api, gateway and workers roles as `serve` does
// (cli.Serve) from the deployment's bundle and the KEK file kekFile.
func serveKeyed(t *testing.T, e *testenv.Env, db *store.DB, kekFile string) *server.ControlPlane {
	t.Helper()
	cfg := config.Default()
	cfg.PKI.Dir, cfg.PKI.KEKFile = filepath.Join(e.Dir, "pki"), kekFile
	cfg.API.Listen, cfg.Gateway.Listen, cfg.Metrics.Listen = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.API.PlainHTTP = true
	sctx, stop := context.WithCancel(context.Background())
	started := make(chan *server.ControlPlane, 1)
	done := make(chan error, 1)
	go func() { done <- cli.Serve(sctx, cfg, e.Log, db, func(cp *server.ControlPlane) { started <- cp }) }()
	select {
	case cp := <-started:
		t.Cleanup(func() { stop(); <-done })
		return cp
	case err := <-done:
		stop()
		t.Fatalf("serve with the new KEK: %v", err)
	case <-time.After(testenv.WaitTimeout):
		stop()
		t.Fatal("serve did not start")
	}
	return nil
}

// TestKEKRotation rotates a running deployment's key-encryption key with
// `pki rotate-kek` while its processes are stopped: a control plane started
// with the new KEK releases a secret put before the rotation and signs
// commands with the worker key made before it; one started with the old
// KEK refuses to start (INVALID_CONFIG, the node CA does not unseal). A
// second run finds everything done.
func TestKEKRotation(t *testing.T) {
	storetest.ForEachFreshDialect(t, func(t *testing.T, dsn string) {
		t.Setenv(pki.KEKEnv, "")
		ctx := context.Background()
		db, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		value := []byte("s3cr3t-" + ids.Secret(24))
		if err := e.Client.Call(ctx, "secrets.put", map[string]any{"name": "demo", "value_base64": base64.StdEncoding.EncodeToString(value)}, nil); err != nil {
			t.Fatal(err)
		}
		digestSecret(t, e, e.Nodes[0].NodeID(), "secret://root/demo", value)
		workerKey, err := e.CP.Signer.CurrentKey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e.Close()

		oldFile, newFile := filepath.Join(e.Dir, "kek"), filepath.Join(e.Dir, "kek.new")
		args := []string{"--pki", filepath.Join(e.Dir, "pki"), "--db", dsn, "--kek-file", oldFile, "--new-kek-file", newFile}
		res := rotateKEK(t, args...)
		if !res.CreatedNewKEK || res.BundleSlots != (pki.RekeyCount{Resealed: 6}) || res.Secrets != (pki.RekeyCount{Resealed: 1}) || res.WorkerKeys != (pki.RekeyCount{Resealed: 1}) {
			t.Fatalf("first run: %+v", res)
		}
		if res := rotateKEK(t, args...); res.CreatedNewKEK || res.BundleSlots != (pki.RekeyCount{AlreadyDone: 6}) || res.Secrets != (pki.RekeyCount{AlreadyDone: 1}) || res.WorkerKeys != (pki.RekeyCount{AlreadyDone: 1}) {
			t.Fatalf("second run: %+v", res)
		}

		// The old KEK no longer starts the control plane.
		var out, errb bytes.Buffer
		code := cli.Main([]string{"serve", "--db", dsn, "--pki", filepath.Join(e.Dir, "pki"), "--kek-file", oldFile,
			"--api", "127.0.0.1:0", "--gateway", "127.0.0.1:0", "--metrics", "", "--plain-http"}, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "INVALID_CONFIG: the node CA key does not unseal with this key-encryption key") {
			t.Fatalf("serve with the old KEK: exit %d: %s", code, errb.String())
		}
		cfg := config.Default()
		cfg.PKI.Dir, cfg.PKI.KEKFile = filepath.Join(e.Dir, "pki"), oldFile
		cfg.API.Listen, cfg.Gateway.Listen, cfg.Metrics.Listen = "127.0.0.1:0", "127.0.0.1:0", ""
		if err := cli.Serve(ctx, cfg, e.Log, db, nil); errs.CodeOf(err) != errs.InvalidConfig || !errors.Is(err, pki.ErrSealBroken) {
			t.Fatalf("Serve with the old KEK: %v, want INVALID_CONFIG wrapping ErrSealBroken", err)
		}

		// The new KEK does: the secret is released, the worker key opens.
		e.CP = serveKeyed(t, e, db, newFile)
		e.Client = e.NewClient(t, e.AdminKey)
		if k, err := e.CP.Signer.CurrentKey(ctx); err != nil || k != workerKey {
			t.Fatalf("worker key after the rotation: %s %v, want %s re-sealed", k, err, workerKey)
		}
		n := e.OpenNode(t, e.Nodes[0].Dir, "")
		n.Start(t)
		n.WaitConnected(t)
		digestSecret(t, e, n.NodeID(), "secret://root/demo", value)
		n.Stop()
	})
}
