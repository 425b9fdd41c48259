package terminal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
)

// run starts the command, watches the grant and ctx while it runs, and
// records its end.
func (r *rootRun) run(ctx context.Context) (Result, error) {
	cmd, pr, err := r.start()
	if err != nil {
		r.t.audit(KindRootRefuse, EventSetupFailed, "argv "+r.words)
		return Result{}, err
	}
	pid := cmd.Process.Pid
	r.t.audit(KindRootRun, EventStart, "argv "+r.words+" pid "+strconv.Itoa(pid)+" transcript "+r.tr.name)
	r.t.log.Info("terminal: root command started", "pid", pid)
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		if err := r.out.copy(pr, r.tr); err != nil {
			cancel(err)
		}
	}()
	waited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(waited)
	}()
	stopped := r.watch(runCtx, waited)
	if stopped != "" || runCtx.Err() != nil {
		killGroup(pid)
		_ = cmd.Process.Kill()
	}
	<-waited
	killGroup(pid) // what it left in its group holds the pipe
	r.drain(copied, pr)
	res := Result{ExitCode: cmd.ProcessState.ExitCode(), Output: r.out.String(), Stopped: stopped}
	return res, r.finish(ctx, res, context.Cause(runCtx))
}

// watch waits for the command to end, re-reading the grant every
// WatchInterval and at its end; it returns why the grant stopped holding,
// or "" when the command ended or ctx did first.
func (r *rootRun) watch(ctx context.Context, waited <-chan struct{}) string {
	tick := r.t.clock.NewTicker(WatchInterval)
	defer tick.Stop()
	_, until := grantState(r.grant, r.t.clock.Now())
	end := r.t.clock.NewTimer(until.Sub(r.t.clock.Now()))
	defer end.Stop()
	for {
		select {
		case <-waited:
			return ""
		case <-ctx.Done():
			return ""
		case <-tick.C():
		case <-end.C():
		}
		now := r.t.clock.Now()
		why, u := grantState(r.grant, now)
		if why != "" {
			return why
		}
		if !u.Equal(until) {
			until = u
			end.Reset(until.Sub(now))
		}
	}
}

// drain waits for the output copier, at most drainGrace, then closes the
// pipe so that a process outside the group holding it cannot keep it.
func (r *rootRun) drain(copied <-chan struct{}, pr *os.File) {
	timer := r.t.clock.NewTimer(drainGrace)
	defer timer.Stop()
	select {
	case <-copied:
	case <-timer.C():
	}
	pr.Close()
	<-copied
}

// finish writes the transcript's end and the audit, and returns the error
// RunRoot returns: the transcript's failure, or ctx's end.
func (r *rootRun) finish(ctx context.Context, res Result, cause error) error {
	end := fmt.Sprintf("exit %d stopped %q output %d bytes", res.ExitCode, res.Stopped, r.out.total)
	terr := r.tr.line(r.t.clock.Now(), "end "+end)
	reason := EventEnd
	if res.Stopped != "" {
		reason = res.Stopped
	}
	r.t.audit(KindRootRun, reason, "argv "+r.words+" "+end)
	r.t.log.Info("terminal: root command ended", "exit", res.ExitCode, "stopped", res.Stopped)
	switch {
	case errors.Is(cause, errTranscript):
		return cause
	case terr != nil:
		return fmt.Errorf("%w: %w", errTranscript, terr)
	case ctx.Err() != nil:
		return fmt.Errorf("terminal: root command: %w", ctx.Err())
	}
	return nil
}

// capture keeps the first MaxOutput bytes of a command's output.
type capture struct {
	mu    sync.Mutex
	buf   []byte
	total int64
}

// copy reads r to its end into the transcript (all of it) and the capture
// (up to MaxOutput); a transcript failure stops the copy and is returned.
func (c *capture) copy(r *os.File, tr *transcript) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if terr := tr.write(buf[:n]); terr != nil {
				return fmt.Errorf("%w: %w", errTranscript, terr)
			}
			c.mu.Lock()
			c.total += int64(n)
			if room := MaxOutput - len(c.buf); room > 0 {
				c.buf = append(c.buf, buf[:min(n, room)]...)
			}
			c.mu.Unlock()
		}
		if err != nil {
			return nil
		}
	}
}

// String is the captured output, with TruncatedNote when some was cut.
func (c *capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.total > int64(len(c.buf)) {
		return string(c.buf) + TruncatedNote
	}
	return string(c.buf)
}
