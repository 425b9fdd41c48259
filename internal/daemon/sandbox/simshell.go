package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
)

// Shell starts a simulated shell in a simulated sandbox: it reads lines
// and answers `echo ...`, `stty size`, `sleep` (until killed) and `exit
// N` from memory, prompting "$ "; anything else is not found. The
// terminal's size starts at 80x24. Everything around it (the ticket, the
// stream, the re-decisions) is the real code.
func (s *Sim) Shell(ctx context.Context, id string, argv, _ []string, _ bool) (driver.Shell, error) {
	s.mu.Lock()
	_, ok := s.sbx[id]
	s.mu.Unlock()
	if !ok {
		return nil, driver.ErrSandboxGone
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sh := &simShell{in: inW, out: outR, cols: 80, rows: 24, done: make(chan struct{}), sim: s}
	s.shellStarted()
	go func() { <-ctx.Done(); sh.Close() }()
	go sh.run(inR, outW, argv)
	return sh, nil
}

// simShell is one simulated interactive process.
type simShell struct {
	in  *io.PipeWriter
	out *io.PipeReader
	sim *Sim

	mu         sync.Mutex
	cols, rows uint16
	code       int
	done       chan struct{}
	once       sync.Once
}

func (sh *simShell) run(in *io.PipeReader, out *io.PipeWriter, argv []string) {
	defer sh.finish(out)
	if argv[0] != "sh" && argv[0] != "/bin/sh" {
		fmt.Fprintf(out, "sim: %s: not found\r\n", argv[0])
		sh.setCode(127)
		return
	}
	sc := bufio.NewScanner(in)
	for {
		if _, err := io.WriteString(out, "$ "); err != nil {
			return
		}
		if !sc.Scan() {
			sh.setCode(129) // the terminal went away: SIGHUP
			return
		}
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0:
		case f[0] == "echo":
			fmt.Fprintf(out, "%s\r\n", strings.Join(f[1:], " "))
		case len(f) == 2 && f[0] == "stty" && f[1] == "size":
			sh.mu.Lock()
			fmt.Fprintf(out, "%d %d\r\n", sh.rows, sh.cols)
			sh.mu.Unlock()
		case f[0] == "sleep":
			<-sh.done
			return
		case f[0] == "exit":
			code := 0
			if len(f) > 1 {
				code, _ = strconv.Atoi(f[1])
			}
			sh.setCode(code)
			return
		default:
			fmt.Fprintf(out, "sim: %s: not found\r\n", f[0])
		}
	}
}

func (sh *simShell) setCode(c int) {
	sh.mu.Lock()
	sh.code = c
	sh.mu.Unlock()
}

// finish ends the process: its output closes and Wait returns.
func (sh *simShell) finish(out *io.PipeWriter) {
	_ = out.Close()
	sh.once.Do(func() { close(sh.done); sh.sim.shellEnded() })
}

func (sh *simShell) Read(p []byte) (int, error)  { return sh.out.Read(p) }
func (sh *simShell) Write(p []byte) (int, error) { return sh.in.Write(p) }

// Resize sets the simulated terminal's size.
func (sh *simShell) Resize(cols, rows uint16) error {
	sh.mu.Lock()
	sh.cols, sh.rows = cols, rows
	sh.mu.Unlock()
	return nil
}

// Wait returns the exit status once the process ended.
func (sh *simShell) Wait() (int, error) {
	<-sh.done
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.code, nil
}

// Close kills the process (SIGKILL's 137 unless it had ended).
func (sh *simShell) Close() error {
	sh.once.Do(func() {
		sh.setCode(137)
		close(sh.done)
		sh.sim.shellEnded()
	})
	_ = sh.in.Close()
	_ = sh.out.Close()
	return nil
}
