package approval

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// helperEnv names the environment that makes TestHelperProcess act.
const helperEnv = "BC_APPROVAL_HELPER"

// TestHelperProcess is the second process: it opens the folder in
// BC_APPROVAL_DIR at the fake time BC_APPROVAL_TIME and, by mode, approves
// request BC_APPROVAL_ID with BC_APPROVAL_CODE ("approve") or takes
// BC_APPROVAL_N runs of a standing grant ("use"), printing what worked.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("only run as a helper process")
	}
	at, err := time.Parse(time.RFC3339Nano, os.Getenv("BC_APPROVAL_TIME"))
	must(t, err)
	s, err := OpenStore(Config{Dir: os.Getenv("BC_APPROVAL_DIR"), Secret: testSecret, BastionID: "bastion-1", Clock: clock.NewFake(at)})
	must(t, err)
	switch mode {
	case "approve":
		if err := s.Approve(os.Getenv("BC_APPROVAL_ID"), os.Getenv("BC_APPROVAL_CODE")); err != nil {
			fmt.Printf("refused %v\n", err)
			return
		}
		fmt.Println("approved")
	case "use":
		n, _ := strconv.Atoi(os.Getenv("BC_APPROVAL_N"))
		ok := 0
		for i := 0; i < n; i++ {
			if _, err := s.UseStanding(moveOp); err == nil {
				ok++
			}
		}
		fmt.Printf("used %d\n", ok)
	}
}

// helper starts the helper process in mode with env and returns it.
func (f *fixture) helper(t *testing.T, mode string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "BC_APPROVAL_DIR="+f.dir,
		"BC_APPROVAL_TIME="+f.clk.Now().Format(time.RFC3339Nano))
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func TestApprovalGivenInAnotherProcess(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	d := digestOf(moveOp, "{}")
	r, err := f.s.Ask(moveOp, d, "move")
	must(t, err)
	wantRefused(t, f.s.Spend(r.ID, moveOp, d), ReasonNotApproved)
	code := f.fresh(t)
	out, err := f.helper(t, "approve", "BC_APPROVAL_ID="+r.ID, "BC_APPROVAL_CODE="+code).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "approved") {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	must(t, f.s.Spend(r.ID, moveOp, d))
	// The code the other process used is spent here too.
	wantRefused(t, f.s.VerifyCode(code), ReasonCodeReused)
}

func TestConcurrentProcessesCountEveryRun(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	const limit, procs, each = 20, 3, 10
	f.grant(t, moveOp, limit, limit)
	cmds := make([]*exec.Cmd, procs)
	outs := make([]strings.Builder, procs)
	for i := range cmds {
		cmds[i] = f.helper(t, "use", "BC_APPROVAL_N="+strconv.Itoa(each))
		cmds[i].Stdout = &outs[i]
		must(t, cmds[i].Start())
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	total := 0
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if _, err := f.open(t).UseStanding(moveOp); err == nil {
					mu.Lock()
					total++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for i, c := range cmds {
		must(t, c.Wait())
		var n int
		if _, err := fmt.Sscanf(outs[i].String(), "used %d", &n); err != nil {
			t.Fatalf("helper %d said %q", i, outs[i].String())
		}
		total += n
	}
	l, err := f.s.ListStanding()
	must(t, err)
	if total != limit || len(l) != 1 || len(l[0].Runs) != limit {
		t.Fatalf("%d runs allowed, %d logged; want %d of %d attempts", total, len(l[0].Runs), limit, (procs+2)*each)
	}
}
