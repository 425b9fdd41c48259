package share

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// TestStore: Add, List, Find and Remove, the id's shape, and shares.json
// 0600.
func TestStore(t *testing.T) {
	base := t.TempDir()
	data := filepath.Join(base, "data")
	tree(t, base, "photos/", "real/", "docs -> real")
	a, err := Add(data, filepath.Join(base, "photos")+"/", []string{"raw", ".cache/"}, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^sh_[a-z2-7]{12}$`).MatchString(a.ID) || !a.Created.Equal(testNow) {
		t.Fatalf("share = %+v", a)
	}
	if !slices.Equal(a.Excludes, []string{"raw", ".cache"}) {
		t.Fatalf("excludes = %q", a.Excludes)
	}
	b, err := Add(data, filepath.Join(base, "docs"), nil, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := filepath.EvalSymlinks(filepath.Join(base, "real")); b.Path != want || b.Excludes == nil {
		t.Fatalf("share via link = %+v, want path %s", b, want)
	}
	fi, err := os.Stat(filepath.Join(data, "shares.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("shares.json mode = %v, %v", fi.Mode(), err)
	}
	if got, err := Find(data, b.ID); err != nil || got.Path != b.Path {
		t.Fatalf("find = %+v, %v", got, err)
	}
	if err := Remove(data, a.ID); err != nil {
		t.Fatal(err)
	}
	if all, err := List(data); err != nil || len(all) != 1 || all[0].ID != b.ID {
		t.Fatalf("list after remove = %+v, %v", all, err)
	}
	_, err = Find(data, a.ID)
	wantReason(t, err, ReasonUnknownShare)
	wantReason(t, Remove(data, a.ID), ReasonUnknownShare)
}

// TestAddRefuses: each folder and pattern Add refuses.
func TestAddRefuses(t *testing.T) {
	base := t.TempDir()
	data := filepath.Join(base, "data")
	tree(t, base, "file.txt", "home/", "data/")
	cases := []struct {
		path     string
		excludes []string
		reason   string
	}{
		{"relative/dir", nil, ReasonPathInvalid},
		{filepath.Join(base, "missing"), nil, ReasonNotFound},
		{filepath.Join(base, "file.txt"), nil, ReasonNotADir},
		{filepath.Join(base, "home"), []string{"../x"}, ReasonPatternInvalid},
		{base, nil, ReasonHoldsDataDir},
		{data, nil, ReasonHoldsDataDir},
	}
	for _, c := range cases {
		_, err := Add(data, c.path, c.excludes, testNow)
		wantReason(t, err, c.reason)
	}
	if all, err := List(data); err != nil || len(all) != 0 {
		t.Fatalf("refused adds left %+v, %v", all, err)
	}
}

// TestOpenFolderGone: a share whose folder was removed is not found.
func TestOpenFolderGone(t *testing.T) {
	base := t.TempDir()
	tree(t, base, "gone/")
	s, err := Add(filepath.Join(base, "data"), filepath.Join(base, "gone"), nil, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(base, "gone")); err != nil {
		t.Fatal(err)
	}
	_, err = OpenFolder(s)
	wantReason(t, err, ReasonNotFound)
}
