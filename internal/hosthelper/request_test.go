package hosthelper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// Each malformed request sent through the real socket is refused with its
// exact code.
func TestHelperRefusesBadRequests(t *testing.T) {
	f := newFixture(t, nil, nil)
	big := append([]byte(`{"version":1,"op":"ping","args":"`), bytes.Repeat([]byte("a"), helperwire.MaxRequest)...)
	big = append(big, `"}`...)
	cases := []struct {
		name, code string
		body       []byte
	}{
		{"unknown field", helperwire.CodeMalformed, []byte(`{"version":1,"op":"ping","path":"/etc/shadow"}`)},
		{"key in another case", helperwire.CodeMalformed, []byte(`{"version":1,"OP":"ping"}`)},
		{"key twice", helperwire.CodeMalformed, []byte(`{"version":1,"op":"file.write","op":"ping"}`)},
		{"trailing byte", helperwire.CodeMalformed, []byte(`{"version":1,"op":"ping"}x`)},
		{"trailing space", helperwire.CodeMalformed, []byte(`{"version":1,"op":"ping"} `)},
		{"second object", helperwire.CodeMalformed, []byte(`{"version":1,"op":"ping"}{}`)},
		{"not an object", helperwire.CodeMalformed, []byte(`null`)},
		{"empty", helperwire.CodeMalformed, nil},
		{"wrong type", helperwire.CodeMalformed, []byte(`{"version":"1","op":"ping"}`)},
		{"wrong version", helperwire.CodeVersion, []byte(`{"version":2,"op":"ping"}`)},
		{"no version", helperwire.CodeVersion, []byte(`{"op":"ping"}`)},
		{"unknown op", helperwire.CodeUnknownOp, []byte(`{"version":1,"op":"shell.exec"}`)},
		{"known op not served", helperwire.CodeUnknownOp, []byte(`{"version":1,"op":"file.write"}`)},
		{"over 4 MiB", helperwire.CodeTooLarge, big},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := rawCall(t, f.sock, c.body); got.Code != c.code {
				t.Fatalf("got code %q reason %q result %s, want code %s", got.Code, got.Reason, got.Result, c.code)
			}
		})
	}
	if got := rawCall(t, f.sock, []byte("{\"version\":1,\"op\":\"ping\"}\n")); got.Code != "" {
		t.Fatalf("one final newline refused: %+v", got)
	}
}

// Host-changing operations need the desired-state check: without one every
// such operation is refused CodeIntentMissing (fail closed), a check's
// refusal is answered with its code, and the handler runs only when the
// check passes.
func TestHostChangingOpsNeedTheIntentCheck(t *testing.T) {
	ran := 0
	h := func(context.Context, Caller, *helperwire.Request) (json.RawMessage, error) {
		ran++
		return json.RawMessage(`{}`), nil
	}
	reg := func(s *Server) { s.Handle(helperwire.OpReboot, h, true) }
	reboot := helperwire.Request{Version: 1, Op: helperwire.OpReboot, Args: json.RawMessage(`{"reason":"x"}`)}

	f := newFixture(t, nil, reg)
	if _, code := call(t, f.sock, reboot); code != helperwire.CodeIntentMissing || ran != 0 {
		t.Fatalf("no intent check: code %q, handler ran %d times", code, ran)
	}
	f = newFixture(t, func(c *Config) {
		c.Intent = func(*helperwire.Request) error {
			return &helperwire.Refusal{Code: helperwire.CodeIntentRewound, Reason: "older generation"}
		}
	}, reg)
	if _, code := call(t, f.sock, reboot); code != helperwire.CodeIntentRewound || ran != 0 {
		t.Fatalf("refusing check: code %q, handler ran %d times", code, ran)
	}
	f = newFixture(t, func(c *Config) { c.Intent = func(*helperwire.Request) error { return nil } }, reg)
	if _, code := call(t, f.sock, reboot); code != "" || ran != 1 {
		t.Fatalf("passing check: code %q, handler ran %d times", code, ran)
	}
}

