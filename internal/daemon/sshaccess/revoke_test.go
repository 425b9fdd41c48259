package sshaccess_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sshca"
	"github.com/bettercompute/bettercompute/internal/sshca/sshdtest"
)

// TestRevokeSerialsAheadOfState: a serial the revocation feed revokes
// ahead of the state of its generation is in the KRL at once, without
// changing the applied generation; an older state applied later keeps it,
// the state of its generation (which lists it) settles it, and a serial
// of a generation already applied changes nothing.
func TestRevokeSerialsAheadOfState(t *testing.T) {
	d := newDriver(t)
	ctx := context.Background()
	s, _ := sshdtest.NewKey(t)
	ca := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey())))
	apply := func(gen uint64, revoked ...uint64) {
		t.Helper()
		b, err := sshca.Access{Generation: gen, NodeID: "nnode1", CA: ca, Accounts: []string{"root"}, Revoked: revoked, IssuedAt: 1_800_000_000}.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Run(ctx, kinds.SSHAccess, b); err != nil {
			t.Fatal(err)
		}
	}
	want := func(serials ...uint64) {
		t.Helper()
		got, err := d.KRLSerials()
		if err != nil || !slices.Equal(got, serials) {
			t.Fatalf("KRL serials %v (%v), want %v", got, err, serials)
		}
	}
	apply(1, 9)
	if err := d.RevokeSerials(3, 77); err != nil {
		t.Fatal(err)
	}
	want(9, 77)
	if g, _ := d.Generation(); g != 1 {
		t.Fatalf("generation %d after a feed serial, want 1", g)
	}
	apply(2, 9)
	want(9, 77)
	apply(3, 9, 77)
	want(9, 77)
	apply(4, 9)
	want(9) // the state of generation 4 dropped 77 (expired): so does the node
	if err := d.RevokeSerials(4, 88); err != nil {
		t.Fatal(err)
	}
	want(9)
}
