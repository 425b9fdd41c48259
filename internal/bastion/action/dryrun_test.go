package action

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDryRunThenApply: the dry run writes effects in /work and the change
// list shows them while the real folder is unchanged; an undeclared file
// and a deleted effect are not changes; the apply lands exactly the list,
// and a second apply finds no plan.
func TestDryRunThenApply(t *testing.T) {
	requireRunc(t)
	e := newEnv(t, testOpts{})
	e.write(t, "notes.txt", "old\n")
	e.write(t, "gone.txt", "keep me\n")
	e.write(t, "same.txt", "same\n")
	script := `echo new >> notes.txt
mkdir -p sub && echo hi > sub/created.txt
echo sneaky > undeclared.txt
rm gone.txt
cat same.txt > same.txt.tmp && mv same.txt.tmp same.txt
touch /bin/evil 2>/dev/null && echo ROOT-WRITABLE
echo "uid=$(id -u)"
echo to-stderr >&2
exit 3
`
	p := Program{Script: script, Effects: []string{"notes.txt", "sub/created.txt", "gone.txt", "same.txt"}}
	plan, err := e.r.DryRun(context.Background(), e.folder, p)
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{
		{Path: "notes.txt", Op: OpModify, Size: 8, SHA256: sha256Hex([]byte("old\nnew\n"))},
		{Path: "sub/created.txt", Op: OpCreate, Size: 3, SHA256: sha256Hex([]byte("hi\n"))},
	}
	if len(plan.Changes) != len(want) || plan.Changes[0] != want[0] || plan.Changes[1] != want[1] {
		t.Fatalf("changes %+v, want %+v", plan.Changes, want)
	}
	if plan.Digest != Digest(want) || !validPlanID(plan.ID) {
		t.Fatalf("plan %s digest %s", plan.ID, plan.Digest)
	}
	if plan.ExitCode != 3 || plan.Stdout != "uid=65534\n" || plan.Stderr != "to-stderr\n" {
		t.Fatalf("exit %d stdout %q stderr %q", plan.ExitCode, plan.Stdout, plan.Stderr)
	}
	for p, body := range map[string]string{"notes.txt": "old\n", "sub/created.txt": "<absent>", "undeclared.txt": "<absent>", "gone.txt": "keep me\n"} {
		if got := e.read(t, p); got != body {
			t.Fatalf("after the dry run %s = %q, want %q", p, got, body)
		}
	}
	sum, err := e.r.Summary(plan.ID)
	if err != nil || !strings.Contains(sum, `modify "notes.txt" (8 bytes`) || !strings.Contains(sum, plan.Digest) {
		t.Fatalf("summary %q, %v", sum, err)
	}
	got, err := e.r.Apply(context.Background(), e.folder, plan.ID, plan.Digest)
	if err != nil || len(got) != 2 {
		t.Fatalf("apply: %v %v", got, err)
	}
	for p, body := range map[string]string{"notes.txt": "old\nnew\n", "sub/created.txt": "hi\n", "undeclared.txt": "<absent>", "gone.txt": "keep me\n", "same.txt": "same\n"} {
		if got := e.read(t, p); got != body {
			t.Fatalf("after apply %s = %q, want %q", p, got, body)
		}
	}
	// Put the originals back: the plan is spent all the same.
	e.write(t, "notes.txt", "old\n")
	if err := os.Remove(filepath.Join(e.folder, "sub", "created.txt")); err != nil {
		t.Fatal(err)
	}
	_, err = e.r.Apply(context.Background(), e.folder, plan.ID, plan.Digest)
	wantReason(t, err, ReasonUnknownPlan)
	if got := e.read(t, "notes.txt"); got != "old\n" {
		t.Fatalf("a second apply landed notes.txt: %q", got)
	}
	_, err = e.r.Summary(plan.ID)
	wantReason(t, err, ReasonUnknownPlan)
	if left, _ := os.ReadDir(filepath.Join(e.state, "run")); len(left) != 0 {
		t.Fatalf("run folders left: %v", left)
	}
}

