package api_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// putAt is the headers of an upload write at offset.
func putAt(off int64) map[string]string {
	return map[string]string{"Content-Type": "application/octet-stream", "Upload-Offset": strconv.FormatInt(off, 10)}
}

// getHdr is the headers of an upload's state read (no JSON body).
var getHdr = map[string]string{"Content-Type": ""}

func beginUpload(t *testing.T, c *client.Client) apitypes.UploadBeginOut {
	t.Helper()
	var b apitypes.UploadBeginOut
	if err := c.Call(context.Background(), "images.beginUpload", map[string]any{}, &b); err != nil {
		t.Fatal(err)
	}
	if b.UploadPath != api.UploadPath+b.UploadID || b.MaxBytes != spec.MaxImageBytes {
		t.Fatalf("begin: %+v", b)
	}
	return b
}

// uploadOffset reads an upload's offset with the admin key.
func uploadOffset(t *testing.T, e *testenv.Env, id string) int64 {
	t.Helper()
	st, err := e.Client.UploadState(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return st.Offset
}

// TestUploadEndpointAuthentication: the upload endpoint authenticates and
// checks the request's shape like the JSON envelope, and decides
// compute:images:create on the upload: no key, a wrong key, a request a
// cross-site form could send and a viewer's key are refused by their
// exact codes, and none of their bytes are kept.
func TestUploadEndpointAuthentication(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{SandboxRuntime: spec.RuntimeSim})
	b := beginUpload(t, e.Client)
	path := b.UploadPath
	expectCode(t, do(t, e, "PUT", path, "", putAt(0), "hello"), 401, "UNAUTHENTICATED")
	expectCode(t, do(t, e, "PUT", path, "bc_live_not_a_key", putAt(0), "hello"), 401, "UNAUTHENTICATED")
	expectCode(t, do(t, e, "GET", path, "", getHdr, ""), 401, "UNAUTHENTICATED")
	expectCode(t, do(t, e, "PUT", path, e.AdminKey, map[string]string{"Upload-Offset": "0"}, "hello"), 403, "CSRF_REJECTED")
	noHeader := putAt(0)
	noHeader["X-Better-Compute"] = ""
	expectCode(t, do(t, e, "PUT", path, e.AdminKey, noHeader, "hello"), 403, "CSRF_REJECTED")
	expectCode(t, do(t, e, "POST", path, e.AdminKey, nil, "{}"), 403, "CSRF_REJECTED")
	expectCode(t, do(t, e, "PUT", path, e.AdminKey, map[string]string{"Content-Type": "application/octet-stream"}, "hello"), 400, "INVALID_INPUT")

	viewer := e.IdentityClient(t, "root", "v", "viewer")
	expectCode(t, do(t, e, "PUT", path, viewer.Key(), putAt(0), "hello"), 403, "ACCESS_DENIED")
	if n := uploadOffset(t, e, b.UploadID); n != 0 {
		t.Fatalf("refused writes kept %d bytes", n)
	}
	expectCode(t, do(t, e, "PUT", path, e.AdminKey, putAt(0), "hello"), 200, "")
	if n := uploadOffset(t, e, b.UploadID); n != 5 {
		t.Fatalf("offset %d, want 5", n)
	}
}

