package runtime

import (
	"context"
	"runtime/debug"
	"time"

	"github.com/rollbox/rollbox/internal/proc"
)

// idleReclaimAfter is how long the service must have had nothing to run
// before it gives its memory back.
const idleReclaimAfter = 5 * time.Second

// idleRecycleAfter is how long it must have had nothing to run before it
// asks to be executed again (RecyclePolicy.After's default): long enough that a trainer's
// pause between two rollouts (a training step) does not cost the next one
// a new process's first rollout, short enough that the memory is back
// within a minute.
const idleRecycleAfter = 30 * time.Second

// RecyclePolicy is when an idle service asks to be re-executed to give back
// the memory an idle reclaim cannot (RecycleDue): once it has had nothing to
// run for After (default idleRecycleAfter) and no request to answer, and
// its anonymous memory is more than Fraction (or, when Fraction is 0, more
// than Bytes) above what it had when it opened (before any request could
// come: a rollout submitted at once must not be part of the measure).
//
// The Go runtime keeps its high-water marks for the life of a process: a
// descriptor for every goroutine it ever ran at once (a few hundred bytes
// each: thousands of running episodes), span structures and collector
// metadata sized by the peak heap. A rollout of 5,000 episodes leaves a
// process with three to four times the anonymous memory it started with,
// though nothing of the rollout is live; only a new process image gives
// that back.
type RecyclePolicy struct {
	Fraction float64
	Bytes    int64
	After    time.Duration
}

// over reports whether anon is past the policy's bound above start.
func (p *RecyclePolicy) over(anon, start int64) bool {
	if p.Fraction > 0 {
		return float64(anon) > float64(start)*(1+p.Fraction)
	}
	return anon-start > p.Bytes
}

// RecycleDue takes a value when the service, idle, asks to be re-executed
// (Options.Recycle): at most once an idle period. The caller stops taking
// requests, checks Quiescent again (a request answered meanwhile may have
// started work), shuts the service down and executes itself again on the
// same listening socket.
func (s *Server) RecycleDue() <-chan struct{} { return s.recycleDue }

// Quiescent reports whether the service has nothing at all in hand: no
// episode queued, running or being recorded, no environment episode open,
// no request being answered, nothing the index owes, no recovery running,
// nothing dispatched to workers. Shutting it down then loses nothing and
// interrupts nobody.
func (s *Server) Quiescent() bool {
	if s.sched.runningN.Load() > 0 || s.sched.queuedN.Load() > 0 || s.envOpen.Load() > 0 || s.unstartedEnding.Load() > 0 ||
		s.inFlight.Load() > 0 || s.unindexedAny.Load() || s.recoveringAny.Load() {
		return false
	}
	s.mu.Lock()
	opening := s.envOpening
	s.mu.Unlock()
	return opening == 0 && (s.coord == nil || s.coord.dispatched() == 0)
}

// AnonymousMemory is the process's anonymous resident memory now and when
// the service opened, in bytes (0 when /proc cannot be read).
func (s *Server) AnonymousMemory() (now, atStart int64) {
	return proc.StatusBytes("self", "RssAnon:"), s.anonAtStart.Load()
}

// reclaimWhenIdle gives memory back to the system once the service has had
// nothing to run (no episode queued or running, no environment episode
// open, no cancelled episodes' ends being recorded) for idleReclaimAfter,
// until ctx ends; then, with Options.Recycle, it asks to be re-executed
// while quiescent and above the policy's bound.
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
	idleAfter, recycleAfter := idleReclaimAfter, idleRecycleAfter
	if p := s.opts.Recycle; p != nil && p.After > 0 {
		recycleAfter = p.After
		idleAfter = min(idleAfter, recycleAfter) // what can be reclaimed in place is, first
	}
	tick := time.NewTicker(min(time.Second, idleAfter))
	defer tick.Stop()
	// worked: episodes ran or an import was taken since this process
	// started (a service that did nothing is not recycled for the little
	// its first collections and scrapes add); asked: when it last asked.
	busySince, reclaimed, worked, asked := time.Now(), true, false, time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		busied := s.sched.busied.Swap(false)
		if s.worked.Swap(false) || busied {
			worked = true
		}
		if busied || s.sched.runningN.Load() > 0 || s.sched.queuedN.Load() > 0 || s.envOpen.Load() > 0 || s.unstartedEnding.Load() > 0 {
			busySince, reclaimed, worked = time.Now(), false, true
			continue
		}
		if time.Since(busySince) < idleAfter {
			continue
		}
		if !reclaimed {
			reclaimed = true
			start := time.Now()
			forgotten := s.reclaim()
			s.log.Debug("idle: forgot the ended rollouts, closed the policy connections and returned free memory",
				"rollouts", forgotten, "took", time.Since(start))
		}
		// Asked again (a request answered while the caller stopped taking
		// connections makes it serve on) at most once an idle period.
		if p := s.opts.Recycle; p != nil && worked && time.Since(busySince) >= recycleAfter && time.Since(asked) >= recycleAfter && s.Quiescent() {
			if now, atStart := s.AnonymousMemory(); atStart > 0 && p.over(now, atStart) {
				asked = time.Now()
				s.log.Info("idle, with memory a new process image would not hold: asking to be executed again",
					"anonymous_bytes", now, "anonymous_bytes_at_start", atStart)
				select {
				case s.recycleDue <- struct{}{}:
				default:
				}
			}
		}
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
