package hostops

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// Rebooter reboots the host: the hardware edge of Reboot. reason is
// already cleaned (CleanReason).
type Rebooter interface {
	Reboot(ctx context.Context, reason string) error
}

// CleanReason makes a reboot reason safe to hand to a program and to
// log: invalid UTF-8 dropped, control and format characters (newlines,
// escapes, bidi overrides) dropped, then cut to at most
// helperwire.MaxRebootReason bytes on a character boundary.
func CleanReason(reason string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(reason, "") {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			continue
		}
		if b.Len()+utf8.RuneLen(r) > helperwire.MaxRebootReason {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Reboot reboots the host through o.Rebooter with the cleaned reason. No
// rebooter configured is CodeFailed.
func (o *Ops) Reboot(ctx context.Context, reason string) error {
	if o.Rebooter == nil {
		return refuse(helperwire.CodeFailed, "no rebooter on this host")
	}
	if err := o.Rebooter.Reboot(ctx, CleanReason(reason)); err != nil {
		return fmt.Errorf("hostops: reboot: %w", err)
	}
	return nil
}

// DefaultSystemctl is the systemctl SystemctlRebooter runs.
const DefaultSystemctl = "/usr/bin/systemctl"

// SystemctlRebooter reboots with systemctl reboot --message=<reason>: a
// fixed argv, the reason one argument after "--message=", so it can never
// be read as an option.
type SystemctlRebooter struct {
	// Systemctl is the binary; "" means DefaultSystemctl.
	Systemctl string
}

// Reboot asks systemd to reboot, logging reason as why.
func (r SystemctlRebooter) Reboot(ctx context.Context, reason string) error {
	bin := r.Systemctl
	if bin == "" {
		bin = DefaultSystemctl
	}
	cmd := exec.CommandContext(ctx, bin, "reboot", "--message="+reason)
	cmd.Env = []string{}
	if out, err := cmd.CombinedOutput(); err != nil {
		first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return fmt.Errorf("hostops: systemctl reboot: %w: %.200s", err, first)
	}
	return nil
}
