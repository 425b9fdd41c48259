package share

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestApplyMovesArchives: a move to "" lands in Archive/<date>/<From> with
// its bytes; a named move lands where named, parents made; a link moved
// is the link, its target untouched.
func TestApplyMovesArchives(t *testing.T) {
	f, root := openTest(t, []string{"secret"}, standard...)
	moves := []Move{{From: "a.txt"}, {From: "docs/readme.md", To: "new/dir/readme.md"}, {From: "passwd", To: "links/passwd"}}
	if err := f.CheckMoves(moves); err != nil {
		t.Fatal(err)
	}
	done, archive, err := f.ApplyMoves(moves, testNow)
	if err != nil {
		t.Fatal(err)
	}
	want := []Move{{"a.txt", "Archive/2026-12-02/a.txt"}, {"docs/readme.md", "new/dir/readme.md"}, {"passwd", "links/passwd"}}
	if archive != "Archive/2026-12-02" || !slices.Equal(done, want) {
		t.Fatalf("done = %v, archive %q", done, archive)
	}
	if got := readFile(t, filepath.Join(root, "Archive", "2026-12-02", "a.txt")); got != "a.txt" {
		t.Fatalf("archived bytes = %q", got)
	}
	if got := readFile(t, filepath.Join(root, "new", "dir", "readme.md")); got != "docs/readme.md" {
		t.Fatalf("moved bytes = %q", got)
	}
	for _, gone := range []string{"a.txt", "docs/readme.md", "passwd"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !os.IsNotExist(err) {
			t.Fatalf("%s still there: %v", gone, err)
		}
	}
	if target, err := os.Readlink(filepath.Join(root, "links", "passwd")); err != nil || target != "/etc/passwd" {
		t.Fatalf("moved link = %q, %v", target, err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatalf("link target touched: %v", err)
	}
}

// TestDestinationAppearsBeforeApply: a destination made after the check is
// refused at apply and nothing is overwritten or moved.
func TestDestinationAppearsBeforeApply(t *testing.T) {
	f, root := openTest(t, nil, standard...)
	moves := []Move{{From: "a.txt"}, {From: "big.bin", To: "docs/big.bin"}}
	if err := f.CheckMoves(moves); err != nil {
		t.Fatal(err)
	}
	tree(t, root, "Archive/2026-12-02/a.txt -> ../../big.bin")
	_, _, err := f.ApplyMoves(moves, testNow)
	wantReason(t, err, ReasonDestinationExists)
	if target, err := os.Readlink(filepath.Join(root, "Archive/2026-12-02/a.txt")); err != nil || target != "../../big.bin" {
		t.Fatalf("destination overwritten: %q, %v", target, err)
	}
	for _, p := range []string{"a.txt", "big.bin"} {
		if got := readFile(t, filepath.Join(root, p)); got != p {
			t.Fatalf("%s = %q", p, got)
		}
	}
}

// TestRenameNeverReplaces: a destination made after every check, just
// before the rename, is still not replaced: the rename itself refuses.
func TestRenameNeverReplaces(t *testing.T) {
	f, root := openTest(t, nil, standard...)
	f.beforeRename = func(m Move) {
		if err := os.WriteFile(filepath.Join(root, "docs", "a.txt"), []byte("theirs"), 0o644); err != nil {
			t.Error(err)
		}
	}
	done, _, err := f.ApplyMoves([]Move{{From: "a.txt", To: "docs/a.txt"}}, testNow)
	wantReason(t, err, ReasonDestinationExists)
	if len(done) != 0 {
		t.Fatalf("done = %v", done)
	}
	if got := readFile(t, filepath.Join(root, "docs", "a.txt")); got != "theirs" {
		t.Fatalf("destination = %q, overwritten", got)
	}
	if got := readFile(t, filepath.Join(root, "a.txt")); got != "a.txt" {
		t.Fatalf("source = %q", got)
	}
}

// TestMoveRefusals: each refused move, by exact reason, at check and at
// apply, with nothing moved.
func TestMoveRefusals(t *testing.T) {
	f, root := openTest(t, []string{"secret", ".config/gcloud"}, append(standard, "stuff/gcloud/k", "keep.txt")...)
	many := make([]Move, 101)
	for i := range many {
		many[i] = Move{From: fmt.Sprint("f", i)}
	}
	cases := []struct {
		name   string
		moves  []Move
		reason string
	}{
		{"into excluded", []Move{{"a.txt", "secret/a.txt"}}, ReasonExcluded},
		{"out of excluded", []Move{{"secret/x.txt", "x.txt"}}, ReasonExcluded},
		{"into excluded run", []Move{{"a.txt", "z/.config/gcloud"}}, ReasonExcluded},
		{"folder lands in excluded run", []Move{{"stuff", "cfg/.config"}}, ReasonExcluded},
		{"excluded through a link", []Move{{"secretDir/x.txt", "x.txt"}}, ReasonExcluded},
		{"into .agent", []Move{{"a.txt", ".agent/a.txt"}}, ReasonAgentFolder},
		{"out of .agent", []Move{{".agent/notes", "notes"}}, ReasonAgentFolder},
		{"folder holding .agent", []Move{{"proj", "proj2"}}, ReasonAgentFolder},
		{"into .agent through a link", []Move{{"a.txt", "toAgentDir/a.txt"}}, ReasonAgentFolder},
		{"destination exists", []Move{{"a.txt", "keep.txt"}}, ReasonDestinationExists},
		{"missing source", []Move{{"nope", "x"}}, ReasonNotFound},
		{"the top", []Move{{"", "x"}}, ReasonPathInvalid},
		{"dotdot", []Move{{"a.txt", "docs/../b.txt"}}, ReasonPathInvalid},
		{"absolute", []Move{{"a.txt", "/tmp/a.txt"}}, ReasonPathInvalid},
		{"link out", []Move{{"a.txt", "up2/a.txt"}}, ReasonLinkOutside},
		{"empty plan", nil, ReasonPlanInvalid},
		{"101 moves", many, ReasonPlanInvalid},
		{"same source twice", []Move{{"a.txt", "b1"}, {"a.txt", "b2"}}, ReasonPlanInvalid},
		{"one inside another", []Move{{"docs", "d2"}, {"keep.txt", "docs/keep.txt"}}, ReasonPlanInvalid},
	}
	tree(t, root, "toAgentDir -> .agent", "up2 -> ..")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantReason(t, f.CheckMoves(c.moves), c.reason)
			done, _, err := f.ApplyMoves(c.moves, testNow)
			wantReason(t, err, c.reason)
			if len(done) != 0 {
				t.Fatalf("done = %v", done)
			}
		})
	}
	for _, p := range []string{"a.txt", "keep.txt", "secret/x.txt", ".agent/notes", "proj/code.go", "stuff/gcloud/k"} {
		if got := readFile(t, filepath.Join(root, p)); got != p {
			t.Fatalf("%s = %q after refused moves", p, got)
		}
	}
}
