package sandboxes

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// MaxImageBytes returns the configured bound of an image's tar (an
// upload's whole size): spec.MaxImageBytes unless SetMaxImageBytes set a
// smaller one.
func (s *Service) MaxImageBytes() int64 {
	if n := s.maxImage.Load(); n > 0 {
		return n
	}
	return spec.MaxImageBytes
}

// SetMaxImageBytes bounds an image's tar to n bytes; n <= 0 or above
// spec.MaxImageBytes (what a node accepts) means spec.MaxImageBytes.
func (s *Service) SetMaxImageBytes(n int64) {
	if n <= 0 || n > spec.MaxImageBytes {
		n = spec.MaxImageBytes
	}
	s.maxImage.Store(n)
}

// UploadOffset returns how many bytes the server holds of an upload: a
// write continues there. NOT_FOUND when it does not exist; INVALID_STATE
// once imported.
func (s *Service) UploadOffset(ctx context.Context, upload string) (int64, error) {
	u, err := s.readUpload(ctx, upload)
	if err != nil {
		return 0, err
	}
	if u.done {
		return 0, errs.New(errs.InvalidState, "the upload is already imported")
	}
	return u.next, nil
}

func (s *Service) readUpload(ctx context.Context, upload string) (uploadRow, error) {
	u, err := scanUpload(s.db.QueryRowContext(ctx, sqlUploadOffset, upload))
	if errors.Is(err, sql.ErrNoRows) {
		return uploadRow{}, errs.New(errs.NotFound, "upload not found")
	}
	if err != nil {
		return uploadRow{}, fmt.Errorf("sandboxes: read upload: %w", err)
	}
	return u, nil
}

// WriteUpload streams r into an upload at offset, which must be exactly
// what the server holds (UploadOffset; else CONFLICT). The whole upload
// is bounded by MaxImageBytes (PAYLOAD_TOO_LARGE, and nothing of this
// write is kept). When r fails part-way (the connection was cut), the
// bytes that came are kept and counted, so a retry continues after them;
// the read error is returned with the new offset. One write per upload
// runs at once in a process (CONFLICT for a second); the upload's
// advance and its audit row are one transaction.
func (s *Service) WriteUpload(ctx context.Context, actor audit.Entry, upload string, offset int64, r io.Reader) (int64, error) {
	if s.images == nil {
		return 0, errs.New(errs.InvalidConfig, "no image store is configured")
	}
	if _, busy := s.writing.LoadOrStore(upload, struct{}{}); busy {
		return 0, errs.New(errs.Conflict, "another write to this upload is in progress")
	}
	defer s.writing.Delete(upload)
	u, err := s.readUpload(ctx, upload)
	if err != nil {
		return 0, err
	}
	if u.done {
		return 0, errs.New(errs.InvalidState, "the upload is already imported")
	}
	if offset != u.next {
		return 0, errs.New(errs.Conflict, fmt.Sprintf("offset: the upload holds %d bytes", u.next))
	}
	n, readErr, err := s.stage(ctx, stagingKey(upload, offset), r, s.MaxImageBytes()-offset)
	if err != nil {
		return offset, err
	}
	if readErr != nil {
		readErr = errs.Wrap(errs.InvalidInput, fmt.Sprintf("the body ended early: the upload holds %d bytes, continue there", offset+n), readErr)
	}
	if n == 0 {
		return offset, readErr
	}
	// What came is recorded even when the caller is gone (a cut).
	ctx = context.WithoutCancel(ctx)
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlAdvanceUpload, offset+n, upload, offset)
		if err != nil {
			return fmt.Errorf("sandboxes: advance upload: %w", err)
		}
		if k, _ := res.RowsAffected(); k != 1 {
			return errs.New(errs.Conflict, "offset: another write won")
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:images:create", "image-upload/"+upload, "allowed"
		actor.Details = map[string]any{"offset": offset, "bytes": n, "cut": readErr != nil}
		return audit.Record(ctx, tx, s.clk.Now(), actor)
	})
	if err != nil {
		return offset, err
	}
	return offset + n, readErr
}

// errReader records the error of the reader it wraps, so a copy tells a
// failing source (a cut connection) from a failing store.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// stage copies at most room bytes of r to the staging object key. It
// returns how many were kept, the source's error (the bytes before it
// are kept), and a store error or PAYLOAD_TOO_LARGE (nothing is kept).
// The store writes under a context the caller's cancellation does not
// reach: a cut request keeps what it sent.
func (s *Service) stage(ctx context.Context, key string, r io.Reader, room int64) (int64, error, error) {
	wctx, abort := context.WithCancel(context.WithoutCancel(ctx))
	defer abort()
	w, err := s.images.NewWriter(wctx, key, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("sandboxes: stage: %w", err)
	}
	src := &errReader{r: io.LimitReader(r, max(room, 0)+1)}
	n, err := io.CopyBuffer(w, src, make([]byte, 1<<20))
	switch {
	case n > room:
		abort()
		_ = w.Close()
		return 0, nil, errs.New(errs.PayloadTooLarge, fmt.Sprintf("the image is larger than the limit of %d bytes", s.MaxImageBytes()))
	case err != nil && src.err == nil:
		abort()
		_ = w.Close()
		return 0, nil, fmt.Errorf("sandboxes: stage: %w", err)
	case n == 0:
		abort()
		_ = w.Close()
		return 0, src.err, nil
	}
	if err := w.Close(); err != nil {
		return 0, nil, fmt.Errorf("sandboxes: stage: %w", err)
	}
	return n, src.err, nil
}

// assemble joins an upload's staged parts (next bytes) into the image
// stored under digest, which they must hash to (INVALID_INPUT when not),
// and removes the parts. The parts stream once, through the hash, into
// the image's own key; a writer is committed only when closed
// uncancelled, so bytes that hash otherwise never replace what is
// stored there.
func (s *Service) assemble(ctx context.Context, upload string, next int64, digest string) error {
	key := spec.ImageKey(digest)
	wctx, abort := context.WithCancel(ctx)
	defer abort()
	w, err := s.images.NewWriter(wctx, key, nil)
	if err != nil {
		return fmt.Errorf("sandboxes: assemble: %w", err)
	}
	h := sha256.New()
	parts, err := s.copyParts(ctx, io.MultiWriter(w, h), upload, next)
	if err == nil && "sha256:"+hex.EncodeToString(h.Sum(nil)) != digest {
		err = errs.New(errs.InvalidInput, "digest: the uploaded bytes hash to another digest")
	}
	if err != nil {
		abort()
		_ = w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("sandboxes: store image: %w", err)
	}
	for _, k := range parts {
		_ = s.images.Delete(ctx, k)
	}
	return nil
}

// copyParts copies an upload's staged parts, in order, to w and returns
// their keys.
func (s *Service) copyParts(ctx context.Context, w io.Writer, upload string, next int64) ([]string, error) {
	var parts []string
	buf := make([]byte, 1<<20)
	for off := int64(0); off < next; {
		key := stagingKey(upload, off)
		r, err := s.images.NewReader(ctx, key, nil)
		if err != nil {
			return nil, fmt.Errorf("sandboxes: read part: %w", err)
		}
		n, err := io.CopyBuffer(w, r, buf)
		_ = r.Close()
		if err == nil && n == 0 {
			err = errors.New("an empty part")
		}
		if err != nil {
			return nil, fmt.Errorf("sandboxes: assemble: %w", err)
		}
		parts = append(parts, key)
		off += n
	}
	return parts, nil
}
