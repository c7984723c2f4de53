package runtime_test

import (
	"context"
	"os"
	goruntime "runtime"
	"runtime/pprof"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// heldPolicy holds every episode before it asks for turn at (its earlier
// turns answered by the rollout's own policy) until release is closed, and
// counts the episodes it holds.
type heldPolicy struct {
	inner   agent.Policy
	at      int
	held    *atomic.Int64
	release *chan struct{}
}

func (p heldPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	if req.Turn == p.at {
		p.held.Add(1)
		select {
		case <-*p.release:
		case <-ctx.Done():
			return agent.Turn{}, context.Cause(ctx)
		}
	}
	return p.inner.Next(ctx, req)
}

// What a running episode holds in the heap: with thousands running at once
// it is the service's peak heap, and the Go runtime's own memory (span
// structures, GC metadata) is sized by that peak and kept after the rollout
// ends. Here 256 episodes of the bench's kind (bash `true` a turn) are held
// after 9 turns, and the live heap they add is measured; then, once they
// end and the service reclaims, what is still live (a leak would be).
func TestARunningEpisodeHoldsLittleHeap(t *testing.T) {
	const n, turns = 256, 9
	if os.Getenv("ROLLBOX_HEAP_PROFILE") != "" {
		defer func(r int) { goruntime.MemProfileRate = r }(goruntime.MemProfileRate)
		goruntime.MemProfileRate = 64
	}
	var held atomic.Int64
	release := make(chan struct{})
	p := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(turns)})
	s := startService(t, "", func(o *runtime.Options) {
		o.Limits.PolicyConcurrency = 16 // few connections: theirs is not the episodes' memory
		o.ConfigureEpisode = func(cfg *agent.Config) error {
			cfg.Policy = heldPolicy{inner: cfg.Policy, at: turns, held: &held, release: &release}
			return nil
		}
	})
	body := rolloutBody(p, 16)
	var tasks []any
	for i := range n / 16 {
		tk := task(string(rune('a'+i)) + "-heap")
		tk["limits"] = map[string]any{"max_turns": turns + 2}
		tasks = append(tasks, tk)
	}
	body["tasks"], body["schedule"] = tasks, "episodes"
	// A first rollout of the same shape, not held, warms what every
	// rollout shares (the backend's helpers, the policy's connections, the
	// index, the encoders' caches): what the second leaves is its own.
	close(release)
	warm := s.submit(body)
	s.waitState(warm, 2*time.Minute, func(st status) bool { return st.EpisodesDone == n })
	release = make(chan struct{})
	held.Store(0)
	s.srv.Reclaim()
	before := heapUse()

	id := s.submit(body)
	for deadline := time.Now().Add(2 * time.Minute); held.Load() < n && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := held.Load(); got < n {
		t.Fatalf("%d of %d episodes reached turn %d in 2 minutes", got, n, turns)
	}
	time.Sleep(200 * time.Millisecond) // the last turn's record and the policy's goroutines settle
	during := heapUse()
	writeHeapProfile("")
	perEpisode := float64(during-before) / n
	close(release)
	s.waitState(id, 2*time.Minute, func(st status) bool { return st.EpisodesDone == n })
	s.srv.Reclaim()
	after := heapUse()
	writeHeapProfile(".after")
	t.Logf("%d episodes held after %d turns: live heap %.2f → %.2f MiB: %.1f KiB an episode; after they ended and an idle reclaim: %.2f MiB (%+.0f B an episode)",
		n, turns, mib(before), mib(during), perEpisode/1024, mib(after), float64(int64(after)-int64(before))/n)
	if perEpisode > maxHeapPerEpisode {
		t.Errorf("a running episode holds %.1f KiB of heap after %d turns, want at most %.1f KiB", perEpisode/1024, turns, maxHeapPerEpisode/1024)
	}
	// The bound leaves room for what the package's other tests' services
	// do meanwhile in this process (timers that forget their rollouts);
	// an ended episode's state kept whole would be several times over it.
	if leaked := float64(int64(after)-int64(before)) / n; leaked > 4096 {
		t.Errorf("after its rollout ended and an idle reclaim, %.0f B of heap an episode is still live, want at most 4 KiB", leaked)
	}
}

// maxHeapPerEpisode bounds the live heap a running episode holds after 9
// turns of bash `true`.
const maxHeapPerEpisode = 32 * 1024.0

// heapUse is the live heap after two collections.
func heapUse() uint64 {
	goruntime.GC()
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// writeHeapProfile writes the heap's profile to $ROLLBOX_HEAP_PROFILE
// (with suffix), when set: where the bytes an episode holds come from.
func writeHeapProfile(suffix string) {
	if f := os.Getenv("ROLLBOX_HEAP_PROFILE"); f != "" {
		if out, err := os.Create(f + suffix); err == nil {
			pprof.Lookup("heap").WriteTo(out, 0)
			out.Close()
		}
	}
}
