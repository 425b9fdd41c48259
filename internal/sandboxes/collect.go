package sandboxes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"gocloud.dev/blob"

	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Collection bounds: an unfinished upload is dropped UploadTTL after it
// began; an image object nothing names is removed once it is older than
// ObjectGrace (an import writes its object before the row that names it,
// and a rewrite of the same digest refreshes the object's time, so the
// grace covers that gap).
const (
	UploadTTL   = 24 * time.Hour
	ObjectGrace = time.Hour
)

// The collector's SQL: uploads past their time, and every digest an image
// object must be kept for.
const (
	sqlStaleUploads  = `SELECT id FROM sandbox_uploads WHERE done_at IS NULL AND created_at < $1 ORDER BY id`
	sqlDeleteUpload  = `DELETE FROM sandbox_uploads WHERE id = $1 AND done_at IS NULL`
	sqlUnknownImages = `SELECT COUNT(*) FROM sandboxes WHERE image_digest = '' AND state IN ($1, $2, $3, $4)`
	sqlImagesInUse   = `SELECT digest FROM sandbox_images
	UNION SELECT image_digest FROM sandbox_templates
	UNION SELECT image_digest FROM sandboxes WHERE state IN ($1, $2, $3, $4)
	UNION SELECT image_digest FROM sandbox_checkpoints WHERE purged_at IS NULL`
)

// Collected counts what CollectObjects removed.
type Collected struct {
	Uploads int `json:"uploads"`
	Images  int `json:"images"`
}

// CollectObjects removes what nothing references from the object store:
// unfinished uploads older than UploadTTL (their staged parts and row),
// and image objects older than ObjectGrace that no image name, template,
// live sandbox or kept checkpoint names. When a live sandbox started
// before its image was recorded (schema version 39), no image is removed:
// what it runs is unknown, and the collector fails closed.
func (s *Service) CollectObjects(ctx context.Context) (Collected, error) {
	var c Collected
	if s.images == nil {
		return c, nil
	}
	now := s.clk.Now()
	n, err := s.collectUploads(ctx, now)
	c.Uploads = n
	if err != nil {
		return c, err
	}
	c.Images, err = s.collectImages(ctx, now)
	return c, err
}

// collectUploads drops the unfinished uploads that began before now -
// UploadTTL: parts first, then the row (a part left by a failure is
// found again by the next run only while the row exists).
func (s *Service) collectUploads(ctx context.Context, now time.Time) (int, error) {
	ids, err := s.column(ctx, sqlStaleUploads, now.Add(-UploadTTL).UnixMilli())
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		if _, busy := s.writing.LoadOrStore(id, struct{}{}); busy {
			continue
		}
		err := s.deletePrefix(ctx, "staging/"+id+"/")
		if err == nil {
			_, err = s.db.ExecContext(ctx, sqlDeleteUpload, id)
		}
		s.writing.Delete(id)
		if err != nil {
			return n, fmt.Errorf("sandboxes: collect upload: %w", err)
		}
		n++
	}
	return n, nil
}

// collectImages removes image objects older than ObjectGrace that nothing
// names.
func (s *Service) collectImages(ctx context.Context, now time.Time) (int, error) {
	live := []any{StateStarting, StateWarm, StateClaiming, StateRunning}
	var unknown int
	if err := s.db.QueryRowContext(ctx, sqlUnknownImages, live...).Scan(&unknown); err != nil {
		return 0, fmt.Errorf("sandboxes: collect images: %w", err)
	}
	if unknown > 0 {
		return 0, nil
	}
	used, err := s.column(ctx, sqlImagesInUse, live...)
	if err != nil {
		return 0, err
	}
	keep := map[string]bool{}
	for _, d := range used {
		keep[spec.ImageKey(d)] = true
	}
	n := 0
	it := s.images.List(&blob.ListOptions{Prefix: "images/sha256/"})
	for {
		o, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("sandboxes: list images: %w", err)
		}
		if o.IsDir || keep[o.Key] || !o.ModTime.Before(now.Add(-ObjectGrace)) || !strings.HasSuffix(o.Key, ".tar") {
			continue
		}
		if err := s.images.Delete(ctx, o.Key); err != nil {
			return n, fmt.Errorf("sandboxes: delete image object: %w", err)
		}
		s.log.Info("image object collected", "key", o.Key)
		n++
	}
}

// deletePrefix deletes every object under prefix.
func (s *Service) deletePrefix(ctx context.Context, prefix string) error {
	it := s.images.List(&blob.ListOptions{Prefix: prefix})
	for {
		o, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if o.IsDir {
			continue
		}
		if err := s.images.Delete(ctx, o.Key); err != nil {
			return err
		}
	}
}

// column runs query and returns its one string column.
func (s *Service) column(ctx context.Context, query string, args ...any) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: query: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("sandboxes: scan: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
