package chainlog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func openLog(t *testing.T, path string) (*Log, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	l, err := Open(path, clk)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, clk
}

// writeLog makes a log of n events and returns its path and lines.
func writeLog(t *testing.T, n int) (string, [][]byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, clk := openLog(t, path)
	for i := 0; i < n; i++ {
		clk.Advance(time.Second)
		if _, err := l.Append(Event{Kind: "accept", Lane: "inference/ollama", Peer: "10.0.0.1:5555", Detail: fmt.Sprintf("job %d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, bytes.SplitAfter(b, []byte("\n"))[:n]
}

func wantBroken(t *testing.T, data []byte, line int, reason string) {
	t.Helper()
	_, err := Verify(bytes.NewReader(data))
	var be *BrokenError
	if !errors.As(err, &be) || be.Line != line || be.Reason != reason {
		t.Fatalf("Verify err = %v, want line %d %s", err, line, reason)
	}
}

func TestAppendAndVerify(t *testing.T) {
	path, lines := writeLog(t, 3)
	n, err := VerifyFile(path)
	if err != nil || n != 3 {
		t.Fatalf("VerifyFile = %d, %v", n, err)
	}
	if !bytes.Contains(lines[0], []byte(`"prev":"`+Genesis+`"`)) {
		t.Fatalf("the first line does not start at Genesis: %s", lines[0])
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v; want 0600", fi.Mode(), err)
	}
	if n, err := Verify(strings.NewReader("")); n != 0 || err != nil {
		t.Fatalf("empty log: %d, %v", n, err)
	}
}

func TestTamperedByteIsHashMismatch(t *testing.T) {
	_, lines := writeLog(t, 5)
	data := bytes.Join(lines, nil)
	i := bytes.Index(data, []byte("job 2"))
	data[i+4] = '7' // "job 7" on line 3
	wantBroken(t, data, 3, ReasonHashMismatch)
}

func TestReformattedLineIsHashMismatch(t *testing.T) {
	_, lines := writeLog(t, 3)
	lines[1] = bytes.Replace(lines[1], []byte(`"kind":`), []byte(`"kind": `), 1)
	wantBroken(t, bytes.Join(lines, nil), 2, ReasonHashMismatch)
}

func TestDeletedLine(t *testing.T) {
	_, lines := writeLog(t, 4)
	data := bytes.Join(append(append([][]byte{}, lines[:1]...), lines[2:]...), nil)
	wantBroken(t, data, 2, ReasonSeqGap)
}

func TestRenumberedAfterDeleteIsPrevMismatch(t *testing.T) {
	// Deleting line 2 and renumbering line 3 as 2 still breaks the chain.
	_, lines := writeLog(t, 4)
	l3 := bytes.Replace(lines[2], []byte(`{"seq":3,`), []byte(`{"seq":2,`), 1)
	data := bytes.Join([][]byte{lines[0], l3, lines[3]}, nil)
	wantBroken(t, data, 2, ReasonPrevMismatch)
}

func TestReorderedLines(t *testing.T) {
	_, lines := writeLog(t, 4)
	lines[1], lines[2] = lines[2], lines[1]
	wantBroken(t, bytes.Join(lines, nil), 2, ReasonSeqGap)
}

func TestTruncatedLastLine(t *testing.T) {
	path, lines := writeLog(t, 3)
	data := bytes.Join(lines, nil)
	data = data[:len(data)-10]
	wantBroken(t, data, 3, ReasonTruncatedLine)
	wantBroken(t, bytes.Join(lines, nil)[:len(data)+9], 3, ReasonTruncatedLine) // only the newline gone
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path, clock.NewFake(t0))
	var be *BrokenError
	if !errors.As(err, &be) || be.Line != 3 || be.Reason != ReasonTruncatedLine {
		t.Fatalf("Open of a truncated log: %v, want line 3 %s", err, ReasonTruncatedLine)
	}
}

func TestBadJSON(t *testing.T) {
	_, lines := writeLog(t, 2)
	cases := map[string][]byte{
		"not json":      []byte("hello\n"),
		"unknown field": bytes.Replace(lines[0], []byte(`{"seq"`), []byte(`{"x":1,"seq"`), 1),
		"bad kind":      bytes.Replace(lines[0], []byte(`"kind":"accept"`), []byte(`"kind":"ACCEPT"`), 1),
		"trailing":      append(bytes.TrimSuffix(bytes.Clone(lines[0]), []byte("\n")), []byte(" {}\n")...),
		"empty line":    []byte("\n"),
		"too long":      append(bytes.Repeat([]byte(" "), MaxLineBytes+10), '\n'),
	}
	for name, l1 := range cases {
		t.Run(name, func(t *testing.T) { wantBroken(t, append(bytes.Clone(l1), lines[1]...), 1, ReasonBadJSON) })
	}
}

func TestReopenContinuesChain(t *testing.T) {
	path, _ := writeLog(t, 2)
	l, _ := openLog(t, path)
	e, err := l.Append(Event{Kind: "refuse", Reason: "grant-expired"})
	if err != nil || e.Seq != 3 {
		t.Fatalf("Append after reopen = %+v, %v", e, err)
	}
	if n, err := VerifyFile(path); n != 3 || err != nil {
		t.Fatalf("VerifyFile = %d, %v", n, err)
	}
	got, err := l.Since(1, 10)
	if err != nil || len(got) != 2 || got[0].Seq != 2 || got[1] != e {
		t.Fatalf("Since(1) = %+v, %v", got, err)
	}
	if got, _ := l.Since(0, 1); len(got) != 1 || got[0].Seq != 1 {
		t.Fatalf("Since(0, 1) = %+v", got)
	}
}

func TestOpenRefusesBrokenChain(t *testing.T) {
	path, lines := writeLog(t, 3)
	lines[0], lines[1] = lines[1], lines[0]
	if err := os.WriteFile(path, bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path, clock.NewFake(t0))
	var be *BrokenError
	if !errors.As(err, &be) || be.Line != 1 || be.Reason != ReasonSeqGap {
		t.Fatalf("Open = %v, want line 1 %s", err, ReasonSeqGap)
	}
}

func TestConcurrentAppendsStayContiguous(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, _ := openLog(t, path)
	var wg sync.WaitGroup
	errs := make(chan error, 8*25)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				if _, err := l.Append(Event{Kind: "accept", Detail: fmt.Sprint(g, i)}); err != nil {
					errs <- err
				}
				if _, err := l.Since(0, 5); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n, err := VerifyFile(path); n != 200 || err != nil {
		t.Fatalf("VerifyFile = %d, %v", n, err)
	}
}

func TestSinceReportsTamperUnderOpenLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, _ := openLog(t, path)
	for i := 0; i < 3; i++ {
		if _, err := l.Append(Event{Kind: "accept", Detail: "abc"}); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	i := bytes.LastIndex(b, []byte("abc"))
	if _, err := f.WriteAt([]byte("x"), int64(i)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = l.Since(0, 10)
	var be *BrokenError
	if !errors.As(err, &be) || be.Line != 3 || be.Reason != ReasonHashMismatch {
		t.Fatalf("Since after tamper: %v, want line 3 %s", err, ReasonHashMismatch)
	}
}
