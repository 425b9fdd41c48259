package api_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// uploadBenchBytes is the size of one benchmarked upload.
const uploadBenchBytes = 256 << 20

// discardServer reads every request body into io.Discard: the same
// loopback HTTP/1.1 transport with nothing of the upload endpoint.
func discardServer(b *testing.B) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"offset":0}` + "\n"))
	})}
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(func() { srv.Close() })
	return "http://" + lis.Addr().String() + "/api/v1/uploads/x"
}

// BenchmarkUpload measures one 256 MiB image upload on loopback through
// the upload endpoint (authentication, IAM, the sandbox module writing
// to a file:// image store, on SQLite: "upload"), the whole import
// (hashing, upload and assembling under the digest: "import"), and a
// bare HTTP PUT of the same bytes to io.Discard in the same process
// ("bare"). bench/upload/run prints MB/s and the ratios.
func BenchmarkUpload(b *testing.B) {
	data := bytes.Repeat([]byte("better compute image bytes\n"), uploadBenchBytes/27+1)[:uploadBenchBytes]
	b.Run("bare", func(b *testing.B) {
		url := discardServer(b)
		b.SetBytes(uploadBenchBytes)
		for b.Loop() {
			req, _ := http.NewRequest("PUT", url, bytes.NewReader(data))
			req.Header.Set("Content-Type", "application/octet-stream")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	e := testenv.Start(b, storetest.NewTestSQLite(b), testenv.Options{SandboxRuntime: spec.RuntimeSim})
	ctx := context.Background()
	b.Run("upload", func(b *testing.B) {
		b.SetBytes(uploadBenchBytes)
		for b.Loop() {
			var up apitypes.UploadBeginOut
			if err := e.Client.Call(ctx, "images.beginUpload", map[string]any{}, &up); err != nil {
				b.Fatal(err)
			}
			if err := e.Client.Upload(ctx, up.UploadID, bytes.NewReader(data), uploadBenchBytes, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("import", func(b *testing.B) {
		b.SetBytes(uploadBenchBytes)
		for b.Loop() {
			if _, err := e.Client.ImportImage(ctx, "", "bench", data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
