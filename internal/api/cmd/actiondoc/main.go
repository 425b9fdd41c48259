// Command actiondoc writes the generated parts of docs/iam.md: every IAM
// action from the API's method table, the resource kinds, and the
// built-in roles as the migrations define them. Its test fails when the
// file differs from what it would write.
//
//	go run ./internal/api/cmd/actiondoc [-doc docs/iam.md]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
)

func main() {
	doc := flag.String("doc", "docs/iam.md", "the file to rewrite")
	flag.Parse()
	if err := run(context.Background(), *doc); err != nil {
		fmt.Fprintln(os.Stderr, "actiondoc:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, path string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	rs, err := regions(ctx)
	if err != nil {
		return err
	}
	doc, err := rewrite(string(old), rs)
	if err != nil {
		return err
	}
	if doc == string(old) {
		return nil
	}
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
