package integration

import (
	"context"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/bettercompute/bettercompute/internal/devenv"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// Every file dev writes (database, keys, node identities, journals, env)
// is private to its owner, and a restart brings back the same fleet.
func TestDevDataFilesArePrivate(t *testing.T) {
	dir := t.TempDir()
	start := func() *devenv.Env {
		e, err := devenv.Start(context.Background(), devenv.Options{DataDir: dir, Nodes: 2, APIListen: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", Log: testenv.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := start()
	first := append([]string(nil), e.NodeIDs...)
	e.Close()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		// The sandbox image store holds content-addressed images (never
		// secrets) written by gocloud.dev's fileblob, which does not
		// choose file modes; the store's own directory is private.
		if p == filepath.Join(dir, "objects") {
			if info.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s has mode %v, want no group or other access", p, info.Mode().Perm())
			}
			return fs.SkipDir
		}
		if info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %v, want no group or other access", p, info.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e = start()
	defer e.Close()
	if len(e.NodeIDs) != 2 {
		t.Fatalf("restart brought back %d nodes", len(e.NodeIDs))
	}
	seen := map[string]bool{first[0]: true, first[1]: true}
	for _, id := range e.NodeIDs {
		if !seen[id] {
			t.Fatalf("restart made a new node %s; want the same fleet %v", id, first)
		}
	}
}
