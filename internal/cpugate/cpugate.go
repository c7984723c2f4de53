// Package cpugate bounds the goroutines doing CPU-bound work at once.
//
// Go's scheduler has no priorities: a goroutine readied by the network
// poller (a /healthz probe's connection) waits in the run queues behind
// every goroutine that is runnable, and the global queue, where the poller
// puts what it readies while every processor is busy, is looked at only
// every 61 schedule ticks. When thousands of episodes are woken at once (an
// audit log's group commit answering hundreds of appends, a wave of policy
// answers) and each then does a millisecond or more of work (recording a
// step, encoding the next request), a probe waits hundreds of milliseconds
// on 2 cores. Behind a Gate, such work waits parked in the gate's queue
// instead: it runs a few at a time and the run queues stay short, so what
// the poller readies runs soon.
//
// A Hold is one piece of work's place (an episode's, whichever goroutine
// runs it at the moment): Enter waits for a turn, Leave gives it back, and
// Outside runs a wait (a sandbox call, an HTTP round trip, an fsync) with
// the turn given back for its length. Turns are given in arrival order; a
// holder never waits on anything that needs a turn (that is what Outside
// is for), so every turn comes back and no one waits for ever. A context
// that ends while its holder waits lets it go at once, without a turn.
// Every method is a no-op on a nil Gate or Hold.
package cpugate

import (
	"context"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Gate is a bound on the holders doing CPU-bound work at once.
type Gate struct {
	turns chan struct{}
	// waitNS and waits sum the waits for a turn (Stats).
	waitNS, waits atomic.Int64
	waiting       atomic.Int64
}

// New makes a gate of n turns at once.
func New(n int) *Gate { return &Gate{turns: make(chan struct{}, max(n, 1))} }

// Size is the gate size the service uses: 4 turns per processor Go runs
// goroutines on (GOMAXPROCS). More turns than processors: a holder in a
// system call (a journal's write) or descheduled by a busy host keeps its
// turn meanwhile, and with one turn per processor the service's throughput
// fell to a fraction (5,000 episodes on 2 cores: a turn's overhead p50
// 0.32 -> 2.25 s).
func Size() int { return 4 * goruntime.GOMAXPROCS(0) }

// Stats is what a gate's waits came to.
type Stats struct {
	// Waits is how many times a holder waited for a turn, Wait the time
	// they waited in all, Waiting how many wait now.
	Waits   int64
	Wait    time.Duration
	Waiting int64
}

// Stats says how much holders waited.
func (g *Gate) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	return Stats{Waits: g.waits.Load(), Wait: time.Duration(g.waitNS.Load()), Waiting: g.waiting.Load()}
}

// Hold makes a holder's place, not holding a turn.
func (g *Gate) Hold() *Hold {
	if g == nil {
		return nil
	}
	return &Hold{g: g}
}

// Hold is one holder's place at a gate. Its methods may be called from the
// goroutines that take turns running its work, one at a time or not.
type Hold struct {
	g    *Gate
	mu   sync.Mutex
	held bool
	// waited is the time this holder waited for turns in all.
	waited time.Duration
}

// Enter waits for a turn unless the hold has one. It returns false, at
// once and without a turn, when ctx ends first.
func (h *Hold) Enter(ctx context.Context) bool {
	if h == nil {
		return true
	}
	h.mu.Lock()
	held := h.held
	h.mu.Unlock()
	if held {
		return true
	}
	var waited time.Duration
	select {
	case h.g.turns <- struct{}{}:
	default:
		start := time.Now()
		h.g.waiting.Add(1)
		select {
		case h.g.turns <- struct{}{}:
		case <-ctx.Done():
			h.g.waiting.Add(-1)
			return false
		}
		h.g.waiting.Add(-1)
		waited = time.Since(start)
		h.g.waits.Add(1)
		h.g.waitNS.Add(int64(waited))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waited += waited
	if h.held { // another goroutine of this holder entered meanwhile
		<-h.g.turns
		return true
	}
	h.held = true
	return true
}

// Leave gives the hold's turn back, if it has one.
func (h *Hold) Leave() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held {
		h.held = false
		<-h.g.turns
	}
}

// Held says whether the hold has a turn.
func (h *Hold) Held() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

// Waited is the time this holder waited for turns in all.
func (h *Hold) Waited() time.Duration {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waited
}

// Outside runs wait with the hold's turn given back, and, if it had one,
// waits for a turn again after (unless ctx has ended).
func (h *Hold) Outside(ctx context.Context, wait func()) {
	if h == nil || !h.Held() {
		wait()
		return
	}
	h.Leave()
	defer h.Enter(ctx)
	wait()
}

type holdKey struct{}

// WithHold gives h to the calls made with the context it returns.
func WithHold(ctx context.Context, h *Hold) context.Context {
	if h == nil {
		return ctx
	}
	return context.WithValue(ctx, holdKey{}, h)
}

// HoldOf is the hold ctx carries (WithHold), nil when none.
func HoldOf(ctx context.Context) *Hold {
	h, _ := ctx.Value(holdKey{}).(*Hold)
	return h
}
