package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// scriptLabel is a node label value that would run if the console
// rendered it as markup (node names are held to a safe alphabet at join,
// labels are not).
const scriptLabel = "<script>alert(1)</script>"

// chromiumPath finds a Chromium binary; without one the browser test
// skips, unless BC_REQUIRE_CHROMIUM=1 (CI), when it fails.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("BC_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("no chromium binary found and BC_REQUIRE_CHROMIUM=1")
	}
	t.Skip("no chromium binary found (apt-get install chromium; BC_REQUIRE_CHROMIUM=1 makes this a failure)")
	return ""
}

// freeLoopbackAddr is a loopback address with a port free now, so the
// API's base URL (the console's exact Origin) is known before it starts.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// screenshotDir is where the browser test saves its screenshots:
// BC_CONSOLE_SCREENSHOTS when set, else the test's artifact directory
// (kept with go test -artifacts).
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("BC_CONSOLE_SCREENSHOTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.ArtifactDir()
}

// browserEnv is a control plane with the console and a signed-in-able
// browser.
type browserEnv struct {
	e       *testenv.Env
	db      *store.DB
	base    string
	ctx     context.Context
	shots   string
	dialogs *atomic.Int32
}

// startBrowserEnv starts a control plane with session cookies at a known
// address, one node labelled scriptLabel with an attested command and a
// destructive batch, and a headless Chromium that counts dialogs.
func startBrowserEnv(t *testing.T) *browserEnv {
	chromium := chromiumPath(t)
	addr := freeLoopbackAddr(t)
	base := "http://" + addr
	db := storetest.NewTestSQLite(t)
	e := testenv.Start(t, db, testenv.Options{Nodes: 1,
		Tune: func(o *server.Options) { o.APIListen, o.SessionCookies, o.BaseURL = addr, true, base },
		NodeTune: func(c *daemon.Config) {
			c.Labels = map[string]string{"note": scriptLabel}
		}})
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.Flag("headless", true), chromedp.DisableGPU, chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(cancelCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	b := &browserEnv{e: e, db: db, base: base, ctx: ctx, shots: screenshotDir(t), dialogs: &atomic.Int32{}}
	err := chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			b.dialogs.Add(1)
			go func() { _, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{}) }()
		}
	})
	if err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

