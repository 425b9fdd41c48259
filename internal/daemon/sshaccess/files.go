package sshaccess

import (
	"context"
	"slices"

	"github.com/bettercompute/bettercompute/internal/sshca"
)

// File kinds and the fixed id of the root helper's sshd files (its
// hostops table): the CA and the KRL are one file each, a principals file
// is named by its account.
const (
	KindCA         = "ssh-ca"
	KindKRL        = "ssh-krl"
	KindPrincipals = "ssh-principals"
	FileDefault    = "default"
)

// FileWriter writes and removes sshd files named by kind and id.
type FileWriter interface {
	WriteFile(ctx context.Context, kind, id string, data []byte) error
	RemoveFile(ctx context.Context, kind, id string) error
}

// write writes f's sshd files: under Dir, or through Files (the root
// helper's own sshaccess driver writes by kind and id) in the order
// sshca.WriteSSHDFiles keeps (the KRL first, stale principals last). With
// Files, the principals to remove are the accounts of the state applied
// before that f no longer lists (the helper lists no directory).
func (d *Driver) write(ctx context.Context, f sshca.Files) error {
	if d.Files == nil {
		return sshca.WriteSSHDFiles(d.Dir, f)
	}
	r, err := sshca.RenderSSHDFiles(f)
	if err != nil {
		return err
	}
	var before []string
	if old, oldCA, ok, err := d.applied(); err == nil && ok {
		before = old.Files(oldCA).Accounts
	}
	if err := d.Files.WriteFile(ctx, KindKRL, FileDefault, r.KRL); err != nil {
		return err
	}
	if err := d.Files.WriteFile(ctx, KindCA, FileDefault, r.CA); err != nil {
		return err
	}
	for _, a := range f.Accounts {
		if err := d.Files.WriteFile(ctx, KindPrincipals, a, r.Principals[a]); err != nil {
			return err
		}
	}
	for _, a := range before {
		if !slices.Contains(f.Accounts, a) {
			if err := d.Files.RemoveFile(ctx, KindPrincipals, a); err != nil {
				return err
			}
		}
	}
	return nil
}
