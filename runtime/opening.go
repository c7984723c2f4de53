package runtime

import (
	"container/list"
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

// opens hands out the WASM rollout episodes' turns to open (openingAtOnce
// at once), in order. An episode waiting for its turn has no goroutine yet:
// the one that gives a turn back starts the next. With 5,000 episodes
// admitted at once, 4,064-4,493 of the service's ~5,000 goroutines were
// episodes parked at the gate 20-30 s into the rollout, each holding a stack
// and, once it has existed, a goroutine descriptor Go never frees.
type opens struct {
	mu    sync.Mutex
	free  int
	queue list.List // of *pendingOpen
}

type pendingOpen struct {
	run  func(held bool)
	elem *list.Element // nil once started
	stop func() bool   // the context's AfterFunc
}

// start runs run on a goroutine of its own once it has a turn
// (run(true)), or at once without one when ctx ends while it waits
// (run(false): to end).
func (o *opens) start(ctx context.Context, run func(held bool)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.free > 0 && o.queue.Len() == 0 {
		o.free--
		go run(true)
		return
	}
	p := &pendingOpen{run: run}
	p.elem = o.queue.PushBack(p)
	p.stop = context.AfterFunc(ctx, func() {
		o.mu.Lock()
		if p.elem == nil { // started meanwhile
			o.mu.Unlock()
			return
		}
		o.queue.Remove(p.elem)
		p.elem = nil
		o.mu.Unlock()
		go run(false)
	})
}

// release gives a turn back: to the next waiting, started now.
func (o *opens) release() {
	o.mu.Lock()
	if o.queue.Len() == 0 {
		o.free++
		o.mu.Unlock()
		return
	}
	p := o.queue.Remove(o.queue.Front()).(*pendingOpen)
	p.elem = nil
	o.mu.Unlock()
	p.stop()
	go p.run(true)
}

// openGate has the episode cfg configures give its turn to open back
// (release, once) when it has opened or when its first attempt failed (a
// retry's back-off does not hold it); runEpisode releases it at the latest
// when the episode ends. An episode started without a turn (its context
// ended while it waited) opens at once, to end.
func openGate(release func(), cfg *agent.Config) {
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
}