// TestUploadOtherTenantNotFound: another tenant can neither write to an
// upload nor read its offset; it gets the answer of an upload that does
// not exist (NOT_FOUND), and the upload is untouched.
func TestUploadOtherTenantNotFound(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{SandboxRuntime: spec.RuntimeSim})
		_, a := e.TenantAdmin(t, "acme")
		_, b := e.TenantAdmin(t, "other")
		up := beginUpload(t, a)
		// Another tenant's upload, a missing one and ids no upload can
		// have: the same answer and the same one denial row each.
		want := map[string]string{}
		for _, c := range []struct{ name, path string }{
			{"others", up.UploadPath}, {"missing", api.UploadPath + "upl_missing"},
			{"malformed", api.UploadPath + "../x"}, {"overlong", api.UploadPath + strings.Repeat("u", 65)},
		} {
			for _, verb := range []string{"PUT", "GET"} {
				rid := c.name + "-" + verb
				hdr, body := map[string]string{"Content-Type": "", "X-Request-Id": rid}, ""
				if verb == "PUT" {
					hdr, body = putAt(0), "hello"
					hdr["X-Request-Id"] = rid
				}
				r := do(t, e, verb, c.path, b.Key(), hdr, body)
				expectCode(t, r, 404, "NOT_FOUND")
				got := withoutRequestID(r.body, "")
				if want[verb] == "" {
					want[verb] = got
				} else if got != want[verb] {
					t.Errorf("%s %s: %s, want %s", verb, c.name, got, want[verb])
				}
				var details string
				err := db.QueryRowContext(context.Background(), `SELECT details FROM audit_events WHERE request_id = $1 AND outcome = 'denied'`, rid).Scan(&details)
				if wantRow := `{"reason":"` + api.ReasonOutOfReach + `"}`; err != nil || details != wantRow {
					t.Errorf("%s %s: denial row %q %v, want one with %s", verb, c.name, details, err, wantRow)
				}
			}
		}
		if n := uploadOffset(t, e, up.UploadID); n != 0 {
			t.Fatalf("another tenant's write kept %d bytes", n)
		}
		if _, err := b.UploadState(context.Background(), up.UploadID); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("client: %v, want NOT_FOUND", err)
		}
		if err := a.Upload(context.Background(), up.UploadID, bytes.NewReader([]byte("hello")), 5, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// cutPut sends a PUT that declares want bytes, sends only the first
// part, and closes its side: the server's answer (read to the end) comes
// once it has handled the cut.
func cutPut(t *testing.T, e *testenv.Env, path string, offset int64, want int, part []byte) int {
	t.Helper()
	conn, err := net.Dial("tcp", e.CP.APIAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nX-Better-Compute: 1\r\n"+
		"Content-Type: application/octet-stream\r\nUpload-Offset: %d\r\nContent-Length: %d\r\n\r\n", path, e.AdminKey, offset, want)
	if _, err := conn.Write(part); err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestUploadResumesAfterCut: a write cut part-way keeps the bytes that
// came, the server reports them, a write at another offset is refused
// (CONFLICT), and a write continuing there completes an image that
// imports under the digest of the whole.
func TestUploadResumesAfterCut(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{SandboxRuntime: spec.RuntimeSim})
		ctx := context.Background()
		whole := bytes.Repeat([]byte("0123456789"), 100_000)
		up := beginUpload(t, e.Client)
		if st := cutPut(t, e, up.UploadPath, 0, len(whole), whole[:400_000]); st != http.StatusBadRequest {
			t.Fatalf("cut write answered %d", st)
		}
		held := uploadOffset(t, e, up.UploadID)
		if held != 400_000 {
			t.Fatalf("the server holds %d bytes after a cut at 400000", held)
		}
		expectCode(t, do(t, e, "PUT", up.UploadPath, e.AdminKey, putAt(0), "0123"), 409, "CONFLICT")
		r := do(t, e, "PUT", up.UploadPath, e.AdminKey, putAt(held), string(whole[held:]))
		expectCode(t, r, 200, "")
		if r.header.Get("Upload-Offset") != strconv.Itoa(len(whole)) {
			t.Fatalf("Upload-Offset %q", r.header.Get("Upload-Offset"))
		}
		var img client.Image
		if err := e.Client.Call(ctx, "images.import", apitypes.ImageImportIn{UploadID: up.UploadID, Name: "resumed", Digest: imagetar.Digest(whole)}, &img); err != nil {
			t.Fatal(err)
		}
		if img.SizeBytes != int64(len(whole)) || img.Digest != imagetar.Digest(whole) {
			t.Fatalf("imported %+v", img)
		}
		expectCode(t, do(t, e, "PUT", up.UploadPath, e.AdminKey, putAt(int64(len(whole))), "more"), 409, "INVALID_STATE")
	})
}

