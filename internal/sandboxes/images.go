package sandboxes

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

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

// CommitImage assembles an upload, checks it hashes to digest, stores it
// under the digest and names it in the tenant.
func (s *Service) CommitImage(ctx context.Context, actor audit.Entry, tenant, upload, name, digest string) (Image, error) {
	if !validName(name) {
		return Image{}, errs.New(errs.InvalidInput, "name: 1 to 63 of a-z 0-9 . _ -")
	}
	if !spec.ValidDigest(digest) {
		return Image{}, errs.New(errs.InvalidInput, "digest: sha256:<64 lowercase hex>")
	}
	if _, busy := s.writing.LoadOrStore(upload, struct{}{}); busy {
		return Image{}, errs.New(errs.Conflict, "a write to this upload is in progress")
	}
	defer s.writing.Delete(upload)
	u, err := s.readUpload(ctx, upload)
	if err != nil {
		return Image{}, err
	}
	next := u.next
	if u.done || next == 0 {
		return Image{}, errs.New(errs.InvalidState, "the upload is empty or already imported")
	}
	if err := s.assemble(ctx, upload, next, digest); err != nil {
		return Image{}, err
	}
	now := s.clk.Now()
	img := Image{ID: ids.New("img"), TenantID: tenant, Name: name, Digest: digest, SizeBytes: next, CreatedBy: actor.Actor, CreatedAt: now.UTC()}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlFinishUpload, now.UnixMilli(), upload)
		if err != nil {
			return fmt.Errorf("sandboxes: finish upload: %w", err)
		}
		// Another process imported it meanwhile: one upload, one image.
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return errs.New(errs.Conflict, "the upload was imported by another request")
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
	if _, err := s.WriteUpload(ctx, actor, up, 0, bytes.NewReader(tarball)); err != nil {
		return Image{}, err
	}
	return s.CommitImage(ctx, actor, tenant, up, name, imagetar.Digest(tarball))
}
