package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
)

// Materialize restores the checkpoint read from r into dir, which must
// exist and be empty (else ReasonNotEmpty, and dir is left as it was).
//
// It first spools r, at most lim.MaxArchiveBytes of it, to an unlinked
// temporary file in lim.SpoolDir (default os.TempDir) while hashing it,
// and refuses ReasonDigestMismatch unless the bytes hash to wantDigest;
// nothing is written into dir before that check passes. Only then does it
// decompress (zstd, window at most 8 MiB, output capped) and extract
// through an os.Root on dir, refusing unsafe entries by reason (see the
// package doc and the Reason constants).
//
// On any failure after the digest check (a refusal, a cancelled ctx, an
// I/O error) Materialize empties dir again before returning, so dir holds
// either the whole checkpoint or nothing. If emptying itself fails, the
// returned error joins the cause with "could not empty", and the caller
// must discard dir.
func Materialize(ctx context.Context, r io.Reader, wantDigest, dir string, lim Limits) error {
	if _, err := digestHex(wantDigest); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("checkpoint: open target: %w", err)
	}
	defer root.Close()
	if err := requireEmpty(root); err != nil {
		return err
	}
	spool, err := spoolVerified(ctx, r, wantDigest, lim)
	if err != nil {
		return err
	}
	defer spool.Close()
	if _, err := extract(ctx, spool, root, lim); err != nil {
		if cerr := emptyRoot(root); cerr != nil {
			return errors.Join(err, fmt.Errorf("checkpoint: could not empty %s after the failure: %w", dir, cerr))
		}
		return err
	}
	return nil
}

// requireEmpty refuses ReasonNotEmpty unless root has no entries.
func requireEmpty(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return fmt.Errorf("checkpoint: open target: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(1)
	if err != nil && err != io.EOF {
		return fmt.Errorf("checkpoint: read target: %w", err)
	}
	if len(names) > 0 {
		return refuse(ReasonNotEmpty, "target holds %q", names[0])
	}
	return nil
}

// emptyRoot removes everything in root, leaving root itself.
func emptyRoot(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, root.RemoveAll(n))
	}
	return errors.Join(errs...)
}

// spoolVerified copies r, bounded by lim.MaxArchiveBytes, into an unlinked
// temporary file while hashing it, and returns the file rewound, or a
// ReasonTooLarge or ReasonDigestMismatch refusal.
func spoolVerified(ctx context.Context, r io.Reader, want string, lim Limits) (*os.File, error) {
	f, err := os.CreateTemp(lim.SpoolDir, "checkpoint-spool-*")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: spool: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("checkpoint: spool: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, r}, lim.MaxArchiveBytes+1))
	if err == nil && n > lim.MaxArchiveBytes {
		err = refuse(ReasonTooLarge, "archive is over %d bytes", lim.MaxArchiveBytes)
	}
	if err == nil {
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != want {
			err = refuse(ReasonDigestMismatch, "want %s, the bytes hash to %s", want, got)
		}
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		if ReasonOf(err) == "" {
			err = fmt.Errorf("checkpoint: spool: %w", err)
		}
		return nil, err
	}
	return f, nil
}

// ctxReader fails reads once ctx is done, so a slow or endless source
// stops with the caller's deadline.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
