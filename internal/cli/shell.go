package cli

import (
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/clisafe"
)

// runShell runs argv on a terminal in sandbox id (sandbox exec -it): a
// terminal on standard input goes to raw mode for the program's life and
// its size follows (SIGWINCH); the program's output goes out unfiltered
// (it is the sandbox's terminal, as with ssh); the exit status is the
// program's, or 125 when the tunnel failed or was closed.
func runShell(cmd *cobra.Command, cl *client.Client, id string, argv []string) error {
	ctx := contextOf(cmd)
	t, err := cl.OpenShell(ctx, id, argv)
	if err != nil {
		return apiErr(err)
	}
	defer t.Close()
	in := cmd.InOrStdin()
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fd := int(f.Fd())
		if old, err := term.MakeRaw(fd); err == nil {
			defer func() { _ = term.Restore(fd, old) }()
		}
		resize := func() {
			if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 && w <= 0xffff && h <= 0xffff {
				_ = t.Resize(uint16(w), uint16(h))
			}
		}
		resize()
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				resize()
			}
		}()
	}
	go func() { _, _ = io.Copy(t, in) }()
	if _, err := io.Copy(clisafe.Raw(cmd.OutOrStdout()), t); err != nil {
		return apiErr(err)
	}
	if err := t.Wait(); err != nil {
		return apiErr(err)
	}
	code, ok := t.ExitCode()
	if !ok {
		return errors.New("the program's exit status did not arrive")
	}
	if code != 0 {
		return &programExit{code: code}
	}
	return nil
}