// dryRun runs a program that writes out.txt and returns its plan.
func dryRun(t *testing.T, e *testEnv) Plan {
	t.Helper()
	plan, err := e.r.DryRun(context.Background(), e.folder, Program{Script: "echo new > out.txt", Effects: []string{"out.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Changes) != 1 {
		t.Fatalf("changes %+v", plan.Changes)
	}
	return plan
}

// TestApplyWrongDigest: a digest other than the plan's is plan-mismatch,
// lands nothing and leaves the plan for the right digest.
func TestApplyWrongDigest(t *testing.T) {
	requireRunc(t)
	e := newEnv(t, testOpts{})
	e.write(t, "out.txt", "old\n")
	plan := dryRun(t, e)
	other := Digest([]Change{{Path: "out.txt", Op: OpModify, Size: 4, SHA256: sha256Hex([]byte("bad\n"))}})
	_, err := e.r.Apply(context.Background(), e.folder, plan.ID, other)
	wantReason(t, err, ReasonPlanMismatch)
	if got := e.read(t, "out.txt"); got != "old\n" {
		t.Fatalf("out.txt %q after a mismatch", got)
	}
	if _, err := e.r.Apply(context.Background(), e.folder, plan.ID, plan.Digest); err != nil {
		t.Fatalf("apply with the right digest: %v", err)
	}
	if got := e.read(t, "out.txt"); got != "new\n" {
		t.Fatalf("out.txt %q", got)
	}
}

// TestApplyStale: an effect changed (or created) in the folder after the
// dry run makes the apply stale; nothing lands and the plan is spent.
func TestApplyStale(t *testing.T) {
	requireRunc(t)
	for _, c := range []struct{ name, before, after string }{
		{"modified", "old\n", "edited by the person\n"},
		{"created meanwhile", "", "made by the person\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, testOpts{})
			if c.before != "" {
				e.write(t, "out.txt", c.before)
			}
			plan := dryRun(t, e)
			e.write(t, "out.txt", c.after)
			_, err := e.r.Apply(context.Background(), e.folder, plan.ID, plan.Digest)
			wantReason(t, err, ReasonStale)
			if got := e.read(t, "out.txt"); got != c.after {
				t.Fatalf("out.txt %q", got)
			}
			_, err = e.r.Apply(context.Background(), e.folder, plan.ID, plan.Digest)
			wantReason(t, err, ReasonUnknownPlan)
		})
	}
}

// TestDryRunRefusesLinks: an effect that is a link (out of the folder or
// inside it), or under a folder link out of it,, or that the program turns into a link, is
// effect-not-file.
func TestDryRunRefusesLinks(t *testing.T) {
	requireRunc(t)
	e := newEnv(t, testOpts{})
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(e.folder, "link.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(e.folder, "out")); err != nil {
		t.Fatal(err)
	}
	e.write(t, "real.txt", "real\n")
	if err := os.Symlink("real.txt", filepath.Join(e.folder, "alias.txt")); err != nil {
		t.Fatal(err)
	}
	for _, effect := range []string{"link.txt", "out/secret", "alias.txt"} {
		_, err := e.r.DryRun(context.Background(), e.folder, Program{Script: "true", Effects: []string{effect}})
		wantReason(t, err, ReasonEffectNotFile)
	}
	_, err := e.r.DryRun(context.Background(), e.folder, Program{Script: "ln -s /etc/passwd made.txt", Effects: []string{"made.txt"}})
	wantReason(t, err, ReasonEffectNotFile)
}

// TestApplyDoesNotFollowLinkOut: a folder replaced by a link out of the
// shared folder between dry run and apply is not written through.
func TestApplyDoesNotFollowLinkOut(t *testing.T) {
	requireRunc(t)
	e := newEnv(t, testOpts{})
	plan, err := e.r.DryRun(context.Background(), e.folder, Program{Script: "echo x > sub/new.txt", Effects: []string{"sub/new.txt"}})
	if err != nil || len(plan.Changes) != 1 {
		t.Fatalf("%+v %v", plan, err)
	}
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(e.folder, "sub")); err != nil {
		t.Fatal(err)
	}
	_, err = e.r.Apply(context.Background(), e.folder, plan.ID, plan.Digest)
	wantReason(t, err, ReasonEffectNotFile)
	if _, err := os.Stat(filepath.Join(outside, "new.txt")); !os.IsNotExist(err) {
		t.Fatalf("written through the link: %v", err)
	}
}

// TestPlanFilesArePrivate: plan folders are 0700 and their files 0600.
func TestPlanFilesArePrivate(t *testing.T) {
	requireRunc(t)
	e := newEnv(t, testOpts{})
	plan := dryRun(t, e)
	err := filepath.Walk(filepath.Join(e.state, "plans", plan.ID), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if fi.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s is %v, want %v", p, fi.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPlanExpires: a plan past PlanTTL on the injected clock is unknown.
func TestPlanExpires(t *testing.T) {
	requireRunc(t)
	e := newEnv(t, testOpts{})
	plan := dryRun(t, e)
	e.clk.Advance(PlanTTL + 1)
	_, err := e.r.Apply(context.Background(), e.folder, plan.ID, plan.Digest)
	wantReason(t, err, ReasonUnknownPlan)
	if got := e.read(t, "out.txt"); got != "<absent>" {
		t.Fatalf("out.txt %q", got)
	}
}
