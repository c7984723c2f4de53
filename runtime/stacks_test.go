package runtime_test

import (
	"context"
	goruntime "runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

// Thousands of episodes wait in their tools at once (for one of the WASM
// backend's helpers), each on a goroutine of its own whose stack Go sizes
// by the deepest point it ever reached and halves only when a GC finds it
// three quarters unused. Encoding a policy request (openai-go's nested
// MarshalJSON) on the episode's goroutine grew every stack to 32-64 KB, and
// the frames on the path to the tool (a trajectory.Step and its copies in
// the agent, the audit record) kept a waiting episode's stack at 32 KB: with
// 5,000 episodes, 329 MB of stacks at the peak, and as much again in heap
// the GC allowed for them. Here 256 episodes wait in their tools, and their
// goroutines' stacks are measured.
func TestEpisodesWaitingInTheirToolsHoldSmallStacks(t *testing.T) {
	const n = 256
	be, err := wasm.New(context.Background(), wasm.Options{MaxShells: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	var calls atomic.Int64
	p := startPolicy(t, fakepolicy.Config{Responder: func(req *fakepolicy.Request) fakepolicy.Reply {
		calls.Add(1)
		command := `{"command":"true"}`
		if req.AssistantTurns() > 0 {
			command = `{"command":"sleep 60"}` // holds the only helper: everyone else waits
		}
		return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: command}}}
	}})
	s := startService(t, "", func(o *runtime.Options) {
		o.Backends = runtime.BackendFunc(func(context.Context, string) (sandbox.Backend, error) { return be, nil })
		o.Limits.PolicyConcurrency = 4 // few connections: their goroutines are not the episodes'
	})
	before := stackUse()
	id := s.submit(rolloutBody(p, n, task("wait")))
	s.waitRunning(n, time.Minute)
	deadline := time.Now().Add(time.Minute)
	for calls.Load() < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second) // every episode reaches its tool
	if got := calls.Load(); got < n {
		t.Fatalf("%d policy calls after a minute, want every one of the %d episodes to have asked", got, n)
	}
	after := stackUse()
	perEpisode := float64(after.stacks-before.stacks) / n
	t.Logf("%d episodes waiting in their tools: stacks %.1f → %.1f MiB, %d → %d goroutines: %.1f KiB of stack an episode",
		n, mib(before.stacks), mib(after.stacks), before.goroutines, after.goroutines, perEpisode/1024)
	if perEpisode > 24<<10 {
		t.Errorf("%.1f KiB of stack an episode waiting in its tool, want at most 24 KiB (16 KiB stacks)", perEpisode/1024)
	}
	s.do("DELETE", "/v1/rollouts/"+id, nil, nil)
	s.waitState(id, time.Minute, func(st status) bool { return st.EpisodesDone == n })
}

type stacks struct {
	stacks     uint64
	goroutines int
}

// stackUse is the process's goroutine stacks in use after two collections
// (the first shrinks what it can, the second frees what the first freed).
func stackUse() stacks {
	goruntime.GC()
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return stacks{ms.StackInuse, goruntime.NumGoroutine()}
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }
