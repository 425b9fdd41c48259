package chainlog

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzVerify feeds Verify arbitrary files. It must never panic; a chain it
// accepts has exactly n lines; a broken one names a line from 1 to n+1.
func FuzzVerify(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte("{}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := Verify(bytes.NewReader(data))
		lines := uint64(bytes.Count(data, []byte("\n")))
		var be *BrokenError
		switch {
		case err == nil:
			if n != lines {
				t.Fatalf("accepted %d events in %d lines", n, lines)
			}
		case errors.As(err, &be):
			if be.Line < 1 || uint64(be.Line) != n+1 {
				t.Fatalf("broken at line %d after %d good events", be.Line, n)
			}
		default:
			t.Fatalf("Verify of bytes: %v", err)
		}
	})
}
