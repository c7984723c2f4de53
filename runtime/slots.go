package runtime

import (
	"context"
	"sync"
)

// slotPool bounds the episodes of a batch (rollbox run) running at once,
// sub-agents included (agent.Slots): a sub-agent, or an orchestrator going
// on after its sub-agents, is served before an episode still waiting to
// start, so an orchestrator's children get the slots their waiting parent
// gave back.
type slotPool struct {
	mu   sync.Mutex
	free int
	// first are the priority waiters (sub-agents, orchestrators going on),
	// later the episodes waiting to start; each is served in order.
	first, later []chan struct{}
}

func newSlotPool(n int) *slotPool { return &slotPool{free: n} }

// acquire waits for a slot; prio puts the caller before every episode
// waiting to start.
func (p *slotPool) acquire(ctx context.Context, prio bool) error {
	p.mu.Lock()
	if p.free > 0 && len(p.first) == 0 && (prio || len(p.later) == 0) {
		p.free--
		p.mu.Unlock()
		return nil
	}
	ch := make(chan struct{}, 1)
	if prio {
		p.first = append(p.first, ch)
	} else {
		p.later = append(p.later, ch)
	}
	p.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		defer p.mu.Unlock()
		if removeWaiter(&p.first, ch) || removeWaiter(&p.later, ch) {
			return ctx.Err()
		}
		// Granted as the context ended: give it on.
		p.releaseLocked()
		return ctx.Err()
	}
}

func removeWaiter(q *[]chan struct{}, ch chan struct{}) bool {
	for i, c := range *q {
		if c == ch {
			*q = append((*q)[:i], (*q)[i+1:]...)
			return true
		}
	}
	return false
}

func (p *slotPool) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked()
}

func (p *slotPool) releaseLocked() {
	for _, q := range []*[]chan struct{}{&p.first, &p.later} {
		if len(*q) > 0 {
			ch := (*q)[0]
			*q = (*q)[1:]
			ch <- struct{}{}
			return
		}
	}
	p.free++
}

// subagentSlots is the pool as agent.Slots: every acquire is a priority one.
type subagentSlots struct{ p *slotPool }

func (s subagentSlots) Acquire(ctx context.Context, _ string) error { return s.p.acquire(ctx, true) }
func (s subagentSlots) Release(string)                              { s.p.release() }
