package signing_test

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/signing"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestTimeStatements checks what the workers give the gateway to relay:
// a statement of the signer's clock, signed by the current worker key
// under the command-signing root with the time context (not the command
// one), stored as the latest only when it is newer than the stored one.
func TestTimeStatements(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		t0 := time.Now()
		clk := clock.NewFake(t0)
		kek, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := pki.Init(filepath.Join(t.TempDir(), "pki"), "time.bc.local", kek, clock.NewFake(t0.Add(-48*time.Hour)))
		if err != nil {
			t.Fatal(err)
		}
		rk, err := b.CommandRootKey(kek)
		if err != nil {
			t.Fatal(err)
		}
		s := signing.New(signing.Deps{DB: db, Commands: commands.NewStore(db), Clock: clk, KEK: kek, Root: b.CommandRoot, RootKey: rk,
			TrustDomain: b.TrustDomain, Bus: bus.New(), Batches: noBatches{}, Log: slog.New(slog.DiscardHandler)})
		if st, err := signing.LatestTimeStatement(ctx, db); err != nil || st != nil {
			t.Fatalf("latest before any: %v %v, want none", st, err)
		}
		// stated returns the stored statement's time after checking its
		// signature and chain.
		stated := func() int64 {
			t.Helper()
			st, err := signing.LatestTimeStatement(ctx, db)
			if err != nil || st == nil {
				t.Fatalf("latest: %v %v", st, err)
			}
			var body nodev1.TimeStatement
			if err := proto.Unmarshal(st.Body, &body); err != nil || body.TrustDomain != b.TrustDomain || body.Nonce == "" {
				t.Fatalf("statement body %v (%v)", &body, err)
			}
			pub, err := pki.VerifyWorkerChain(st.SignerCertDer, []*x509.Certificate{b.CommandRoot}, b.TrustDomain, time.UnixMilli(body.ServerTimeMs))
			if err != nil {
				t.Fatalf("signer: %v", err)
			}
			if !ed25519.Verify(pub, append([]byte(wire.TimeSigContext), st.Body...), st.Signature) {
				t.Fatal("statement signature does not verify under the time context")
			}
			if ed25519.Verify(pub, append([]byte(wire.CommandSigContext), st.Body...), st.Signature) {
				t.Fatal("statement signature verifies as a command")
			}
			return body.ServerTimeMs
		}
		if _, err := s.SignTime(ctx); err != nil {
			t.Fatal(err)
		}
		if got := stated(); got != t0.UnixMilli() {
			t.Fatalf("stated %d, want %d", got, t0.UnixMilli())
		}
		// A worker whose clock is behind does not replace a newer one.
		clk.Set(t0.Add(-time.Minute))
		if _, err := s.SignTime(ctx); err != nil {
			t.Fatal(err)
		}
		if got := stated(); got != t0.UnixMilli() {
			t.Fatalf("stated %d after an older statement, want %d", got, t0.UnixMilli())
		}
		clk.Set(t0.Add(signing.TimeStatementEvery))
		if _, err := s.SignTime(ctx); err != nil {
			t.Fatal(err)
		}
		if got, want := stated(), t0.Add(signing.TimeStatementEvery).UnixMilli(); got != want {
			t.Fatalf("stated %d, want the newer %d", got, want)
		}
	})
}

// noBatches approves no batch.
type noBatches struct{}

func (noBatches) Approved(context.Context, string) (bool, error) { return false, nil }
