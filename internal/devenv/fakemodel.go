package devenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// Fake model server: a dev-only stand-in for a person's Ollama, so that
// `better-compute dev --bastion` can show a forward end to end without a
// real model. It is never part of a deployment.
const (
	// FakeModelPublic is the model dev grants its bastion.
	FakeModelPublic = "tinyllama:latest"
	// FakeModelPrivate is the model dev does not grant: the bastion's
	// filter hides it from the list and refuses requests for it.
	FakeModelPrivate = "private:latest"
	// FakeModelAnswer is what /api/generate answers for a listed model.
	FakeModelAnswer = "hello from the fake model server"
	// fakeModelMaxBody bounds a request body the fake server reads.
	fakeModelMaxBody = 1 << 20
)

// fakeModels are the models the fake server lists, in list order.
var fakeModels = [...]string{FakeModelPublic, FakeModelPrivate}

// fakeModel is a running fake model server.
type fakeModel struct {
	addr string
	srv  *http.Server
	done chan struct{}
}

// startFakeModel serves the fake model server on 127.0.0.1 (a port the
// system picks) until close. It listens on loopback only: it stands in
// for an Ollama on the person's own machine.
func startFakeModel(clk clock.Clock, log *slog.Logger) (*fakeModel, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fake model server: %w", err)
	}
	f := &fakeModel{addr: l.Addr().String(), done: make(chan struct{}),
		srv: &http.Server{Handler: fakeModelHandler(clk), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}}
	go func() {
		defer close(f.done)
		if err := f.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("fake model server stopped", "err", err)
		}
	}()
	return f, nil
}

// close stops the server and waits for it.
func (f *fakeModel) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		_ = f.srv.Close()
	}
	<-f.done
}

// fakeModelHandler answers as Ollama does on /api/tags, /api/version and
// a non-streaming /api/generate; everything else is 404.
func fakeModelHandler(clk clock.Clock) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "0.0.0-bc-dev-fake"})
	})
	mux.HandleFunc("GET /api/tags", func(w http.ResponseWriter, _ *http.Request) {
		models := make([]map[string]any, 0, len(fakeModels))
		for _, m := range fakeModels {
			models = append(models, map[string]any{"name": m, "model": m, "size": 0, "digest": "",
				"modified_at": clk.Now().UTC().Format(time.RFC3339Nano)})
		}
		writeJSON(w, http.StatusOK, map[string]any{"models": models})
	})
	mux.HandleFunc("POST /api/generate", func(w http.ResponseWriter, r *http.Request) {
		st, body := fakeGenerate(clk, http.MaxBytesReader(w, r.Body, fakeModelMaxBody))
		writeJSON(w, st, body)
	})
	return mux
}

// fakeGenerate decides a /api/generate request: a listed model gets
// Ollama's non-streaming answer; a body that is not a JSON object with a
// model is 400; an unlisted model 404, as Ollama answers them.
func fakeGenerate(clk clock.Clock, body io.Reader) (int, any) {
	var in struct {
		Model string `json:"model"`
	}
	if err := json.NewDecoder(body).Decode(&in); err != nil || in.Model == "" {
		return http.StatusBadRequest, map[string]string{"error": "model is required"}
	}
	if !slices.Contains(fakeModels[:], in.Model) {
		return http.StatusNotFound, map[string]string{"error": fmt.Sprintf("model %q not found, try pulling it first", in.Model)}
	}
	return http.StatusOK, map[string]any{"model": in.Model, "created_at": clk.Now().UTC().Format(time.RFC3339Nano),
		"response": FakeModelAnswer, "done": true, "done_reason": "stop"}
}

// writeJSON writes v as the JSON answer with status st.
func writeJSON(w http.ResponseWriter, st int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(st)
	_ = json.NewEncoder(w).Encode(v)
}
