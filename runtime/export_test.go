package runtime

import (
	goruntime "runtime"
	"weak"
)

// HoldRecovery makes the Server opened with o wait for gate to close before
// it recovers what a previous process left (tests of the "recovering" state).
func HoldRecovery(o *Options, gate chan struct{}) { o.recoveryGate = gate }

// ClaimWaits makes the coordinator opened with o answer "wait" to a claim
// of an episode f says yes to, as for one it does not hold (a restarting
// coordinator, an episode ending now).
func ClaimWaits(o *ClusterOptions, f func(episodeID string) bool) { o.claimWaits = f }

// Reclaim is what an idle service does to give memory back.
func (s *Server) Reclaim() { s.reclaim() }

// RolloutsInMemory counts the rollouts the service holds in memory.
func (s *Server) RolloutsInMemory() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rollouts)
}

// RolloutHeld reports, after collecting garbage, whether the rollout id
// the service has in memory now is still reachable later (nothing holds a
// forgotten rollout).
func (s *Server) RolloutHeld(id string) func() bool {
	s.mu.Lock()
	w := weak.Make(s.rollouts[id])
	s.mu.Unlock()
	return func() bool {
		goruntime.GC()
		goruntime.GC()
		return w.Value() != nil
	}
}

// OpeningAtOnce is how many WASM rollout episodes open at once.
func OpeningAtOnce() int { return openingAtOnce() }

// ImportsRunning counts the imports holding a slot (--max-imports) now.
func (s *Server) ImportsRunning() int { return len(s.importSlots) }

// Over is over, for the tests.
func (p *RecyclePolicy) Over(anon, start int64) bool { return p.over(anon, start) }
