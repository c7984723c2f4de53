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
// open, no cancelled episodes' ends being recorded) for idleReclaimAfter,
// until ctx ends.
//
// What a rollout of thousands of episodes leaves is mostly not live: the Go
// heap it grew to is garbage once its episodes ended, but the runtime keeps
// the freed spans for reuse (the scavenger returns only what is far above
// the next GC goal) and the policy clients keep their idle connections (a
// read and a write buffer and two goroutines each, up to
// --policy-concurrency per endpoint), and the ended rollouts stay in memory
// for Limits.KeepEnded (each episode's state, context and group): a few
// live objects on many spans, which keeps those spans from being returned.
// So, once idle: the ended rollouts are forgotten (the store has them), the
// idle connections are closed and debug.FreeOSMemory collects and returns
// every free span. The next rollout pays for a few new connections, and a
// read of an ended rollout for its load from the store.
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
		if s.sched.runningN.Load() > 0 || s.sched.queuedN.Load() > 0 || s.envOpen.Load() > 0 || s.unstartedEnding.Load() > 0 {
			busySince, reclaimed = time.Now(), false
			continue
		}
		if reclaimed || time.Since(busySince) < idleReclaimAfter {
			continue
		}
		reclaimed = true
		start := time.Now()
		forgotten := s.reclaim()
		s.log.Debug("idle: forgot the ended rollouts, closed the policy connections and returned free memory",
			"rollouts", forgotten, "took", time.Since(start))
	}
}

// reclaim gives memory back (reclaimWhenIdle) and says how many ended
// rollouts it forgot.
func (s *Server) reclaim() int {
	n := s.forgetEnded()
	s.endpoints.Close()
	debug.FreeOSMemory()
	s.metrics.MemoryReclaims.Inc()
	return n
}

// forgetEnded drops the ended rollouts from memory now rather than after
// Limits.KeepEnded: a read loads one from the store again, and a stream
// still reading one keeps it. While the index owes ends it could not take
// (a full disk), the store is behind memory and nothing is dropped; nor is
// a rollout whose ends are still being recorded.
func (s *Server) forgetEnded() int {
	if s.unindexedAny.Load() {
		return 0
	}
	s.mu.Lock()
	rs := make([]*rollout, 0, len(s.rollouts))
	for _, r := range s.rollouts {
		rs = append(rs, r)
	}
	s.mu.Unlock()
	n := 0
	for _, r := range rs {
		// Ended is every episode's end recorded (EndedAt), not only a
		// final state: a cancelled rollout's queued episodes are still
		// being recorded in the background, the index behind memory.
		r.mu.Lock()
		ended := terminalState(r.rec.State) && r.rec.EndedAt != nil
		r.mu.Unlock()
		if !ended {
			continue
		}
		s.mu.Lock()
		if s.rollouts[r.id] == r {
			delete(s.rollouts, r.id)
			n++
		}
		s.mu.Unlock()
	}
	return n
}