// TestUploadSizeCap: an upload is bounded by the configured image size:
// a write whose declared length passes it is refused before its body is
// read, one that streams past it with no declared length is refused
// once it does, and neither keeps anything (PAYLOAD_TOO_LARGE).
func TestUploadSizeCap(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{SandboxRuntime: spec.RuntimeSim})
	e.CP.Sandboxes.SetMaxImageBytes(1000)
	var up apitypes.UploadBeginOut
	if err := e.Client.Call(context.Background(), "images.beginUpload", map[string]any{}, &up); err != nil || up.MaxBytes != 1000 {
		t.Fatalf("begin: %+v %v", up, err)
	}
	expectCode(t, do(t, e, "PUT", up.UploadPath, e.AdminKey, putAt(0), string(make([]byte, 1001))), 413, "PAYLOAD_TOO_LARGE")
	expectCode(t, do(t, e, "PUT", up.UploadPath, e.AdminKey, putAt(0), string(make([]byte, 600))), 200, "")
	expectCode(t, do(t, e, "PUT", up.UploadPath, e.AdminKey, putAt(600), string(make([]byte, 401))), 413, "PAYLOAD_TOO_LARGE")
	req, err := http.NewRequest("PUT", "http://"+e.CP.APIAddr+up.UploadPath, bytes.NewReader(make([]byte, 401)))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1 // chunked: the length is not declared
	for k, v := range putAt(600) {
		req.Header.Set(k, v)
	}
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+e.AdminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a streamed write past the cap answered %d", resp.StatusCode)
	}
	if n := uploadOffset(t, e, up.UploadID); n != 600 {
		t.Fatalf("the server holds %d bytes, want 600", n)
	}
	expectCode(t, do(t, e, "PUT", up.UploadPath, e.AdminKey, putAt(600), string(make([]byte, 400))), 200, "")
}

// TestUploadWrongBytesNeverReplaceAnImage: an upload claiming the digest
// of an image already stored (another tenant's) but holding other bytes
// is refused (INVALID_INPUT) and the stored image keeps its bytes.
func TestUploadWrongBytesNeverReplaceAnImage(t *testing.T) {
	objects := t.TempDir()
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{SandboxRuntime: spec.RuntimeSim,
		Tune: func(o *server.Options) { o.SandboxImages = "file://" + objects }})
	_, a := e.TenantAdmin(t, "acme")
	_, b := e.TenantAdmin(t, "other")
	ctx := context.Background()
	good := bytes.Repeat([]byte("good image "), 1000)
	img, err := a.ImportImage(ctx, "", "good", good)
	if err != nil {
		t.Fatal(err)
	}
	up := beginUpload(t, b)
	if err := b.Upload(ctx, up.UploadID, bytes.NewReader(make([]byte, len(good))), int64(len(good)), nil); err != nil {
		t.Fatal(err)
	}
	err = b.Call(ctx, "images.import", apitypes.ImageImportIn{UploadID: up.UploadID, Name: "bad", Digest: img.Digest}, nil)
	if !errors.Is(err, client.ErrInvalidInput) {
		t.Fatalf("wrong bytes under a stored digest: %v, want INVALID_INPUT", err)
	}
	stored, err := os.ReadFile(filepath.Join(objects, filepath.FromSlash(spec.ImageKey(img.Digest))))
	if err != nil || !bytes.Equal(stored, good) {
		t.Fatalf("the stored image changed (%d bytes, %v)", len(stored), err)
	}
}

// cutOnce cuts the body of the first upload write it carries after
// cutAt bytes (the connection fails as when a network drops).
type cutOnce struct {
	next  http.RoundTripper
	cutAt int64
	done  bool
}

func (c *cutOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && !c.done {
		c.done = true
		r.Body = io.NopCloser(io.MultiReader(io.LimitReader(r.Body, c.cutAt), errReader{}))
	}
	return c.next.RoundTrip(r)
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("network cut") }

// TestClientImportResumesAfterCut: the client's import continues an
// upload whose first write was cut, from what the server holds, and the
// image imports under the digest of the whole.
func TestClientImportResumesAfterCut(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{SandboxRuntime: spec.RuntimeSim})
	c := client.New("http://"+e.CP.APIAddr, e.AdminKey)
	cut := &cutOnce{next: http.DefaultTransport, cutAt: 300_000}
	c.HTTP.Transport = cut
	whole := bytes.Repeat([]byte("abcdefghij"), 100_000)
	var seen []int64
	img, err := c.ImportImageFrom(context.Background(), "", "resumed", bytes.NewReader(whole), int64(len(whole)), func(n int64) { seen = append(seen, n) })
	if err != nil {
		t.Fatal(err)
	}
	if !cut.done || img.Digest != imagetar.Digest(whole) || img.SizeBytes != int64(len(whole)) {
		t.Fatalf("imported %+v (cut: %v)", img, cut.done)
	}
	if len(seen) == 0 || seen[len(seen)-1] != int64(len(whole)) {
		t.Fatalf("progress ended at %v", seen[max(len(seen)-1, 0):])
	}
	// The cut write kept what came (its row says so), and the upload went
	// on from there rather than from 0.
	var cuts, writes int
	q := `SELECT COUNT(*) FROM audit_events WHERE resource LIKE 'image-upload/%' AND details LIKE $1`
	if err := e.CP.DB.QueryRowContext(context.Background(), q, `%"cut":true,"offset":0}`).Scan(&cuts); err != nil || cuts != 1 {
		t.Fatalf("cut writes recorded: %d, %v", cuts, err)
	}
	if err := e.CP.DB.QueryRowContext(context.Background(), q, `%"offset":0}`).Scan(&writes); err != nil || writes != 1 {
		t.Fatalf("writes from offset 0: %d, %v (the upload started over)", writes, err)
	}
}

