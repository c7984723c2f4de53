package runtime

import (
	"context"
	"runtime/debug"
	"time"
)

// idleReclaimAfter is how long the service must have had nothing to run
// before it gives its memory back.
const idleReclaimAfter = 5 * time.Second

// reclaimWhenIdle gives memory back to the system once the service has had
// nothing to run (no episode queued or running, no environment episode
// open) for idleReclaimAfter, until ctx ends.
//
// What a rollout of thousands of episodes leaves is mostly not live: the Go
// heap it grew to is garbage once its episodes ended, but the runtime keeps
// the freed spans for reuse (the scavenger returns only what is far above
// the next GC goal) and the policy clients keep their idle connections (a
// read and a write buffer and two goroutines each, up to
// --policy-concurrency per endpoint). So, once idle: the idle connections
// are closed and debug.FreeOSMemory collects and returns every free span.
// The next rollout pays for a few new connections.
func (s *Server) reclaimWhenIdle(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	busySince, reclaimed := time.Now(), true
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if s.sched.runningN.Load() > 0 || s.sched.queuedN.Load() > 0 || s.envOpen.Load() > 0 {
			busySince, reclaimed = time.Now(), false
			continue
		}
		if reclaimed || time.Since(busySince) < idleReclaimAfter {
			continue
		}
		reclaimed = true
		start := time.Now()
		s.endpoints.Close()
		debug.FreeOSMemory()
		s.metrics.MemoryReclaims.Inc()
		s.log.Debug("idle: closed the policy connections and returned free memory", "took", time.Since(start))
	}
}
