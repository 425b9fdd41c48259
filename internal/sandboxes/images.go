package sandboxes

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// MaxChunk bounds one upload chunk (raw bytes), so a chunk fits the API's
// 64 KiB body as base64.
const MaxChunk = 40 << 10

// Image is a named, content-addressed image of a tenant.
type Image struct {
	ID        string    `json:"id"`
	TenantID  string    `json:"tenant_id"`
	Name      string    `json:"name"`
	Digest    string    `json:"digest"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedBy string    `json:"created_by"`
	CreatedAt time.Time `json:"created_at"`
}

func stagingKey(upload string, offset int64) string {
	return fmt.Sprintf("staging/%s/%016d", upload, offset)
}

// BeginUpload starts an image upload for tenant; chunks follow in order.
func (s *Service) BeginUpload(ctx context.Context, actor audit.Entry, tenant string) (string, error) {
	if s.images == nil {
		return "", errs.New(errs.InvalidConfig, "no image store is configured")
	}
	id := ids.New("upl")
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlBeginUpload, id, tenant, actor.Actor, now.UnixMilli()); err != nil {
			return fmt.Errorf("sandboxes: begin upload: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:images:create", "image-upload/"+id, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return "", err
	}
	return id, nil
}

// UploadTenantOf resolves an upload's tenant; NOT_FOUND when unknown.
func (s *Service) UploadTenantOf(ctx context.Context, id string) (string, error) {
	var t string
	err := s.db.QueryRowContext(ctx, sqlUploadTenant, id).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errs.New(errs.NotFound, "upload not found")
	}
	if err != nil {
		return "", fmt.Errorf("sandboxes: upload tenant: %w", err)
	}
	return t, nil
}

// PutChunk stores the chunk at offset of an upload; offsets must follow
// each other with no gap and no overlap. The upload's advance and its
// audit row are one transaction.
func (s *Service) PutChunk(ctx context.Context, actor audit.Entry, upload string, offset int64, data []byte) (int64, error) {
	if len(data) == 0 || len(data) > MaxChunk {
		return 0, errs.New(errs.InvalidInput, fmt.Sprintf("data: 1 to %d bytes", MaxChunk))
	}
	if offset+int64(len(data)) > spec.MaxImageBytes {
		return 0, errs.New(errs.PayloadTooLarge, "the image is larger than the limit")
	}
	u, err := scanUpload(s.db.QueryRowContext(ctx, sqlUploadOffset, upload))
	if err != nil {
		return 0, fmt.Errorf("sandboxes: read upload: %w", err)
	}
	if u.done || offset != u.next {
		return 0, errs.New(errs.Conflict, fmt.Sprintf("offset: the upload expects %d", u.next))
	}
	if err := s.images.WriteAll(ctx, stagingKey(upload, offset), data, nil); err != nil {
		return 0, fmt.Errorf("sandboxes: stage chunk: %w", err)
	}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlAdvanceUpload, offset+int64(len(data)), upload, offset)
		if err != nil {
			return fmt.Errorf("sandboxes: advance upload: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.Conflict, "offset: another chunk won")
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:images:create", "image-upload/"+upload, "allowed"
		actor.Details = map[string]any{"offset": offset, "bytes": len(data)}
		return audit.Record(ctx, tx, s.clk.Now(), actor)
	})
	if err != nil {
		return 0, err
	}
	return offset + int64(len(data)), nil
}

// CommitImage assembles an upload, checks it hashes to digest, stores it
// under the digest and names it in the tenant.
func (s *Service) CommitImage(ctx context.Context, actor audit.Entry, tenant, upload, name, digest string) (Image, error) {
	if !validName(name) {
		return Image{}, errs.New(errs.InvalidInput, "name: 1 to 63 of a-z 0-9 . _ -")
	}
	if !spec.ValidDigest(digest) {
		return Image{}, errs.New(errs.InvalidInput, "digest: sha256:<64 lowercase hex>")
	}
	u, err := scanUpload(s.db.QueryRowContext(ctx, sqlUploadOffset, upload))
	if err != nil {
		return Image{}, fmt.Errorf("sandboxes: read upload: %w", err)
	}
	next := u.next
	if u.done || next == 0 {
		return Image{}, errs.New(errs.InvalidState, "the upload is empty or already imported")
	}
	key := spec.ImageKey(digest)
	tmp := "staging/" + upload + "/assembled"
	w, err := s.images.NewWriter(ctx, tmp, nil)
	if err != nil {
		return Image{}, fmt.Errorf("sandboxes: assemble: %w", err)
	}
	h := sha256.New()
	for off := int64(0); off < next; {
		b, err := s.images.ReadAll(ctx, stagingKey(upload, off))
		if err != nil {
			w.Close()
			return Image{}, fmt.Errorf("sandboxes: read chunk: %w", err)
		}
		if _, err := io.MultiWriter(w, h).Write(b); err != nil {
			w.Close()
			return Image{}, fmt.Errorf("sandboxes: assemble: %w", err)
		}
		off += int64(len(b))
	}
	if err := w.Close(); err != nil {
		return Image{}, fmt.Errorf("sandboxes: assemble: %w", err)
	}
	if "sha256:"+hex.EncodeToString(h.Sum(nil)) != digest {
		_ = s.images.Delete(ctx, tmp)
		return Image{}, errs.New(errs.InvalidInput, "digest: the uploaded bytes hash to another digest")
	}
	if err := s.images.Copy(ctx, key, tmp, nil); err != nil {
		return Image{}, fmt.Errorf("sandboxes: store image: %w", err)
	}
	for off := int64(0); off < next; off += MaxChunk {
		_ = s.images.Delete(ctx, stagingKey(upload, off))
	}
	_ = s.images.Delete(ctx, tmp)
	now := s.clk.Now()
	img := Image{ID: ids.New("img"), TenantID: tenant, Name: name, Digest: digest, SizeBytes: next, CreatedBy: actor.Actor, CreatedAt: now.UTC()}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, sqlFinishUpload, now.UnixMilli(), upload); err != nil {
			return fmt.Errorf("sandboxes: finish upload: %w", err)
		}
		if _, err := tx.ExecContext(ctx, sqlDeleteImageAt, tenant, name); err != nil {
			return fmt.Errorf("sandboxes: replace image name: %w", err)
		}
		if _, err := tx.ExecContext(ctx, sqlInsertImage, imageArgs(img)...); err != nil {
			return fmt.Errorf("sandboxes: insert image: %w", err)
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:images:create", "image/"+img.ID, "allowed"
		actor.Details = map[string]any{"name": name, "digest": digest, "size_bytes": next}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Image{}, err
	}
	return img, nil
}

// ListImages returns the images of the scope's tenant by name (images
// are listed per tenant: the root tenant's scope lists its own).
func (s *Service) ListImages(ctx context.Context, scope iam.Scope) ([]Image, error) {
	rows, err := s.db.QueryContext(ctx, sqlListImages, scope.Tenant)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: list images: %w", err)
	}
	defer rows.Close()
	out := []Image{}
	for rows.Next() {
		i, err := scanImage(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, i)
	}
	return out, rows.Err()
}

// ImportBytes stores tarball as image name of tenant in one call (dev and
// tests; the API goes through uploads).
func (s *Service) ImportBytes(ctx context.Context, actor audit.Entry, tenant, name string, tarball []byte) (Image, error) {
	up, err := s.BeginUpload(ctx, actor, tenant)
	if err != nil {
		return Image{}, err
	}
	for off := 0; off < len(tarball); off += MaxChunk {
		if _, err := s.PutChunk(ctx, actor, up, int64(off), tarball[off:min(off+MaxChunk, len(tarball))]); err != nil {
			return Image{}, err
		}
	}
	sum := sha256.Sum256(tarball)
	return s.CommitImage(ctx, actor, tenant, up, name, "sha256:"+hex.EncodeToString(sum[:]))
}
