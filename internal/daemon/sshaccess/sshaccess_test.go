package sshaccess_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sshaccess"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sshca"
	"github.com/bettercompute/bettercompute/internal/sshca/sshdtest"
)

func newDriver(t *testing.T) *sshaccess.Driver {
	t.Helper()
	dir := t.TempDir()
	d := &sshaccess.Driver{Driver: driver.NewSim("n"), Dir: filepath.Join(dir, "sshd"), StateDir: dir}
	d.SetNodeID("nnode1")
	return d
}

func state(t *testing.T, gen uint64, node string, accounts ...string) []byte {
	t.Helper()
	s, _ := sshdtest.NewKey(t)
	b, err := sshca.Access{Generation: gen, NodeID: node, CA: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))),
		Accounts: accounts, Revoked: []uint64{9}, IssuedAt: 1_800_000_000}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStaleGenerationRefused: ssh.access writes the sshd files of a newer
// or equal generation, and refuses an older one by its reason, leaving
// the files of the newer one; a state for another node, or before the
// node id is known, is refused too.
func TestStaleGenerationRefused(t *testing.T) {
	d := newDriver(t)
	ctx := context.Background()
	if _, err := d.Run(ctx, kinds.SSHAccess, state(t, 2, "nnode1", "alice")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.Dir, sshca.PrincipalsDir, "alice")); err != nil {
		t.Fatal(err)
	}
	_, err := d.Run(ctx, kinds.SSHAccess, state(t, 1, "nnode1", "bob"))
	if err == nil || err.Error() != "ssh-access-stale-generation: generation 1 is older than the applied 2" {
		t.Fatalf("stale: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.Dir, sshca.PrincipalsDir, "bob")); !os.IsNotExist(err) {
		t.Fatalf("a stale state wrote its principals: %v", err)
	}
	if g, err := d.Generation(); err != nil || g != 2 {
		t.Fatalf("generation %d %v", g, err)
	}
	if _, err := d.Run(ctx, kinds.SSHAccess, state(t, 2, "nnode1", "alice")); err != nil {
		t.Fatalf("the same generation again: %v", err)
	}
	if _, err := d.Run(ctx, kinds.SSHAccess, state(t, 3, "nother", "alice")); err == nil || err.Error() != "ssh-access-other-node: the state is for another node" {
		t.Fatalf("other node: %v", err)
	}
	fresh := &sshaccess.Driver{Driver: driver.NewSim("n"), Dir: filepath.Join(t.TempDir(), "sshd"), StateDir: t.TempDir()}
	if _, err := fresh.Run(ctx, kinds.SSHAccess, state(t, 1, "nnode1")); err == nil || err.Error() != "ssh-access-other-node: the state is for another node" {
		t.Fatalf("no node id yet: %v", err)
	}
}

// TestDecodeStrict: unknown fields, trailing data, generation 0, serial
// 0, bad accounts and a CA that is not a key are refused as malformed and
// write nothing.
func TestDecodeStrict(t *testing.T) {
	d := newDriver(t)
	good := string(state(t, 1, "nnode1", "alice"))
	for name, p := range map[string]string{
		"unknown field": strings.Replace(good, `{"generation"`, `{"extra":1,"generation"`, 1),
		"trailing":      good + "{}",
		"generation 0":  strings.Replace(good, `"generation":1`, `"generation":0`, 1),
		"serial 0":      strings.Replace(good, `"revoked":[9]`, `"revoked":[0]`, 1),
		"bad account":   strings.Replace(good, `"alice"`, `"-oProxyCommand"`, 1),
		"dup account":   strings.Replace(good, `["alice"]`, `["alice","alice"]`, 1),
		"ca not a key":  strings.Replace(good, `"ca":"ssh-ed25519`, `"ca":"ssh-junk`, 1),
		"not json":      "nope",
	} {
		_, err := d.Run(context.Background(), kinds.SSHAccess, []byte(p))
		if err == nil || !strings.HasPrefix(err.Error(), sshca.ReasonAccessMalformed+": ") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := os.Stat(d.Dir); !os.IsNotExist(err) {
		t.Fatalf("a refused state wrote files: %v", err)
	}
}