// TestUploadStreamHoldsNoMutationSlot: a PUT takes its tenant's mutation
// slot to be admitted and gives it back before it streams, so an upload
// that streams for minutes does not queue the tree's other mutations (a
// child tenant's slow upload would otherwise block its parent's calls).
// With one slot, a mutation made while a PUT is mid-stream succeeds.
func TestUploadStreamHoldsNoMutationSlot(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{SandboxRuntime: spec.RuntimeSim,
		Tune: func(o *server.Options) { o.TenantMutates = 1 }})
	ctx := context.Background()
	tenant, _ := e.TenantAdmin(t, "uploader")
	id, err := e.Client.CreateIdentity(ctx, tenant, "up", "person")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Bind(ctx, tenant, id.ID, "admin"); err != nil {
		t.Fatal(err)
	}
	k, err := e.Client.CreateAPIKey(ctx, tenant, id.ID, "up", 0)
	if err != nil {
		t.Fatal(err)
	}
	key := k.Key
	cl := e.NewClient(t, key)
	var up apitypes.UploadBeginOut
	if err := cl.Call(ctx, "images.beginUpload", map[string]any{"tenant_id": tenant}, &up); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	req, err := http.NewRequest("PUT", "http://"+e.CP.APIAddr+up.UploadPath, pr)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range putAt(0) {
		req.Header.Set(k, v)
	}
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+key)
	done := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	// The server has read these bytes, so it is streaming the body.
	if _, err := pw.Write(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateTenant(ctx, tenant, "while-uploading"); err != nil {
		t.Fatalf("a mutation while the tenant's upload streams: %v", err)
	}
	pw.Close()
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the upload answered %d", code)
	}
}

// TestUploadGoneWhileCached: an upload removed after a read cached its
// decision (the collector deletes unfinished uploads) answers the next
// read exactly as an upload nobody had read: the same status, code and
// message, and the same denial rows.
func TestUploadGoneWhileCached(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	e := testenv.Start(t, db, testenv.Options{SandboxRuntime: spec.RuntimeSim})
	_, a := e.TenantAdmin(t, "acme")
	for _, who := range []struct{ name, key string }{{"tenant-admin", a.Key()}, {"root", e.AdminKey}} {
		t.Run(who.name, func(t *testing.T) {
			read, never := beginUpload(t, a), beginUpload(t, a)
			expectCode(t, do(t, e, "GET", read.UploadPath, who.key, getHdr, ""), 200, "")
			exec(t, db, `DELETE FROM sandbox_uploads WHERE id IN ($1, $2)`, read.UploadID, never.UploadID)
			get := func(path, rid string) (reply, int) {
				r := do(t, e, "GET", path, who.key, map[string]string{"Content-Type": "", "X-Request-Id": rid}, "")
				var n int
				if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM audit_events WHERE request_id = $1`, rid).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return r, n
			}
			gone, goneRows := get(read.UploadPath, "gone-"+who.name)
			missing, missingRows := get(never.UploadPath, "missing-"+who.name)
			expectCode(t, gone, 404, "NOT_FOUND")
			if g, m := withoutRequestID(gone.body, read.UploadID), withoutRequestID(missing.body, never.UploadID); g != m || goneRows != missingRows {
				t.Fatalf("gone %s (%d audit rows), never read %s (%d)", g, goneRows, m, missingRows)
			}
		})
	}
}
