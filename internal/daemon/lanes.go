package daemon

import (
	"encoding/json"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// MaxSandboxLanes is how many sandbox lanes one executor runs at once: a
// long sandbox.exec holds one of them, and further lanes wait their turn
// (in the order they asked for one), never dropped. The serial lane does
// not count against it, so a non-sandbox command never waits for sandbox
// commands.
const MaxSandboxLanes = 8

// maxQueued bounds the commands one executor holds, queued or running
// (the session's work channel holds as many again). When it is reached the
// executor stops taking commands from the session until one finishes, so
// a flood of commands pushes back on the session as a busy serial
// executor did, instead of growing memory without bound.
const maxQueued = 64

// serialLane is the lane key of every command that is not a sandbox
// command naming a well-formed sandbox id: those run one at a time, in
// arrival order, as all commands did before lanes.
const serialLane = ""

// sandboxKindPrefix starts every sandbox command kind (kinds.SandboxCreate
// and the others), all of which name their sandbox in the payload's
// sandbox_id.
const sandboxKindPrefix = "sandbox."

// laneKey returns the lane c runs in: the payload's sandbox id for a
// sandbox command, serialLane for anything else, and for a body or
// payload that does not parse or names no valid sandbox id.
//
// It reads the body before it is verified, for scheduling only: the key
// decides which commands run one after another and which side by side,
// never what is verified or run (handle verifies every command as it
// would in any lane). A forged or wrong key can therefore only change the
// order of commands for different lanes; two copies of one command have
// the same bytes and so the same lane.
func laneKey(c *nodev1.SignedCommand) string {
	var body nodev1.CommandBody
	if proto.Unmarshal(c.GetBody(), &body) != nil || !strings.HasPrefix(body.Kind, sandboxKindPrefix) {
		return serialLane
	}
	var p struct {
		SandboxID string `json:"sandbox_id"`
	}
	if json.Unmarshal(body.Payload, &p) != nil || spec.ValidSandboxID(p.SandboxID) != nil {
		return serialLane
	}
	return p.SandboxID
}

// lanes runs one executor's commands: those of one lane one at a time in
// the order submitted, different lanes concurrently, with at most
// MaxSandboxLanes sandbox lanes running at once. A lane has a goroutine
// only while it has commands; it exits when its queue is empty.
type lanes struct {
	run     func(c *nodev1.SignedCommand)
	slots   chan struct{} // one token per running sandbox lane
	pending chan struct{} // one token per command held (maxQueued)

	mu     sync.Mutex
	queues map[string][]*nodev1.SignedCommand // present while the lane's goroutine runs
	wg     sync.WaitGroup
}

// newLanes returns lanes that run each command with run.
func newLanes(run func(c *nodev1.SignedCommand)) *lanes {
	return &lanes{run: run, slots: make(chan struct{}, MaxSandboxLanes), pending: make(chan struct{}, maxQueued),
		queues: map[string][]*nodev1.SignedCommand{}}
}

// submit queues c at the end of lane key, starting the lane's goroutine
// when the lane is idle. It blocks while maxQueued commands are held.
func (l *lanes) submit(key string, c *nodev1.SignedCommand) {
	l.pending <- struct{}{}
	l.mu.Lock()
	q, busy := l.queues[key]
	l.queues[key] = append(q, c)
	l.mu.Unlock()
	if !busy {
		l.wg.Add(1)
		go l.drain(key)
	}
}

// drain runs lane key's commands until its queue is empty, holding a
// sandbox-lane slot throughout (the serial lane needs none). The queue is
// removed under the same lock that finds it empty, so a command submitted
// meanwhile either is taken here or starts a new goroutine.
func (l *lanes) drain(key string) {
	defer l.wg.Done()
	if key != serialLane {
		l.slots <- struct{}{}
		defer func() { <-l.slots }()
	}
	for {
		l.mu.Lock()
		q := l.queues[key]
		if len(q) == 0 {
			delete(l.queues, key)
			l.mu.Unlock()
			return
		}
		c := q[0]
		q[0] = nil
		l.queues[key] = q[1:]
		l.mu.Unlock()
		l.run(c)
		<-l.pending
	}
}

// wait returns once every lane has finished its commands (call it after
// the last submit).
func (l *lanes) wait() { l.wg.Wait() }
