package runtime_test

import (
	"context"
	goruntime "runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
)

// A rollout admitted whole (thousands of episodes at once) opens its WASM
// episodes a few at a time: all at once, thousands of goroutines doing a few
// ms of CPU each went ahead of the one that accepts a /healthz probe, which
// then took seconds during the ramp.
func TestARolloutAdmittedWholeOpensItsEpisodesAFewAtATime(t *testing.T) {
	const n = 256
	var opening, most atomic.Int64
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	s := startService(t, "", func(o *runtime.Options) {
		o.ConfigureEpisode = func(cfg *agent.Config) error {
			create := cfg.NewSandbox
			cfg.NewSandbox = func(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error) {
				now := opening.Add(1)
				defer opening.Add(-1)
				for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
				}
				time.Sleep(5 * time.Millisecond) // an opening that takes a while
				return create(ctx, backend, spec)
			}
			return nil
		}
	})
	id := s.submit(rolloutBody(p, n, task("ramp")))
	st := s.waitState(id, 2*time.Minute, func(st status) bool { return st.EpisodesDone == n })
	t.Logf("%d episodes admitted at once: at most %d opening at once (the bound: %d)", n, most.Load(), runtime.OpeningAtOnce())
	if st.Ends["finished"] != n {
		t.Errorf("ends: %v", st.Ends)
	}
	if got := most.Load(); got > int64(runtime.OpeningAtOnce()) {
		t.Errorf("%d episodes opened at once, want at most %d", got, runtime.OpeningAtOnce())
	}
}

// An episode waiting for its turn to open has no goroutine yet: with
// thousands admitted at once, the episodes parked at the gate were most of
// the service's goroutines (4,064-4,493 of ~5,000 in the bench), each with
// a stack and a descriptor Go keeps for ever once it existed. Here 400
// episodes are admitted at once, each opening 20 ms, and the process's
// goroutines are counted while most still wait. A rollout cancelled then
// ends its waiting episodes (each opens at once, to end, as before).
func TestEpisodesWaitingToOpenHaveNoGoroutine(t *testing.T) {
	const n = 400
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	var opened atomic.Int64
	s := startService(t, "", func(o *runtime.Options) {
		o.ConfigureEpisode = func(cfg *agent.Config) error {
			create := cfg.NewSandbox
			cfg.NewSandbox = func(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error) {
				opened.Add(1)
				time.Sleep(20 * time.Millisecond) // an opening that takes a while
				return create(ctx, backend, spec)
			}
			return nil
		}
	})
	before := goruntime.NumGoroutine()
	id := s.submit(rolloutBody(p, n, task("parked")))
	s.waitRunning(n, time.Minute)
	time.Sleep(200 * time.Millisecond)
	during := goruntime.NumGoroutine()
	t.Logf("%d episodes running (%d opened so far): goroutines %d → %d", n, opened.Load(), before, during)
	if during-before > n/2 {
		t.Errorf("%d more goroutines with %d episodes admitted and %d opened, want fewer than %d: the ones waiting to open have none",
			during-before, n, opened.Load(), n/2)
	}
	t0 := time.Now()
	s.do("DELETE", "/v1/rollouts/"+id, nil, nil)
	st := s.waitState(id, time.Minute, func(st status) bool { return st.EpisodesDone == n })
	t.Logf("cancelled: every episode ended %v after the DELETE (%d opened): %v", time.Since(t0), opened.Load(), st.Ends)
	if st.Ends["cancelled"]+st.Ends["finished"] != n {
		t.Errorf("ends after the cancellation: %v, want every episode cancelled or finished", st.Ends)
	}
}
