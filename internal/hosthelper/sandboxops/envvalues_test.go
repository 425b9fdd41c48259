package sandboxops

import (
	"context"
	"testing"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// TestWithEnvValuesKeysOnly: the helper's host gets from what the node
// sent only sandbox env keys (a made-up key opens no signed sealed value);
// a secret reference's value the node sends is never answered, and
// nothing at all is a context with no fetcher (no broker path).
func TestWithEnvValuesKeysOnly(t *testing.T) {
	key := spec.EnvKeyRef("tabc", "sbxaaaaaaaaaaaaaaaa")
	ctx := withEnvValues(context.Background(), map[string][]byte{key: []byte("k"), "secret://tabc/db": []byte("v")})
	fetch := driver.SecretsFrom(ctx)
	if b, err := fetch(ctx, key); err != nil || string(b) != "k" {
		t.Fatalf("the env key: %q %v", b, err)
	}
	if _, err := fetch(ctx, "secret://tabc/db"); err == nil {
		t.Fatal("a secret's value the node sent is answered")
	}
	if _, err := fetch(ctx, spec.EnvKeyRef("tabc", "sbxbbbbbbbbbbbbbbbb")); err == nil {
		t.Fatal("a key not sent is answered")
	}
	if driver.SecretsFrom(withEnvValues(context.Background(), nil)) != nil {
		t.Fatal("a fetcher with nothing sent")
	}
}
