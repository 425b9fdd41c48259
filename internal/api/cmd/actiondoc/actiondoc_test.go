package main

import (
	"context"
	"os"
	"strings"
	"testing"
)

const docPath = "../../../../docs/iam.md"

// TestIAMDocIsCurrent fails when docs/iam.md's generated parts (every
// action of the method table, the resource kinds, the built-in roles)
// differ from the code; `go run ./internal/api/cmd/actiondoc` rewrites them.
func TestIAMDocIsCurrent(t *testing.T) {
	old, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := regions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	doc, err := rewrite(string(old), rs)
	if err != nil {
		t.Fatal(err)
	}
	if doc != string(old) {
		t.Fatal("docs/iam.md is stale: run `go run ./internal/api/cmd/actiondoc` and commit the result")
	}
}

// TestEveryActionIsListed checks the table itself: each method's action
// and name, and the further action, appear in it.
func TestEveryActionIsListed(t *testing.T) {
	table := renderActions(allMethods())
	for _, m := range allMethods() {
		if !strings.Contains(table, "| `"+m.Action+"` |") || !strings.Contains(table, "`"+m.Name+"`") {
			t.Errorf("%s (%s) is missing from the action table", m.Name, m.Action)
		}
	}
	for _, f := range furtherActions {
		if !strings.Contains(table, "| `"+f.action+"` |") {
			t.Errorf("%s is missing", f.action)
		}
	}
	if len(allMethods()) < 50 {
		t.Fatalf("only %d methods: the optional modules' methods are missing", len(allMethods()))
	}
}

// TestRewriteNeedsMarkers: a doc without the markers is an error, not a
// silent pass.
func TestRewriteNeedsMarkers(t *testing.T) {
	if _, err := rewrite("no markers", map[string]string{actionsRegion: "x"}); err == nil {
		t.Fatal("rewrite accepted a doc without markers")
	}
}