// shot saves a full-page screenshot as name.png and logs its path.
func (b *browserEnv) shot(t *testing.T, name string) {
	t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(b.shots, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}

// run runs browser actions, failing the test with what was being done.
func (b *browserEnv) run(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// browserGet runs one browser action that answers a value.
func browserGet[T any](t *testing.T, b *browserEnv, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(b.ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// text is the visible text of the element sel (CSS).
func (b *browserEnv) text(t *testing.T, sel string) string {
	t.Helper()
	return browserGet(t, b, "read "+sel, chromedp.Text(chromedp.CSS(sel)))
}

// TestConsoleInBrowser drives the console in headless Chromium: sign in
// with an API key, see the fleet's node with its <script> label rendered
// as text (no dialog fires, the page has no script element), open a
// command with its attested result, a destructive batch with its approve
// line and root, the audit log, sandboxes and pending approvals, then
// sign out, which revokes the session. A screenshot of each page is saved
// and its path logged.
func TestConsoleInBrowser(t *testing.T) {
	b := startBrowserEnv(t)
	e, ctx := b.e, context.Background()
	node := e.Nodes[0].NodeID()
	cmd, err := e.Client.CreateCommand(ctx, node, "diag.run", json.RawMessage(`{"suite":"quick"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.WaitCommand(t, cmd.ID); got.State != "succeeded" || !got.Attested {
		t.Fatalf("command %s: %s, attested %v", cmd.ID, got.State, got.Attested)
	}
	batch := mustBatch(t, e, leavesFor("disk.wipe", nil, true, node))

	b.run(t, "open the console signed out", chromedp.Navigate(b.base+"/console/fleet"), chromedp.WaitVisible(chromedp.ID("api_key")))
	if location := browserGet(t, b, "location", chromedp.Location()); location != b.base+"/console/signin" {
		t.Fatalf("signed out, the fleet page went to %s", location)
	}
	b.shot(t, "signin")
	b.run(t, "sign in", chromedp.SendKeys(chromedp.ID("api_key"), e.AdminKey), chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.CSS("#nodes, #error")))
	if n := browserGet(t, b, "find an error", chromedp.Evaluate[int](`document.querySelectorAll("#error").length`)); n != 0 {
		t.Fatalf("sign-in refused: %s", b.text(t, "#error"))
	}
	b.shot(t, "fleet")
	b.checkFleet(t, node)

	b.run(t, "open a command", chromedp.Click(chromedp.CSS("a.command")), chromedp.WaitVisible(chromedp.ID("command-id")))
	id, attested := b.text(t, "#command-id"), b.text(t, "#attested")
	if id != cmd.ID || !strings.HasPrefix(attested, "yes") {
		t.Fatalf("command page: id %q, attested %q", id, attested)
	}
	b.shot(t, "command")
	b.checkBatch(t, batch)
	b.checkAudit(t, b.sessionCookie(t).Value)
	b.visit(t, "sandboxes", "#sandboxes")
	t.Run("approvals", func(t *testing.T) { b.checkApprovals(t) })
	b.signOut(t)
	if n := b.dialogs.Load(); n != 0 {
		t.Fatalf("%d JavaScript dialogs fired", n)
	}
}

// checkFleet checks the fleet page: the node's id, and its <script>
// label as text, with no script element and no dialog.
func (b *browserEnv) checkFleet(t *testing.T, node string) {
	t.Helper()
	nodes, labels := b.text(t, "#nodes"), b.text(t, "td.labels")
	scripts := browserGet(t, b, "count scripts", chromedp.Evaluate[int](`document.querySelectorAll("script").length`))
	if !strings.Contains(nodes, node) {
		t.Fatalf("the fleet does not show node %s:\n%s", node, nodes)
	}
	if !strings.Contains(labels, "note="+scriptLabel) {
		t.Fatalf("the label is not rendered as text: %q", labels)
	}
	if scripts != 0 {
		t.Fatalf("the fleet page has %d script elements", scripts)
	}
}

// checkBatch opens the batches list and one batch: its root, proposer and
// the exact approve line.
func (b *browserEnv) checkBatch(t *testing.T, batch client.Batch) {
	t.Helper()
	b.visit(t, "batches", "#batches")
	b.run(t, "open the batch", chromedp.Navigate(b.base+"/console/batches/"+batch.ID), chromedp.WaitVisible(chromedp.ID("approve-line")))
	root, line := b.text(t, "#root"), b.text(t, "#approve-line")
	if root != batch.Root || !strings.HasPrefix(line, "better-compute batch approve "+batch.ID+" --key ") {
		t.Fatalf("batch page: root %q (want %q), line %q", root, batch.Root, line)
	}
	b.shot(t, "batch")
}

// visit opens /console/<name>, waits for sel and saves a screenshot.
func (b *browserEnv) visit(t *testing.T, name, sel string) {
	t.Helper()
	b.run(t, "open "+name, chromedp.Navigate(b.base+"/console/"+name), chromedp.WaitVisible(chromedp.CSS(sel)))
	b.shot(t, name)
}

// checkApprovals makes an agent acting for a person (both admins in
// root, through the API) whose destructive batch waits for the person,
// signs in as the person, finds the request's text and digest on the
// approvals page, approves it there (a form POST with the CSRF token),
// and sees the agent's same call then go through, as the agent's for its
// person.
func (b *browserEnv) checkApprovals(t *testing.T) {
	ctx, e := context.Background(), b.e
	alice, claude, aliceKey, claudeKey := rootAgent(t, e)
	agent := e.NewClient(t, claudeKey)
	leaves := leavesFor("node.reboot", nil, true, e.Nodes[0].NodeID())
	_, err := agent.CreateBatch(ctx, leaves, time.Hour)
	_, text := mustHeld(t, err)
	b.run(t, "sign in as the person", chromedp.Navigate(b.base+"/console/signin"), chromedp.WaitVisible(chromedp.ID("api_key")),
		chromedp.SendKeys(chromedp.ID("api_key"), aliceKey), chromedp.Click(chromedp.ID("signin")), chromedp.WaitVisible(chromedp.CSS("#nodes, #error")))
	b.visit(t, "approvals", "button.approve")
	shown, digest := b.text(t, "pre.described"), b.text(t, "p.digest code")
	sum := sha256.Sum256([]byte(text))
	if !strings.Contains(shown, "agent claude ("+claude+") acting for alice ("+alice+") asks:") || digest != hex.EncodeToString(sum[:]) {
		t.Fatalf("the approvals page shows %q with digest %q, want the agent's text with digest %x", shown, digest, sum)
	}
	b.run(t, "approve", chromedp.Click(chromedp.CSS("button.approve")), chromedp.WaitNotPresent(chromedp.CSS("button.approve")))
	b.shot(t, "approvals-after")
	ab, err := agent.CreateBatch(ctx, leaves, time.Hour)
	if err != nil || ab.Proposer != "proposed by agent claude for alice" {
		t.Fatalf("the agent's call after the console's approval: %+v, %v", ab, err)
	}
}

// signOut checks the session cookie the browser holds (HttpOnly,
// SameSite=Strict, an API session the API accepts with the exact
// Origin), signs out, and checks that the API refuses it and the console
// is signed out.
func (b *browserEnv) signOut(t *testing.T) {
	t.Helper()
	b.run(t, "open the fleet", chromedp.Navigate(b.base+"/console/fleet"), chromedp.WaitVisible(chromedp.ID("nodes")))
	session := b.sessionCookie(t)
	if code := b.whoami(t, session.Value); code != http.StatusOK {
		t.Fatalf("the API refuses the console's session: %d", code)
	}
	b.run(t, "sign out", chromedp.Click(chromedp.CSS(".signout button")), chromedp.WaitVisible(chromedp.ID("api_key")),
		chromedp.Navigate(b.base+"/console/fleet"), chromedp.WaitVisible(chromedp.ID("api_key")))
	if location := browserGet(t, b, "location", chromedp.Location()); location != b.base+"/console/signin" {
		t.Fatalf("after sign-out the fleet page went to %s", location)
	}
	if code := b.whoami(t, session.Value); code != http.StatusUnauthorized {
		t.Fatalf("the API still accepts a signed-out session: %d", code)
	}
}

// sessionCookie is the browser's session cookie, which must be
// HttpOnly, SameSite=Strict and for the whole origin.
func (b *browserEnv) sessionCookie(t *testing.T) *network.Cookie {
	t.Helper()
	cookies, err := chromedp.Call(b.ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{b.base + "/"}})
	if err != nil {
		t.Fatalf("read cookies: %v", err)
	}
	for _, c := range cookies.Cookies {
		if c.Name == "bc_session" {
			if !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict || c.Path != "/" {
				t.Fatalf("session cookie: %+v", c)
			}
			return c
		}
	}
	t.Fatal("no session cookie")
	return nil
}

// checkAudit seals the log, opens the audit page (the latest checkpoint
// shown) and downloads the newest event's inclusion proof through the
// console, which checks offline under the deployment's audit key.
func (b *browserEnv) checkAudit(t *testing.T, session string) {
	t.Helper()
	ctx := context.Background()
	l, err := auditlog.New(auditlog.Config{DB: b.db, Deployment: b.e.Bundle.Deployment, Clock: b.e.Clock, Log: b.e.Log})
	if err != nil {
		t.Fatal(err)
	}
	priv, err := b.e.Bundle.AuditSigningKey(b.e.KEK)
	if err != nil {
		t.Fatal(err)
	}
	key, err := auditlog.NewSigningKey(b.e.Bundle.Deployment, priv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.SealAll(ctx, key); err != nil {
		t.Fatalf("seal: %v", err)
	}
	b.visit(t, "audit", "#checkpoint")
	if v := b.text(t, "#verify"); !strings.HasPrefix(v, "verified: signed by "+b.e.Bundle.Deployment+"/audit") {
		t.Fatalf("audit page verify status: %q", v)
	}
	href := browserGet(t, b, "proof link", chromedp.Evaluate[string](`document.querySelector("#events a[href*='/proof/']").getAttribute("href")`))
	req, err := http.NewRequest(http.MethodGet, b.base+href, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(&http.Cookie{Name: "bc_session", Value: session})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	proof, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("download %s: %d %v", href, resp.StatusCode, err)
	}
	ring, err := auditlog.NewKeyRing(b.e.Bundle.Deployment, b.e.Bundle.AuditKeys())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auditlog.CheckProof(proof, ring); err != nil {
		t.Fatalf("the downloaded proof does not check: %v\n%s", err, proof)
	}
}

// whoami calls identities.whoami over HTTP with a session cookie and the
// exact Origin, as a browser script on the console's origin would, and
// returns the status.
func (b *browserEnv) whoami(t *testing.T, session string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.base+"/api/v1/identities.whoami", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Origin", b.base)
	req.AddCookie(&http.Cookie{Name: "bc_session", Value: session})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}
