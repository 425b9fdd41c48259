package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// UploadPath is the upload endpoint: GET /api/v1/uploads/{id} answers how
// many bytes the server holds of an upload (apitypes.UploadState); PUT
// with an Upload-Offset header equal to that streams the body after them.
// An upload begins and is imported through the JSON methods
// (images.beginUpload, images.import).
const UploadPath = "/api/v1/uploads/"

// UploadWriteAction is the action both verbs of the upload endpoint are
// decided on, on the upload ("image-upload/<id>") in its tenant: the one
// images.beginUpload and images.import are decided on.
const UploadWriteAction = "compute:images:create"

// uploadIdle is how long an upload's body may send nothing before the
// connection is cut (the server's whole-request read timeout does not
// apply to an upload; a cut upload resumes where it stopped).
const uploadIdle = 30 * time.Second

// Uploads is what the upload endpoint needs of the module that owns
// uploads (the sandbox module).
type Uploads interface {
	// MaxImageBytes bounds an upload's whole size.
	MaxImageBytes() int64
	// UploadOffset returns how many bytes the server holds of an upload.
	UploadOffset(ctx context.Context, id string) (int64, error)
	// WriteUpload streams r into the upload at offset and returns the
	// new offset (bytes of a cut stream are kept, with the read error).
	WriteUpload(ctx context.Context, actor audit.Entry, id string, offset int64, r io.Reader) (int64, error)
}

// ServeUploads enables the upload endpoint with u behind it (without it,
// its paths are unknown methods).
func (s *Server) ServeUploads(u Uploads) { s.uploads = u }

var uploadIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// serveUploadHTTP answers a request to the upload endpoint, in the
// envelope's shape and with its metrics.
func (s *Server) serveUploadHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rid := SecurityHeaders(w, r)
	label := "uploads.get"
	if r.Method == http.MethodPut {
		label = "uploads.write"
	}
	a, out := s.serveUpload(w, r, rid, label)
	if retry := out.retryAfter; retry > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(int((retry+time.Second-1)/time.Second)))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
	s.requests.WithLabelValues(label, fmt.Sprint(a.status)).Inc()
	s.latency.WithLabelValues(label).Observe(time.Since(start).Seconds())
}

// serveUpload runs the envelope's stages for the upload endpoint: its
// request-shape check (in place of the JSON one), then the same
// authentication (failed-attempt limit, credential, one token of the
// identity's rate limit per request: a write is one mutation whatever
// its size), the caller's tenant state, one of its top-level tenant's
// mutation slots for a write, the upload's resolution (missing or out of
// reach: NOT_FOUND, the same answer) and the IAM decision. Nothing of the
// body is read before all of them pass.
func (s *Server) serveUpload(w http.ResponseWriter, r *http.Request, rid, label string) (answer, outcome) {
	m := Method{Name: label, Action: UploadWriteAction, Mutates: r.Method == http.MethodPut}
	q := &call{r: r, ctx: r.Context(), m: m, known: true,
		c: &Caller{RequestID: rid, Addr: s.cfg.TrustedProxies.ClientAddr(r)}}
	if err := uploadShape(r); err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	if err := s.authenticateCaller(q); err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	id := strings.TrimPrefix(r.URL.Path, UploadPath)
	if !uploadIDRE.MatchString(id) {
		// No upload has such an id: it is resolved, answered and audited
		// as a missing one (the same denial row), under a name no id can
		// take, so no caller's bytes reach the audit log.
		id = malformedID
	}
	q.target = Target{Kind: "image-upload", ID: id}
	if err := s.callerState(q); err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	release, err := s.limit(q)
	if err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	err = uploadRefusal(s.scope(q))
	if err == nil {
		err = s.decide(q)
	}
	// The tenant's mutation slot covers admitting the call, not the
	// stream: a PUT may stream for minutes, and a held slot would queue
	// every other mutation of the tenant's tree (a child tenant's slow
	// uploads its parent's calls) meanwhile. The per-identity rate limit
	// still counts each PUT.
	release()
	if err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	return s.runUpload(w, q, id), q.out
}

