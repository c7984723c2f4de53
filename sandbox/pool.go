package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Pool keeps ready sandboxes per spec (Size of each, or the spec's own
// demand), so Get hands one out without waiting for a create. A sandbox is
// handed out once and belongs to the caller from then on; the pool refills
// in the background.
//
// A pool's sandboxes are made before the episode they serve is known: a
// spec's Labels are not given to them, and specs that differ only in their
// labels share ready sandboxes.
type Pool struct {
	backend Backend
	size    int

	ctx    context.Context // lifecycle: cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	hits, misses, createErrors atomic.Int64

	mu      sync.Mutex
	ready   map[string][]Sandbox
	filling map[string]bool
	specs   map[string]Spec // every spec seen, so SetSize can refill them
	demand  map[string]int  // a spec's own target (SetDemand), in place of size
	closed  bool
}

// PoolStats is a snapshot of a pool's counters. Ready and Target are by
// spec key: the sandboxes ready, and how many the pool aims to keep.
type PoolStats struct {
	Ready        map[string]int
	Target       map[string]int
	Hits         int64
	Misses       int64
	CreateErrors int64
}

// NewPool returns a pool over backend keeping size ready sandboxes per spec.
func NewPool(backend Backend, size int) *Pool {
	ctx, cancel := context.WithCancel(context.Background())
	return &Pool{backend: backend, size: size, ctx: ctx, cancel: cancel,
		ready: map[string][]Sandbox{}, filling: map[string]bool{}, specs: map[string]Spec{}, demand: map[string]int{}}
}

// unlabelled is what the pool makes for spec: the same without labels.
func unlabelled(spec Spec) Spec {
	spec.Labels = nil
	return spec
}

// targetLocked is how many ready sandboxes of key the pool keeps.
func (p *Pool) targetLocked(key string) int {
	if n, ok := p.demand[key]; ok {
		return n
	}
	return p.size
}

// Size is the number of ready sandboxes the pool keeps per spec.
func (p *Pool) Size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.size
}

// SetSize changes the number of ready sandboxes kept per spec, so a caller
// can size the pool from demand: a larger size starts filling every spec
// the pool has seen; a smaller one closes the surplus ready sandboxes.
func (p *Pool) SetSize(n int) {
	n = max(n, 0)
	p.mu.Lock()
	if p.closed || n == p.size {
		p.mu.Unlock()
		return
	}
	p.size = n
	var surplus []Sandbox
	for key := range p.ready {
		surplus = append(surplus, p.trimLocked(key)...)
	}
	for _, spec := range p.specs {
		p.startFillLocked(spec)
	}
	p.mu.Unlock()
	for _, sb := range surplus {
		sb.Close()
	}
}

// SetDemand sets how many ready sandboxes of spec the pool keeps, in place
// of its size for that spec: more starts filling, fewer closes the surplus.
// A caller sizes the pool from the work waiting for each spec.
func (p *Pool) SetDemand(spec Spec, n int) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	spec = unlabelled(spec)
	key := spec.Key()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("pool: %w", ErrClosed)
	}
	p.demand[key] = max(n, 0)
	surplus := p.trimLocked(key)
	p.startFillLocked(spec)
	p.mu.Unlock()
	for _, sb := range surplus {
		sb.Close()
	}
	return nil
}

// trimLocked takes the ready sandboxes of key beyond its target out of the
// pool; the caller closes them.
func (p *Pool) trimLocked(key string) []Sandbox {
	n := p.targetLocked(key)
	q := p.ready[key]
	if len(q) <= n {
		return nil
	}
	p.ready[key] = q[:n:n]
	return q[n:]
}

// Warm starts filling the pool for spec and returns at once.
func (p *Pool) Warm(spec Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	spec = unlabelled(spec)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("pool: %w", ErrClosed)
	}
	p.startFillLocked(spec)
	return nil
}

// Get returns a ready sandbox for spec, or creates one (without the spec's
// labels, like every sandbox of the pool) when none is ready.
func (p *Pool) Get(ctx context.Context, spec Spec) (Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	spec = unlabelled(spec)
	key := spec.Key()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("pool: %w", ErrClosed)
	}
	var sb Sandbox
	if q := p.ready[key]; len(q) > 0 {
		sb = q[len(q)-1]
		p.ready[key] = q[:len(q)-1]
	}
	p.startFillLocked(spec)
	p.mu.Unlock()
	if sb != nil {
		p.hits.Add(1)
		return sb, nil
	}
	p.misses.Add(1)
	return p.backend.Create(ctx, spec)
}

// startFillLocked tops up spec's queue in one background goroutine.
func (p *Pool) startFillLocked(spec Spec) {
	key := spec.Key()
	p.specs[key] = spec
	if p.filling[key] || len(p.ready[key]) >= p.targetLocked(key) {
		return
	}
	p.filling[key] = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			p.mu.Lock()
			if p.closed || len(p.ready[key]) >= p.targetLocked(key) {
				p.filling[key] = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			sb, err := p.backend.Create(p.ctx, spec)
			if err != nil {
				p.createErrors.Add(1)
				p.mu.Lock()
				p.filling[key] = false
				p.mu.Unlock()
				return // the next Get retries; errors surface there
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				sb.Close()
				return
			}
			if len(p.ready[key]) >= p.targetLocked(key) { // SetSize or SetDemand shrank it meanwhile
				p.filling[key] = false
				p.mu.Unlock()
				sb.Close()
				return
			}
			p.ready[key] = append(p.ready[key], sb)
			p.mu.Unlock()
		}
	}()
}

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PoolStats{Ready: map[string]int{}, Target: map[string]int{}, Hits: p.hits.Load(), Misses: p.misses.Load(), CreateErrors: p.createErrors.Load()}
	for k, q := range p.ready {
		st.Ready[k] = len(q)
	}
	for k := range p.specs {
		st.Target[k] = p.targetLocked(k)
	}
	return st
}

// Close stops refilling and closes every sandbox not handed out. It is
// idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.cancel()
	var all []Sandbox
	for _, q := range p.ready {
		all = append(all, q...)
	}
	p.ready = nil
	p.mu.Unlock()
	p.wg.Wait()
	var errs []error
	for _, sb := range all {
		errs = append(errs, sb.Close())
	}
	return errors.Join(errs...)
}
