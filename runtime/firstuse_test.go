package runtime_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// A backend that takes a while to open (the first use builds and compiles
// the WASM guests: seconds to minutes) is the service's wait, not the
// episodes': their recorded durations and deadlines start once it is open.
func TestEpisodesThatWaitedForTheBackendToOpenDoNotCountTheWait(t *testing.T) {
	const openTime = 1500 * time.Millisecond
	be := wasmtest.Backend(t)
	var openedAt atomic.Int64
	s := startService(t, "", func(o *runtime.Options) {
		o.Backends = runtime.BackendFunc(func(ctx context.Context, name string) (sandbox.Backend, error) {
			if name != "wasm" {
				return nil, fmt.Errorf("no %s here: %w", name, sandbox.ErrEngineUnavailable)
			}
			time.Sleep(openTime) // a first-use build
			openedAt.Store(time.Now().UnixNano())
			return be, nil
		})
	})
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	submitted := time.Now()
	id := s.submit(rolloutBody(p, 2, task("a"), task("b")))
	s.waitState(id, time.Minute, func(st status) bool { return st.State == "done" })
	opened := time.Unix(0, openedAt.Load())
	eps := s.episodes(id, "")
	if len(eps) != 4 {
		t.Fatalf("%d episodes", len(eps))
	}
	if time.Since(submitted) < openTime {
		t.Fatalf("the backend did not take %v to open", openTime)
	}
	for _, e := range eps {
		if e.Stats.DurationMS >= float64(openTime/time.Millisecond) || e.StartedAt.Before(opened) {
			t.Errorf("%s: started %v (the backend opened %v), duration %.0f ms: the wait for the backend counted",
				e.EpisodeID, e.StartedAt.Format(time.StampMilli), opened.Format(time.StampMilli), e.Stats.DurationMS)
		}
	}
}