// uploadRefusal is err as the upload endpoint answers it: the one denial
// for another tenant's upload or a missing one is NOT_FOUND (an upload's
// id is a capability its caller was given, not something to probe).
func uploadRefusal(err error) error {
	if errs.CodeOf(err) == errs.AccessDenied {
		return errs.New(errs.NotFound, "upload not found")
	}
	return err
}

// uploadShape is the upload endpoint's request-shape check: GET or PUT,
// with X-Better-Compute: 1 (which a cross-site form cannot send), and a
// PUT's body as application/octet-stream.
func uploadShape(r *http.Request) error {
	ok := r.Header.Get("X-Better-Compute") == "1"
	switch r.Method {
	case http.MethodGet:
	case http.MethodPut:
		mt, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
		ok = ok && strings.EqualFold(strings.TrimSpace(mt), "application/octet-stream")
	default:
		ok = false
	}
	if !ok {
		return errs.New(errs.CSRFRejected, "GET, or PUT with content-type application/octet-stream, and X-Better-Compute: 1 are required")
	}
	return nil
}

// runUpload answers the upload's state (GET) or streams the body into it
// (PUT at the Upload-Offset header, which must be what the server holds).
func (s *Server) runUpload(w http.ResponseWriter, q *call, id string) answer {
	c, r := q.c, q.r
	limit := s.uploads.MaxImageBytes()
	var next int64
	var err error
	if r.Method == http.MethodGet {
		// A read may have its tenant from the access cache: an upload
		// gone since answers as one that never existed.
		next, err = s.uploads.UploadOffset(q.ctx, id)
		err = uploadRefusal(s.goneSinceCached(q, err))
	} else {
		next, err = s.writeUpload(w, q, id, limit)
	}
	if err != nil {
		return s.errorAnswer(c.RequestID, err)
	}
	w.Header().Set("Upload-Offset", strconv.FormatInt(next, 10))
	b, _ := json.Marshal(apitypes.UploadState{UploadID: id, Offset: next, MaxBytes: limit})
	return answer{status: http.StatusOK, body: append(b, '\n')}
}

// writeUpload checks a PUT's offset and declared length against the
// limit before reading its body, then streams it to the module.
func (s *Server) writeUpload(w http.ResponseWriter, q *call, id string, limit int64) (int64, error) {
	r := q.r
	offset, err := strconv.ParseInt(r.Header.Get("Upload-Offset"), 10, 64)
	if err != nil || offset < 0 {
		return 0, errs.New(errs.InvalidInput, "Upload-Offset: the byte offset the body starts at is required (GET the upload for it)")
	}
	if offset > limit || r.ContentLength > limit-offset {
		return 0, errs.New(errs.PayloadTooLarge, fmt.Sprintf("the image is larger than the limit of %d bytes", limit))
	}
	next, err := s.uploads.WriteUpload(q.ctx, q.c.Actor(), id, offset, &idleReader{r: r.Body, rc: http.NewResponseController(w)})
	if err != nil && next > offset {
		s.deps.Log.Info("upload cut", "request_id", q.c.RequestID, "upload", id, "offset", next, "err", err)
	}
	return next, err
}

// idleReader reads an upload's body with a read deadline that moves on
// while bytes arrive: a body that sends nothing for uploadIdle is cut,
// a slow large one is not. Deadlines are the socket's, in real time.
type idleReader struct {
	r    io.Reader
	rc   *http.ResponseController
	last time.Time
}

func (b *idleReader) Read(p []byte) (int, error) {
	if now := time.Now(); now.Sub(b.last) > time.Second {
		b.last = now
		_ = b.rc.SetReadDeadline(now.Add(uploadIdle))
	}
	return b.r.Read(p)
}
