package devenv

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
)

// What sandboxes in dev need from the machine: a static busybox for the
// default image (Debian's busybox-static) and runc to run it. dev runs on
// the sim runtime without runc and with no sandbox template without
// busybox, so on a fresh Debian machine it installs them first when it
// can (root, apt-get, --install-packages) and otherwise says exactly what
// to run.

// hostFacts is what decides the packages step.
type hostFacts struct {
	busybox bool // a static busybox is installed
	runc    bool // runc is on PATH
	root    bool
	apt     bool // apt-get is on PATH
	install bool // --install-packages
}

// packagePlan is what dev does about missing packages: install them
// (apt-get install -y with these names), or only say hint.
type packagePlan struct {
	install []string
	hint    string
}

// planPackages decides the packages step from the facts.
func planPackages(f hostFacts) packagePlan {
	var missing []string
	if !f.busybox {
		missing = append(missing, "busybox-static")
	}
	if !f.runc {
		missing = append(missing, "runc")
	}
	if len(missing) == 0 {
		return packagePlan{}
	}
	cmd := "apt-get install -y " + strings.Join(missing, " ")
	switch {
	case f.root && f.apt && f.install:
		return packagePlan{install: missing}
	case !f.apt:
		return packagePlan{hint: "Sandboxes need " + strings.Join(missing, " and ") + " (a static busybox for the default image, runc to run it); install them and start dev again.\n"}
	case !f.root:
		return packagePlan{hint: "Sandboxes need packages this machine lacks: run `sudo " + cmd + "` and start dev again (as root, dev installs them itself).\n"}
	default:
		return packagePlan{hint: "Sandboxes need packages this machine lacks: run `" + cmd + "` and start dev again (--install-packages=false kept dev from installing them).\n"}
	}
}

// currentFacts reads the facts of this machine.
func currentFacts(install bool) hostFacts {
	_, bbErr := imagetar.BusyboxPath()
	_, runcErr := exec.LookPath("runc")
	_, aptErr := exec.LookPath("apt-get")
	return hostFacts{busybox: bbErr == nil, runc: runcErr == nil, root: os.Geteuid() == 0, apt: aptErr == nil, install: install}
}

// ensurePackages installs what sandboxes need when the plan says so,
// showing apt-get's progress on progress, and returns what dev should
// tell the user ("" when nothing is missing any more).
func ensurePackages(ctx context.Context, install bool, progress io.Writer) string {
	p := planPackages(currentFacts(install))
	if len(p.install) == 0 {
		return p.hint
	}
	fmt.Fprintf(progress, "Installing %s for sandboxes (apt-get; --install-packages=false skips this)...\n", strings.Join(p.install, " "))
	if err := aptInstall(ctx, p.install, progress); err != nil {
		return "Installing " + strings.Join(p.install, " ") + " failed (" + err.Error() + "): run `apt-get update && apt-get install -y " +
			strings.Join(p.install, " ") + "` and start dev again.\n"
	}
	return planPackages(currentFacts(false)).hint
}

// aptInstall runs apt-get install -y names, non-interactively, with its
// output on progress; a missing package list is fetched once first.
func aptInstall(ctx context.Context, names []string, progress io.Writer) error {
	run := func(args ...string) error {
		c := exec.CommandContext(ctx, "apt-get", args...)
		c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		c.Stdout, c.Stderr = progress, progress
		return c.Run()
	}
	args := append([]string{"install", "-y", "--no-install-recommends"}, names...)
	if err := run(args...); err == nil {
		return nil
	}
	if err := run("update"); err != nil {
		return fmt.Errorf("apt-get update: %w", err)
	}
	if err := run(args...); err != nil {
		return fmt.Errorf("apt-get install: %w", err)
	}
	return nil
}
