package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Plugin is a started plugin, and the driver.Driver that runs command
// kinds through it.
type Plugin struct {
	name string
	inv  *nodev1.Inventory
	log  *slog.Logger
	cg   *Cgroups
	cmd  *exec.Cmd
	// release tells the launcher's fork thread the process is reaped.
	release func()

	stdin  *os.File
	stdout *os.File
	wmu    sync.Mutex

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan Response
	dead    error
	reading bool
	done    chan struct{}

	closeOnce sync.Once
	closeErr  error
}

var _ driver.Driver = (*Plugin)(nil)

// Name is the plugin's configured name (which its handshake repeated).
func (p *Plugin) Name() string { return p.name }

// Inventory is the inventory from the plugin's handshake.
func (p *Plugin) Inventory() *nodev1.Inventory { return p.inv }

// Pid is the plugin's process id (also its process group id).
func (p *Plugin) Pid() int { return p.cmd.Process.Pid }

// Cgroups returns the plugin's cgroups, or nil without them.
func (p *Plugin) Cgroups() *Cgroups { return p.cg }

// Run sends kind and payload (JSON, or empty) to the plugin and waits for
// its answer or ctx. A plugin's error text, cut to MaxErrorText, becomes
// the error. A response over MaxMessage or one that does not decode kills
// the plugin, and this and every waiting Run fail with its code.
func (p *Plugin) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	if len(payload) > 0 && !json.Valid(payload) {
		return nil, refuse(CodePayloadInvalid, nil)
	}
	ch := make(chan Response, 1)
	p.mu.Lock()
	if p.dead != nil {
		err := p.dead
		p.mu.Unlock()
		return nil, err
	}
	p.next++
	id := p.next
	p.pending[id] = ch
	p.mu.Unlock()
	defer p.forget(id)
	line, err := EncodeMessage(Request{ID: id, Kind: kind, Payload: payload})
	if err != nil {
		return nil, err
	}
	if err := p.write(ctx, line); err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			msg := *r.Error
			if len(msg) > MaxErrorText {
				msg = msg[:MaxErrorText]
			}
			return nil, errors.New(msg)
		}
		return r.Result, nil
	case <-p.done:
		return nil, p.deadErr()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (p *Plugin) forget(id uint64) {
	p.mu.Lock()
	delete(p.pending, id)
	p.mu.Unlock()
}

func (p *Plugin) deadErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dead
}

// write writes one line, giving up at ctx's deadline if the plugin stops
// reading.
func (p *Plugin) write(ctx context.Context, line []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		_ = p.stdin.SetWriteDeadline(dl)
	} else {
		_ = p.stdin.SetWriteDeadline(time.Time{})
	}
	if _, err := p.stdin.Write(line); err != nil {
		if d := p.deadErr(); d != nil {
			return d
		}
		return refuse(CodeExited, err)
	}
	return nil
}

// readLoop delivers responses to their Run until the plugin's output ends
// or breaks the protocol, which kills the plugin.
func (p *Plugin) readLoop(lr *LineReader) {
	var err error
	for {
		var line []byte
		if line, err = lr.ReadLine(MaxMessage, CodeMessageTooLarge); err != nil {
			break
		}
		var r Response
		if r, err = DecodeResponse(line); err != nil {
			break
		}
		p.mu.Lock()
		ch := p.pending[r.ID]
		delete(p.pending, r.ID) // a second answer to the same id is dropped
		p.mu.Unlock()
		if ch != nil {
			ch <- r // buffered, and only this reader sends on it
		}
	}
	if CodeOf(err) == "" {
		err = refuse(CodeExited, err)
	} else {
		p.log.Warn("plugin broke the protocol; killing it", "code", CodeOf(err))
	}
	p.mu.Lock()
	if p.dead == nil {
		p.dead = err
	}
	p.mu.Unlock()
	p.kill()
	close(p.done)
}

// kill kills the plugin's process group and everything in its cgroups.
func (p *Plugin) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	if p.cg != nil {
		if err := p.cg.Kill(); err != nil {
			p.log.Warn("plugin cgroup kill failed", "err", err)
		}
	}
}

// Close kills the plugin's process group and cgroups, reaps it and
// removes its cgroups. Runs still waiting fail with CodeClosed.
func (p *Plugin) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		if p.dead == nil {
			p.dead = refuse(CodeClosed, nil)
		}
		reading := p.reading
		p.mu.Unlock()
		p.kill()
		if p.stdin != nil {
			p.stdin.Close()
		}
		if p.stdout != nil {
			p.stdout.Close() // unblocks the reader even if a descendant holds the pipe
		}
		if reading {
			<-p.done
		}
		if p.cmd != nil && p.cmd.Process != nil {
			_ = p.cmd.Wait()
		}
		if p.release != nil {
			p.release() // reaped: its fork thread may go
		}
		if p.cg != nil {
			p.closeErr = p.cg.Remove()
		}
	})
	return p.closeErr
}

var _ io.Closer = (*Plugin)(nil)