// A handler's refusal keeps its code; any other error, or a panic, is
// CodeFailed with a reason that does not carry the error's detail.
func TestHandlerErrorsAnswerSafely(t *testing.T) {
	f := newFixture(t, nil, func(s *Server) {
		s.Handle(helperwire.OpFileWrite, func(context.Context, Caller, *helperwire.Request) (json.RawMessage, error) {
			return nil, fmt.Errorf("open /etc/secret-key: %w", errors.New("s3cr3t"))
		}, false)
		s.Handle(helperwire.OpFileRemove, func(context.Context, Caller, *helperwire.Request) (json.RawMessage, error) {
			return nil, &helperwire.Refusal{Code: helperwire.CodeFileID, Reason: "bad id"}
		}, false)
		s.Handle(helperwire.OpGPUReset, func(context.Context, Caller, *helperwire.Request) (json.RawMessage, error) {
			panic("boom")
		}, false)
	})
	got := rawCall(t, f.sock, []byte(`{"version":1,"op":"file.write"}`))
	if got.Code != helperwire.CodeFailed || strings.Contains(got.Reason, "s3cr3t") || strings.Contains(got.Reason, "/etc") {
		t.Fatalf("plain error answered %+v", got)
	}
	if got := rawCall(t, f.sock, []byte(`{"version":1,"op":"file.remove"}`)); got.Code != helperwire.CodeFileID {
		t.Fatalf("refusal answered %+v", got)
	}
	if got := rawCall(t, f.sock, []byte(`{"version":1,"op":"gpu.reset"}`)); got.Code != helperwire.CodeFailed {
		t.Fatalf("panic answered %+v", got)
	}
	if _, code := call(t, f.sock, ping); code != "" {
		t.Fatalf("helper no longer serves after a panic: %s", code)
	}
}

// A caller that connects and sends nothing holds nothing: the read
// deadline answers it CodeMalformed.
func TestSilentCallerIsCutOff(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.ReadTimeout = 50 * time.Millisecond }, nil)
	c, err := net.Dial("unix", f.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := readAllResponse(c)
	if err != nil || resp.Code != helperwire.CodeMalformed {
		t.Fatalf("silent caller: %+v, %v", resp, err)
	}
}

func readAllResponse(c net.Conn) (*helperwire.Response, error) {
	var b bytes.Buffer
	if _, err := b.ReadFrom(c); err != nil {
		return nil, err
	}
	return helperwire.DecodeResponse(b.Bytes())
}

// Serve returns only after in-flight handlers are done, and stopping it
// cancels their context.
func TestServeWaitsForInFlightHandlers(t *testing.T) {
	needRoot(t)
	entered, finished := make(chan struct{}), make(chan struct{})
	srv, err := New(Config{NodeUID: nodeUID, NodeGID: nodeGID})
	if err != nil {
		t.Fatal(err)
	}
	srv.Handle(helperwire.OpFileWrite, func(ctx context.Context, _ Caller, _ *helperwire.Request) (json.RawMessage, error) {
		close(entered)
		<-ctx.Done()
		close(finished)
		return nil, fmt.Errorf("stopped: %w", ctx.Err())
	}, false)
	sock := openBase(t) + "/helper.sock"
	l, err := Listen(sock, 0, nodeGID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	codes := make(chan string, 1)
	go func() { codes <- rawCall(t, sock, []byte(`{"version":1,"op":"file.write"}`)).Code }()
	<-entered
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case <-finished:
	default:
		t.Fatal("Serve returned before its handler finished")
	}
	if code := <-codes; code != helperwire.CodeFailed {
		t.Fatalf("cancelled handler answered %q", code)
	}
}

// The event buffer is bounded: the oldest events go and are counted, and
// events carry the injected clock's time.
func TestEventsAreBounded(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f := newFixture(t, func(c *Config) { c.MaxEvents = 2; c.Clock = clock.NewFake(at) }, nil)
	for range 3 {
		rawCall(t, f.sock, []byte(`{"version":9,"op":"ping"}`))
	}
	res, code := call(t, f.sock, helperwire.Request{Version: 1, Op: helperwire.OpEventsDrain})
	var ev helperwire.Events
	if err := json.Unmarshal(res, &ev); err != nil || code != "" {
		t.Fatalf("drain: %s %q %v", res, code, err)
	}
	if len(ev.Events) != 2 || ev.Dropped != 1 || ev.Events[0].AtMs != at.UnixMilli() || ev.Events[1].Code != helperwire.CodeVersion {
		t.Fatalf("events %+v", ev)
	}
}
