package devenv_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/devenv"
)

// laneRequest sends one request over a new inference/ollama lane to the
// bastion and returns the answer's status and body.
func laneRequest(t *testing.T, c *client.Client, id, method, path, body string) (int, string) {
	t.Helper()
	conn, err := c.ConnectLane(context.Background(), id, "inference/ollama")
	if err != nil {
		t.Fatalf("connect lane: %v", err)
	}
	defer conn.Close()
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: ollama\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", method, path, len(body), body)
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// modelNames parses an Ollama model list.
func modelNames(t *testing.T, body string) []string {
	t.Helper()
	var l struct {
		Models []struct{ Name, Model string } `json:"models"`
	}
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatalf("model list %q: %v", body, err)
	}
	var out []string
	for _, m := range l.Models {
		out = append(out, m.Name, m.Model)
	}
	return out
}

// dev --bastion pairs a bastion that bastions.list shows connected with
// families [inference]; through a lane its model list holds only the
// granted model, a generate for it is answered by the fake model server,
// and one for the other model is refused model-out-of-scope. The env
// file names it in BC_BASTION_ID, and a restart keeps the same bastion
// without a second grant.
func TestDevBastionForwardsOnlyTheGrantedModel(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	o := devenv.Options{DataDir: dir, Nodes: 0, APIListen: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", Bastion: true,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Out: io.Discard}
	e, err := devenv.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { e.Close() }()
	vars := sourceEnv(t, e.EnvFile)
	if e.BastionID == "" || vars["BC_BASTION_ID"] != e.BastionID {
		t.Fatalf("BC_BASTION_ID %q, bastion %q", vars["BC_BASTION_ID"], e.BastionID)
	}
	if !strings.Contains(e.BastionHint, "bastions connect --bastion "+e.BastionID+" --lane inference/ollama") {
		t.Fatalf("hint %q", e.BastionHint)
	}
	c, err := client.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	checkListed(t, c, e.BastionID)
	checkForward(t, c, e.BastionID)

	first := e.BastionID
	e.Close()
	if e, err = devenv.Start(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if e.BastionID != first {
		t.Fatalf("second run's bastion %s, want the first run's %s", e.BastionID, first)
	}
	sourceEnv(t, e.EnvFile) // the API's port is new
	if c, err = client.FromEnv(); err != nil {
		t.Fatal(err)
	}
	var gs struct {
		Grants []apitypes.BastionGrant `json:"grants"`
	}
	if err := c.Call(context.Background(), "bastions.grants", apitypes.BastionIDIn{BastionID: first}, &gs); err != nil || len(gs.Grants) != 1 {
		t.Fatalf("grants after a restart: %+v %v, want the one grant", gs, err)
	}
	checkForward(t, c, e.BastionID)
}

// checkListed checks bastions.list shows the bastion connected with
// families [inference].
func checkListed(t *testing.T, c *client.Client, id string) {
	t.Helper()
	var ls struct {
		Bastions []apitypes.BastionSummary `json:"bastions"`
	}
	if err := c.Call(context.Background(), "bastions.list", apitypes.TenantIn{}, &ls); err != nil {
		t.Fatal(err)
	}
	if len(ls.Bastions) != 1 || ls.Bastions[0].ID != id || !ls.Bastions[0].Connected || !slices.Equal(ls.Bastions[0].Families, []string{"inference"}) {
		t.Fatalf("bastions.list: %+v, want %s connected with [inference]", ls.Bastions, id)
	}
}

// checkForward checks the forward through a lane: the list rewritten to
// the grant, the granted model answered, the other refused.
func checkForward(t *testing.T, c *client.Client, id string) {
	t.Helper()
	st, body := laneRequest(t, c, id, "GET", "/api/tags", "")
	if names := modelNames(t, body); st != http.StatusOK || !slices.Equal(names, []string{devenv.FakeModelPublic, devenv.FakeModelPublic}) {
		t.Fatalf("/api/tags: %d %s, want only %s", st, body, devenv.FakeModelPublic)
	}
	st, body = laneRequest(t, c, id, "POST", "/api/generate", `{"model":"tinyllama:latest","prompt":"hi","stream":false}`)
	if st != http.StatusOK || !strings.Contains(body, devenv.FakeModelAnswer) {
		t.Fatalf("generate tinyllama: %d %s", st, body)
	}
	st, body = laneRequest(t, c, id, "POST", "/api/generate", `{"model":"private:latest","prompt":"hi","stream":false}`)
	if st != http.StatusForbidden || !strings.Contains(body, `"reason":"model-out-of-scope"`) {
		t.Fatalf("generate private: %d %s, want 403 model-out-of-scope", st, body)
	}
}

// A bastion unpaired through the API is not paired again behind the
// person's back: the next dev --bastion on the same data refuses to
// start, naming the unpair.
func TestDevBastionUnpairedRefusesToStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	o := devenv.Options{DataDir: dir, APIListen: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", Bastion: true,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Out: io.Discard}
	e, err := devenv.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	sourceEnv(t, e.EnvFile)
	c, err := client.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Call(context.Background(), "bastions.unpair", apitypes.IDIn{ID: e.BastionID}, nil); err != nil {
		t.Fatalf("unpair: %v", err)
	}
	e.Close()
	e, err = devenv.Start(context.Background(), o)
	if err == nil {
		e.Close()
		t.Fatal("dev --bastion started again on an unpaired bastion")
	}
	if !errors.Is(err, devenv.ErrBastionUnpaired) {
		t.Fatalf("restart after unpair: %v, want devenv.ErrBastionUnpaired", err)
	}
}
