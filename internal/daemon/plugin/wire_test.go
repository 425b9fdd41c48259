package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
)

// TestLineReaderBounds: a line at the bound passes, one byte more is
// refused with the caller's code, a cut-off line is ErrUnexpectedEOF.
func TestLineReaderBounds(t *testing.T) {
	in := strings.Repeat("a", 100) + "\n" + strings.Repeat("b", 101) + "\n"
	lr := NewLineReader(strings.NewReader(in))
	if l, err := lr.ReadLine(100, CodeMessageTooLarge); err != nil || len(l) != 100 {
		t.Fatalf("line at the bound: %d %v", len(l), err)
	}
	if _, err := lr.ReadLine(100, CodeMessageTooLarge); CodeOf(err) != CodeMessageTooLarge {
		t.Fatalf("line over the bound: %v", err)
	}
	big := NewLineReader(strings.NewReader(strings.Repeat("c", MaxHandshake+1) + "\n"))
	if _, err := big.ReadLine(MaxHandshake, CodeHandshakeTooLarge); CodeOf(err) != CodeHandshakeTooLarge {
		t.Fatalf("handshake over 64 KiB: %v", err)
	}
	if _, err := NewLineReader(strings.NewReader("abc")).ReadLine(100, CodeMessageTooLarge); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut line: %v", err)
	}
	if _, err := NewLineReader(strings.NewReader("")).ReadLine(100, CodeMessageTooLarge); !errors.Is(err, io.EOF) {
		t.Fatalf("empty input: %v", err)
	}
}

// TestDecodeRefusals: each malformed message is refused with its code.
func TestDecodeRefusals(t *testing.T) {
	for _, c := range []struct{ line, code string }{
		{`{"protocol":"bcx-driver/2","name":"sim","inventory":{}}`, CodeHandshakeInvalid},
		{`{"protocol":"bcx-driver/1","name":"Sim!","inventory":{}}`, CodeHandshakeInvalid},
		{`{"protocol":"bcx-driver/1","name":"sim"}`, CodeHandshakeInvalid},
		{`{"protocol":"bcx-driver/1","name":"sim","inventory":{"cpus":"x"}}`, CodeHandshakeInvalid},
		{`{"protocol":"bcx-driver/1","name":"sim","inventory":{},"extra":1}`, CodeHandshakeInvalid},
		{`{"protocol":"bcx-driver/1","name":"sim","inventory":{}} {}`, CodeHandshakeInvalid},
	} {
		if _, _, err := DecodeHandshake([]byte(c.line)); CodeOf(err) != c.code {
			t.Errorf("handshake %s: %v, want %s", c.line, err, c.code)
		}
	}
	for _, line := range []string{`{"id":0,"result":{}}`, `{"id":1}`, `{"id":1,"result":{},"error":"x"}`, `{"id":1,"result":null}`, `{"id":-1,"error":"x"}`, `{"id":1,"error":"x","more":1}`} {
		if _, err := DecodeResponse([]byte(line)); CodeOf(err) != CodeMessageInvalid {
			t.Errorf("response %s: %v", line, err)
		}
	}
	for _, line := range []string{`{"id":0,"kind":"x"}`, `{"id":1}`, `{"id":1,"kind":"x","payload":}`} {
		if _, err := DecodeRequest([]byte(line)); CodeOf(err) != CodeMessageInvalid {
			t.Errorf("request %s: %v", line, err)
		}
	}
}

// TestServeRoundTrip: Serve's handshake decodes to the driver's inventory
// and a request gets the driver's answer, in process.
func TestServeRoundTrip(t *testing.T) {
	sim := driver.NewSim("h1")
	var out bytes.Buffer
	if err := Serve(t.Context(), "sim", sim, strings.NewReader(`{"id":7,"kind":"node.ping"}`+"\n"), &out); err != nil {
		t.Fatal(err)
	}
	lr := NewLineReader(&out)
	hs, _ := lr.ReadLine(MaxHandshake, CodeHandshakeTooLarge)
	name, inv, err := DecodeHandshake(hs)
	if err != nil || name != "sim" || !proto.Equal(inv, sim.Inventory()) {
		t.Fatalf("handshake: %s %v %v", name, inv, err)
	}
	line, _ := lr.ReadLine(MaxMessage, CodeMessageTooLarge)
	r, err := DecodeResponse(line)
	if err != nil || r.ID != 7 || !bytes.Contains(r.Result, []byte(`"pong":true`)) {
		t.Fatalf("response: %s %v", line, err)
	}
}

// FuzzDecode feeds one line to every decoder: none panics, and what one
// accepts encodes and decodes back to the same message.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"protocol":"bcx-driver/1","name":"sim","inventory":{"driver":"sim","cpus":64}}`))
	f.Add([]byte(`{"id":1,"kind":"node.ping","payload":{"a":1}}`))
	f.Add([]byte(`{"id":2,"result":{"pong":true}}`))
	f.Add([]byte(`{"id":3,"error":"unsupported-kind"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		if name, inv, err := DecodeHandshake(line); err == nil {
			b, err := EncodeHandshake(name, inv)
			if err != nil {
				t.Fatalf("re-encode handshake: %v", err)
			}
			n2, inv2, err := DecodeHandshake(bytes.TrimSuffix(b, []byte("\n")))
			if err != nil || n2 != name || !proto.Equal(inv, inv2) {
				t.Fatalf("handshake round trip: %v", err)
			}
		}
		if r, err := DecodeRequest(line); err == nil {
			b, _ := EncodeMessage(r)
			r2, err := DecodeRequest(bytes.TrimSuffix(b, []byte("\n")))
			if err != nil || r2.ID != r.ID || r2.Kind != r.Kind || !jsonEqual(r.Payload, r2.Payload) {
				t.Fatalf("request round trip: %v", err)
			}
		}
		if r, err := DecodeResponse(line); err == nil {
			b, _ := EncodeMessage(r)
			r2, err := DecodeResponse(bytes.TrimSuffix(b, []byte("\n")))
			if err != nil || r2.ID != r.ID || (r.Error == nil) != (r2.Error == nil) || !jsonEqual(r.Result, r2.Result) {
				t.Fatalf("response round trip: %v", err)
			}
		}
	})
}

// jsonEqual reports whether a and b are the same JSON value: encoding
// may spell a string differently (encoding/json writes ">" as "\u003e"),
// so the values are compared, not the bytes.
func jsonEqual(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	dx, dy := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	dx.UseNumber()
	dy.UseNumber()
	if dx.Decode(&x) != nil || dy.Decode(&y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
