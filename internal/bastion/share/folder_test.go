package share

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// standard is the tree most tests share.
var standard = []string{
	"a.txt", "docs/", "docs/readme.md", "big.bin",
	"secret/x.txt", "a/b/c/secret", "a/b/.config/gcloud/x", ".config/other/y",
	".agent/notes", "proj/.agent/notes", "proj/code.go", "private/keys/k", "private/ok",
	"passwd -> /etc/passwd",
	"up -> ../outside.txt",
	"docs/deep -> ../../outside.txt",
	"toSecret -> secret/x.txt",
	"secretDir -> secret",
	"toAgent -> .agent/notes",
	"toAgentUp -> proj/../.agent/notes",
	"alias -> private",
	"pubAlias -> private",
	"loop1 -> loop2", "loop2 -> loop1",
	"goodLink -> docs/readme.md",
}

// TestPathRules asserts each path rule by its exact reason, on read, stat
// and list alike.
func TestPathRules(t *testing.T) {
	f, _ := openTest(t, []string{"secret", ".config/gcloud", "private/keys", "pubAlias/ok"}, standard...)
	cases := []struct{ path, reason string }{
		{"/etc/passwd", ReasonPathInvalid},
		{"a/../a.txt", ReasonPathInvalid},
		{"..", ReasonPathInvalid},
		{`docs\..\a.txt`, ReasonPathInvalid},
		{"a\x00.txt", ReasonPathInvalid},
		{strings.Repeat("a", 4097), ReasonPathInvalid},
		{"secret/x.txt", ReasonExcluded},
		{"a/b/c/secret", ReasonExcluded},
		{"a/b/.config/gcloud/x", ReasonExcluded},
		{".agent/notes", ReasonAgentFolder},
		{".AGENT/notes", ReasonAgentFolder},
		{"proj/.agent/notes", ReasonAgentFolder},
		{"passwd", ReasonLinkOutside},
		{"up", ReasonLinkOutside},
		{"docs/deep", ReasonLinkOutside},
		{"toSecret", ReasonExcluded},
		{"secretDir/x.txt", ReasonExcluded},
		{"alias/keys/k", ReasonExcluded},
		{"pubAlias/ok", ReasonExcluded}, // excluded by the name given only
		{"toAgent", ReasonAgentFolder},
		{"toAgentUp", ReasonAgentFolder},
		{"loop1", ReasonLinkLoop},
		{"missing.txt", ReasonNotFound},
		{"a.txt/x", ReasonNotADir},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%.40q", c.path), func(t *testing.T) {
			_, err := f.Read(c.path, 0)
			wantReason(t, err, c.reason)
			_, err = f.Stat(c.path)
			wantReason(t, err, c.reason)
			_, err = f.List(c.path)
			wantReason(t, err, c.reason)
		})
	}
}

// TestKindAndSizeRules: a read of a folder, a listing of a file, a file
// over the limit.
func TestKindAndSizeRules(t *testing.T) {
	f, _ := openTest(t, nil, standard...)
	_, err := f.Read("docs", 0)
	wantReason(t, err, ReasonNotAFile)
	_, err = f.List("a.txt")
	wantReason(t, err, ReasonNotADir)
	_, err = f.Read("big.bin", 6)
	wantReason(t, err, ReasonTooLarge)
	if b, err := f.Read("big.bin", 7); err != nil || string(b) != "big.bin" {
		t.Fatalf("read at the limit = %q, %v", b, err)
	}
}

// TestLinkChain: 40 links are followed, the 41st is a loop.
func TestLinkChain(t *testing.T) {
	var specs []string
	for i := range 41 {
		specs = append(specs, fmt.Sprintf("l%d -> l%d", i, i+1))
	}
	specs = append(specs, "l41 -> a.txt", "a.txt")
	f, _ := openTest(t, nil, specs...)
	// l2 .. l41 are 40 links; l1 .. l41 are 41.
	if b, err := f.Read("l2", 0); err != nil || string(b) != "a.txt" {
		t.Fatalf("40 links: %q, %v", b, err)
	}
	_, err := f.Read("l1", 0)
	wantReason(t, err, ReasonLinkLoop)
}

