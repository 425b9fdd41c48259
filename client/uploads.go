package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// UploadState is how many bytes the server holds of an upload.
type UploadState = apitypes.UploadState

// MaxUploadResumes bounds how many times Upload continues an upload after
// a cut connection or a refusal it can wait out, in a row.
const MaxUploadResumes = 10

// ImportImageFrom uploads the size bytes of src as image name in tenant
// ("" = the caller's own): it begins an upload, streams them (Upload:
// resumed after a cut, progress told the bytes sent) while it hashes
// them, and imports the upload under the digest.
func (c *Client) ImportImageFrom(ctx context.Context, tenant, name string, src io.ReaderAt, size int64, progress func(done int64)) (Image, error) {
	// The digest is computed while the bytes stream (src is read twice).
	h := sha256.New()
	hashed := make(chan error, 1)
	go func() {
		_, err := io.Copy(h, io.NewSectionReader(src, 0, size))
		hashed <- err
	}()
	var begin apitypes.UploadBeginOut
	err := c.Call(ctx, "images.beginUpload", tenantIn(tenant), &begin)
	if err == nil {
		err = c.Upload(ctx, begin.UploadID, src, size, progress)
	}
	if herr := <-hashed; err == nil && herr != nil {
		err = fmt.Errorf("client: hash the image: %w", herr)
	}
	if err != nil {
		return Image{}, err
	}
	var img Image
	err = c.Call(ctx, "images.import", apitypes.ImageImportIn{UploadID: begin.UploadID, Name: name, Digest: "sha256:" + hex.EncodeToString(h.Sum(nil))}, &img)
	return img, err
}

// Upload streams the size bytes of src into an upload, one PUT from where
// the server stands; after a cut connection, a RATE_LIMITED answer (after
// its Retry-After) or a CONFLICT on the offset it asks the server how
// much it holds and continues from there, at most MaxUploadResumes times
// in a row. progress, when set, is told how many bytes are sent.
func (c *Client) Upload(ctx context.Context, id string, src io.ReaderAt, size int64, progress func(done int64)) error {
	var off int64
	for tries := 0; off < size; {
		next, err := c.putUpload(ctx, id, off, io.NewSectionReader(src, off, size-off), size-off, progress)
		if err == nil {
			if next <= off {
				tries++
			} else {
				tries = 0
			}
			off = next
			if tries <= MaxUploadResumes {
				continue
			}
			return fmt.Errorf("client: upload %s: the server keeps no bytes", id)
		}
		if tries++; tries > MaxUploadResumes || !resumable(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-time.After(backoff(err, tries)):
		case <-ctx.Done():
			return ctx.Err()
		}
		st, serr := c.UploadState(ctx, id)
		if serr != nil {
			return errors.Join(err, serr)
		}
		off = st.Offset
	}
	if progress != nil {
		progress(size)
	}
	return nil
}

// resumable reports the errors after which an upload continues: a
// transport error (no answer: the connection was cut), RATE_LIMITED, and
// CONFLICT (the server holds another offset, or another write runs).
func resumable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return true
	}
	return e.Code == ErrRateLimited.Code || e.Code == ErrConflict.Code
}

// backoff is how long Upload waits before its tries-th resume: a
// RATE_LIMITED answer's Retry-After, else a doubling wait from 50 ms (the
// server may still be recording the write that was cut) up to 2 s.
func backoff(err error, tries int) time.Duration {
	var e *Error
	if errors.As(err, &e) && e.Code == ErrRateLimited.Code {
		return max(e.RetryAfter, 100*time.Millisecond)
	}
	return min(50*time.Millisecond<<min(tries, 6), 2*time.Second)
}

// UploadState asks the server how many bytes it holds of an upload.
func (c *Client) UploadState(ctx context.Context, id string) (UploadState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+"/api/v1/uploads/"+id, nil)
	if err != nil {
		return UploadState{}, fmt.Errorf("client: request: %w", err)
	}
	var st UploadState
	err = c.doUpload(req, &st)
	return st, err
}

// putUpload sends one PUT of n bytes of body at offset and returns the
// offset the server answers.
func (c *Client) putUpload(ctx context.Context, id string, offset int64, body io.Reader, n int64, progress func(int64)) (int64, error) {
	if progress != nil {
		body = &progressReader{r: body, done: offset, tell: progress}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.BaseURL+"/api/v1/uploads/"+id, body)
	if err != nil {
		return 0, fmt.Errorf("client: request: %w", err)
	}
	req.ContentLength = n
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Upload-Offset", strconv.FormatInt(offset, 10))
	var st UploadState
	if err := c.doUpload(req, &st); err != nil {
		return 0, err
	}
	return st.Offset, nil
}

// doUpload sends an upload request, with no whole-request timeout (an
// upload takes as long as its size needs), and decodes the answer.
func (c *Client) doUpload(req *http.Request, out *UploadState) error {
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+c.key)
	hc := http.Client{Transport: c.HTTP.Transport, CheckRedirect: c.HTTP.CheckRedirect, Jar: c.HTTP.Jar}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("client: upload: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("client: read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return answerError(resp, raw)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("client: decode answer: %w", err)
	}
	return nil
}

// answerError is the *Error of a non-200 answer.
func answerError(resp *http.Response, raw []byte) error {
	var eb apitypes.ErrorBody
	if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
		return &Error{Status: resp.StatusCode, Code: "INTERNAL_ERROR", Message: "unexpected answer " + resp.Status}
	}
	e := &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, RequestID: eb.Error.RequestID}
	if ra, err := time.ParseDuration(resp.Header.Get("Retry-After") + "s"); err == nil {
		e.RetryAfter = ra
	}
	return e
}

// progressReader tells how many bytes of an upload have been read.
type progressReader struct {
	r    io.Reader
	done int64
	tell func(int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	p.tell(p.done)
	return n, err
}
