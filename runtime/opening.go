package runtime

import (
	"context"
	goruntime "runtime"
	"sync"

	"github.com/rollbox/rollbox/agent"
)

// openingAtOnce bounds the WASM rollout episodes opening (sandbox, files,
// journal: agent.Open) at once. Docker's and containerd's openings wait on
// their engines, not the CPU, and have their own bounds.
//
// A rollout of 5,000 episodes admitted at once started 5,000 goroutines in
// one loop, each opening its episode (a few ms of CPU) before it first
// waits. Every new goroutine takes the head of its processor's run queue,
// so the goroutine that accepts a /healthz probe, readied by its timer, was
// pushed behind thousands of openings: probes took 1.4-8.5 s during the ramp
// (at most ~0.2 s at the peak). Gated, the openings wait on a channel (a
// few µs each) and run a few at a time, which on a CPU-bound host takes no
// longer in all.
func openingAtOnce() int { return max(4, 2*goruntime.GOMAXPROCS(0)) }

// openGate waits for a turn to open the episode cfg configures, and gives
// it back when the episode has opened, when its first attempt failed (a
// retry's back-off does not hold it) or at the latest when release is
// called. A context that ends while it waits opens at once (to end).
func (s *Server) openGate(ctx context.Context, cfg *agent.Config) (release func()) {
	select {
	case s.opening <- struct{}{}:
	case <-ctx.Done():
		return func() {}
	}
	var once sync.Once
	release = func() { once.Do(func() { <-s.opening }) }
	onOpen, onRetry := cfg.OnOpen, cfg.Retry.OnRetry
	cfg.OnOpen = func(sess *agent.Session) {
		release()
		if onOpen != nil {
			onOpen(sess)
		}
	}
	cfg.Retry.OnRetry = func(attempt int, err *agent.OpenError) {
		release()
		if onRetry != nil {
			onRetry(attempt, err)
		}
	}
	return release
}