// TestReadStatInside: what the share leaves in is served, through a link
// inside the folder too.
func TestReadStatInside(t *testing.T) {
	f, _ := openTest(t, []string{"secret"}, standard...)
	for _, p := range []string{"docs/readme.md", "goodLink", "./docs//readme.md"} {
		b, err := f.Read(p, 0)
		if err != nil || string(b) != "docs/readme.md" {
			t.Fatalf("read %s = %q, %v", p, b, err)
		}
	}
	e, err := f.Stat("goodLink")
	if err != nil || e.Name != "goodLink" || e.Type != "file" || e.Size != int64(len("docs/readme.md")) {
		t.Fatalf("stat = %+v, %v", e, err)
	}
	if e, err = f.Stat(""); err != nil || e.Type != "dir" || e.Name != "." {
		t.Fatalf("stat top = %+v, %v", e, err)
	}
}

// names returns the entries' names.
func names(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Name)
	}
	return out
}

// TestListHidesExcluded: a listing leaves out excluded names and .agent,
// by the path given and by the path a link leads to.
func TestListHidesExcluded(t *testing.T) {
	f, _ := openTest(t, []string{"secret", ".config/gcloud", "private/keys", "pubAlias/ok"}, standard...)
	top, err := f.List("")
	if err != nil {
		t.Fatal(err)
	}
	got := names(top)
	for _, hidden := range []string{"secret", ".agent"} {
		if slices.Contains(got, hidden) {
			t.Errorf("top lists %q: %v", hidden, got)
		}
	}
	for _, shown := range []string{"a.txt", "docs", "passwd", ".config"} {
		if !slices.Contains(got, shown) {
			t.Errorf("top misses %q: %v", shown, got)
		}
	}
	cases := map[string][]string{
		"a/b/.config": nil,
		".config":     {"other"},
		"proj":        {"code.go"},
		"alias":       {"ok"},
		"private":     {"ok"},
		"pubAlias":    nil, // "ok" is excluded by the name given only
		"a/b/c":       nil,
	}
	for dir, want := range cases {
		es, err := f.List(dir)
		if err != nil || !slices.Equal(names(es), want) {
			t.Errorf("list %s = %v, %v; want %v", dir, names(es), err, want)
		}
	}
}

// TestSwappedAfterCheck: a file or folder replaced between the checks and
// the open (by a link into an excluded folder, or by another file) is
// refused, not served.
func TestSwappedAfterCheck(t *testing.T) {
	cases := []struct {
		name string
		swap func(root string) error
		op   func(f *Folder) error
	}{
		{"file to link", func(root string) error {
			if err := os.Remove(filepath.Join(root, "a.txt")); err != nil {
				return err
			}
			return os.Symlink("secret/x.txt", filepath.Join(root, "a.txt"))
		}, func(f *Folder) error { _, err := f.Read("a.txt", 0); return err }},
		{"file to file", func(root string) error {
			return os.Rename(filepath.Join(root, "secret", "x.txt"), filepath.Join(root, "a.txt"))
		}, func(f *Folder) error { _, err := f.Read("a.txt", 0); return err }},
		{"folder to link", func(root string) error {
			if err := os.Rename(filepath.Join(root, "docs"), filepath.Join(root, "docs-old")); err != nil {
				return err
			}
			return os.Symlink("secret", filepath.Join(root, "docs"))
		}, func(f *Folder) error { _, err := f.List("docs"); return err }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, root := openTest(t, []string{"secret"}, standard...)
			f.beforeOpen = func(string) {
				if err := c.swap(root); err != nil {
					t.Error(err)
				}
			}
			wantReason(t, c.op(f), ReasonPathChanged)
		})
	}
}
