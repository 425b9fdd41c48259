package tunnelwire

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestRoundTrip: data split at MaxData, EOF and a refusal come back in
// order and intact, then io.EOF.
func TestRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte("x"), MaxData+10)
	var b []byte
	b = Append(b, Data, big)
	b = Append(b, EOF, nil)
	b = append(b, RefusalFrame("ACCESS_DENIED", "the caller's access was revoked")...)
	r := NewReader(bytes.NewReader(b))
	var got []byte
	for range 2 {
		f, err := r.Next()
		if err != nil || f.Type != Data {
			t.Fatalf("data frame: %v %v", f.Type, err)
		}
		got = append(got, f.Payload...)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("data differs")
	}
	if f, err := r.Next(); err != nil || f.Type != EOF {
		t.Fatalf("eof frame: %v %v", f.Type, err)
	}
	f, err := r.Next()
	if err != nil || f.Type != Error {
		t.Fatalf("error frame: %v %v", f.Type, err)
	}
	ref, _ := DecodeRefusal(f.Payload)
	if ref.Code != "ACCESS_DENIED" {
		t.Fatalf("refusal %+v", ref)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

// TestRefusesBadFrames: an unknown type, a data frame over MaxData, an
// EOF with a payload, an error frame that is not a refusal, and a cut
// frame are each refused with ErrFrame or io.ErrUnexpectedEOF.
func TestRefusesBadFrames(t *testing.T) {
	for name, c := range map[string]struct {
		b    []byte
		want error
	}{
		"unknown type":      {[]byte{9, 0, 0, 0, 0}, ErrFrame},
		"data over bound":   {[]byte{1, 0, 0, 0x80, 1}, ErrFrame},
		"eof with payload":  {[]byte{2, 0, 0, 0, 1, 'x'}, ErrFrame},
		"error not refusal": {append([]byte{3, 0, 0, 0, 2}, "{}"...), ErrFrame},
		"cut header":        {[]byte{1, 0, 0}, io.ErrUnexpectedEOF},
		"short resize":      {[]byte{4, 0, 0, 0, 2, 0, 80}, ErrFrame},
		"long exit":         {[]byte{5, 0, 0, 0, 5, 0, 0, 0, 0, 1}, ErrFrame},
		"cut payload":       {[]byte{1, 0, 0, 0, 5, 'a'}, io.ErrUnexpectedEOF},
	} {
		_, err := NewReader(bytes.NewReader(c.b)).Next()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

// TestRefusalFrameFits: a long message is cut so the frame stays within
// MaxError and still reads back.
func TestRefusalFrameFits(t *testing.T) {
	b := RefusalFrame("INTERNAL_ERROR", strings.Repeat("m", 5000))
	if _, err := NewReader(bytes.NewReader(b)).Next(); err != nil {
		t.Fatal(err)
	}
}

// FuzzFrames: any bytes either read as frames within their bounds or end
// with an error; frames re-encode to the bytes read.
func FuzzFrames(f *testing.F) {
	f.Add(Append(Append(nil, Data, []byte("hello")), EOF, nil))
	f.Add(RefusalFrame("NOT_FOUND", "node not found"))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff})
	f.Add(append(ResizeFrame(120, 40), ExitFrame(3)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReader(bytes.NewReader(b))
		var again []byte
		for {
			fr, err := r.Next()
			if err != nil {
				if !bytes.HasPrefix(b, again) {
					t.Fatal("frames read do not re-encode to the input's prefix")
				}
				return
			}
			if len(fr.Payload) > maxPayload(fr.Type) {
				t.Fatalf("frame over its bound: %d", len(fr.Payload))
			}
			again = Append(again, fr.Type, fr.Payload)
		}
	})
}

// TestResizeAndExitRoundTrip: a terminal size and an exit status come
// back as sent.
func TestResizeAndExitRoundTrip(t *testing.T) {
	r := NewReader(bytes.NewReader(append(ResizeFrame(300, 70), ExitFrame(-1)...)))
	f, err := r.Next()
	if err != nil || f.Type != Resize {
		t.Fatal(f.Type, err)
	}
	if c, rows := DecodeResize(f.Payload); c != 300 || rows != 70 {
		t.Fatal(c, rows)
	}
	f, err = r.Next()
	if err != nil || f.Type != Exit || DecodeExit(f.Payload) != -1 {
		t.Fatal(f.Type, err)
	}
}
