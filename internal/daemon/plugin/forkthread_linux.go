package plugin

import (
	"runtime"
	"sync"
)

// forkThread starts processes from one OS thread that outlives them.
//
// A plugin is started with Pdeathsig SIGKILL, so that it dies with bcd.
// Linux sends that signal when the thread that forked the process ends,
// not the process, and the Go runtime ends a thread whenever a goroutine
// locked to it (runtime.LockOSThread) returns without unlocking: bcd's
// sandbox host does that on purpose (an overlay mount in another mount
// namespace, a dial inside a sandbox's network namespace). A plugin
// forked from whatever thread its caller's goroutine happened to run on
// could therefore be killed later by unrelated work on that thread. The
// launcher forks from a goroutine that keeps its thread locked while any
// process it started is alive, and unlocks it (the thread goes back to
// the runtime, not away) only when none is.
//
// The zero value is ready; it must not be copied after first use.
type forkThread struct {
	mu   sync.Mutex
	reqs chan func() // to the locked goroutine; nil when none runs
	live int         // processes started there and not yet reaped
}

// start runs fork (which starts one process, an exec.Cmd's Start) on the
// thread, starting the thread's goroutine when none runs. It returns
// fork's error and, when fork succeeded, the release to call once the
// process has been reaped.
func (t *forkThread) start(fork func() error) (release func(), err error) {
	t.mu.Lock()
	if t.live == 0 {
		t.reqs = make(chan func())
		go lockedLoop(t.reqs)
	}
	t.live++
	reqs := t.reqs
	t.mu.Unlock()
	done := make(chan error, 1)
	reqs <- func() { done <- fork() }
	if err := <-done; err != nil {
		t.release()
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(t.release) }, nil
}

// release forgets one process; the last one ends the goroutine.
func (t *forkThread) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.live--
	if t.live == 0 {
		close(t.reqs)
		t.reqs = nil
	}
}

// lockedLoop runs every request on its own locked thread until reqs is
// closed.
func lockedLoop(reqs <-chan func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for f := range reqs {
		f()
	}
}
