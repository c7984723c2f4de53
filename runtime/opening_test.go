package runtime_test

import (
	"context"
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
