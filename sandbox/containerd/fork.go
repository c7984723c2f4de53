package containerd

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// Fork makes n sandboxes of this one's spec whose workdir and /tmp hold the
// files this one has now (sandbox.Forker), without copying them: this
// sandbox's writable layer is frozen and becomes the read-only lower layer
// of an overlay in this sandbox and in each child, each with its own empty
// upper of the spec's size (copy-on-write; see workspace.go). The children
// are fresh sandboxes (the backend's spares when it keeps them, see
// Options.ForkSpares; created otherwise) whose directories are swapped in
// their running containers. Processes are not forked. Under runsc (gVisor
// keeps the files in its sentry's memory, out of the host's reach) the
// files are copied into each child through the guests instead
// (sandbox.CopyFiles).
//
// # Errors
//
// All or nothing (see sandbox.Forker). ErrInvalidSpec for n out of range.
func (c *Container) Fork(ctx context.Context, n int) ([]sandbox.Sandbox, error) {
	if err := sandbox.CheckFork(n); err != nil {
		return nil, err
	}
	if c.IsClosed() {
		return nil, fmt.Errorf("fork sandbox %s: %w", c.id, sandbox.ErrClosed)
	}
	if err := c.Broken(); err != nil {
		return nil, err
	}
	if c.spec.Runtime == sandbox.RuntimeRunsc {
		// Walk first: a tree over the copy budget is refused before any
		// child is made (ErrTooLarge, the sandbox's doing).
		plan, err := sandbox.PlanCopy(ctx, c, c.spec.Workdir, "/tmp")
		if err != nil {
			return nil, err
		}
		defer plan.Release(context.WithoutCancel(ctx))
		kids, err := sandbox.CreateAll(ctx, n, func(ctx context.Context) (sandbox.Sandbox, error) { return c.b.Create(ctx, c.spec) })
		if err != nil {
			return nil, err
		}
		if err := plan.CopyTo(ctx, kids); err != nil {
			sandbox.CloseAll(kids)
			return nil, err
		}
		if err := plan.Release(ctx); err != nil {
			sandbox.CloseAll(kids)
			return nil, err
		}
		return kids, nil
	}
	kids, err := c.b.freshSandboxes(ctx, c.spec, n)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.Sandbox, len(kids))
	for i, k := range kids {
		out[i] = k
	}
	if err := c.forkInto(kids); err != nil {
		sandbox.CloseAll(out)
		return nil, err
	}
	c.b.refillSpares(c.spec, n)
	return out, nil
}

// forkInto gives every kid (fresh, never used) this sandbox's files.
func (c *Container) forkInto(kids []*Container) error {
	c.wsMu.Lock()
	defer c.wsMu.Unlock()
	if c.ws == nil || c.IsClosed() {
		return fmt.Errorf("fork sandbox %s: %w", c.id, sandbox.ErrClosed)
	}
	// The files are the running task's: a stopped one's are not the
	// sandbox's state any more.
	if st, err := c.task.Status(context.Background()); err != nil || st.Status != "running" {
		return fmt.Errorf("fork sandbox %s: its task is not running (%v %v): %w", c.id, st.Status, err, sandbox.ErrSandboxFailed)
	}
	c.forks++
	chains := make([][]*layer, len(c.ws.roots))
	defer func() {
		for _, ch := range chains {
			c.b.dropLayers(ch)
		}
	}()
	for i, r := range c.ws.roots {
		chain, err := c.b.freeze(c.id, c.forks, r)
		if err != nil {
			return fmt.Errorf("fork sandbox %s: %w", c.id, err)
		}
		chains[i] = chain
	}
	for _, k := range kids {
		if err := k.adopt(chains); err != nil {
			return fmt.Errorf("fork sandbox %s into %s: %w", c.id, k.id, err)
		}
	}
	return nil
}

// adopt mounts chains (one per root) below this fresh sandbox's uppers.
func (c *Container) adopt(chains [][]*layer) error {
	c.wsMu.Lock()
	defer c.wsMu.Unlock()
	if c.ws == nil || c.IsClosed() {
		return fmt.Errorf("sandbox %s: %w", c.id, sandbox.ErrClosed)
	}
	for i, r := range c.ws.roots {
		if err := c.b.adopt(r, chains[i]); err != nil {
			return err
		}
	}
	return nil
}

// spares are fresh sandboxes kept for forks, by spec without its labels.
type spares struct {
	ctx    context.Context // lifecycle: cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	ready   map[string][]*Container
	filling map[string]bool
	idle    map[string]*time.Timer // closes a key's spares untaken for SpareIdle
	closed  bool

	taken, cold atomic.Int64 // fork children taken ready, created cold
}

func (s *spares) init() {
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.ready, s.filling, s.idle = map[string][]*Container{}, map[string]bool{}, map[string]*time.Timer{}
}

// close stops the refills and closes the spares.
func (s *spares) close() {
	s.mu.Lock()
	s.closed = true
	var all []sandbox.Sandbox
	for _, q := range s.ready {
		for _, c := range q {
			all = append(all, c)
		}
	}
	for _, t := range s.idle {
		t.Stop()
	}
	s.ready = map[string][]*Container{}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	sandbox.CloseAll(all)
}

// touchLocked (re)starts key's idle timer: spares of a spec no fork has
// taken for idle are closed, so the forks of a rollout that is over hold
// no containers for the backend's life.
func (s *spares) touchLocked(key string, idle time.Duration) {
	if t := s.idle[key]; t != nil {
		t.Reset(idle)
		return
	}
	s.idle[key] = time.AfterFunc(idle, func() {
		s.mu.Lock()
		q := s.ready[key]
		delete(s.ready, key)
		delete(s.idle, key)
		s.mu.Unlock()
		for _, c := range q {
			c.Close()
		}
	})
}

// unlabelled is the spec spares are made with: a spare is made before the
// episode it serves is known (as sandbox.Pool's sandboxes are), so the
// forks of every sandbox of one spec share them, whatever their labels.
func unlabelled(spec sandbox.Spec) sandbox.Spec {
	spec = spec.WithDefaults()
	spec.Labels = nil
	return spec
}

func spareKey(spec sandbox.Spec) string { return unlabelled(spec).Key() }

// freshSandboxes takes up to n spares of spec and creates the rest, all or
// nothing.
func (b *Backend) freshSandboxes(ctx context.Context, spec sandbox.Spec, n int) ([]*Container, error) {
	key := spareKey(spec)
	var kids []*Container
	var broken []sandbox.Sandbox
	b.spares.mu.Lock()
	q := b.spares.ready[key]
	for len(q) > 0 && len(kids) < n {
		c := q[0]
		q = q[1:]
		if c.IsClosed() || c.Broken() != nil {
			broken = append(broken, c)
			continue
		}
		kids = append(kids, c)
	}
	b.spares.ready[key] = q
	b.spares.mu.Unlock()
	sandbox.CloseAll(broken)
	b.spares.taken.Add(int64(len(kids)))
	b.spares.cold.Add(int64(n - len(kids)))
	if len(kids) == n {
		return kids, nil
	}
	made, err := sandbox.CreateAll(ctx, n-len(kids), func(ctx context.Context) (sandbox.Sandbox, error) {
		return b.create(ctx, spec)
	})
	if err != nil {
		for _, k := range kids {
			k.Close()
		}
		return nil, err
	}
	for _, m := range made {
		kids = append(kids, m.(*Container))
	}
	return kids, nil
}

// refillSpares starts keeping min(n, Options.ForkSpares) spares of spec.
func (b *Backend) refillSpares(spec sandbox.Spec, n int) {
	b.SpareForks(spec, min(n, b.opts.ForkSpares))
}

// PrepareFork is a hint (sandbox.ForkPreparer) that this sandbox will be
// forked into n: the backend starts making min(n, Options.ForkSpares)
// spares of its spec now, so the first fork takes them instead of
// creating its children cold. Nothing under runsc (its forks copy files
// into sandboxes created then) or with ForkSpares 0.
func (c *Container) PrepareFork(n int) {
	if c.spec.Runtime == sandbox.RuntimeRunsc || c.IsClosed() {
		return
	}
	c.b.refillSpares(c.spec, n)
}

// SpareForks keeps n fresh sandboxes of spec ready for the forks of
// sandboxes of that spec (whatever their labels: spares have none),
// filling in the background, so a Fork takes them instead of creating its
// children cold. Forks refill them after use up to Options.ForkSpares;
// spares no fork takes for Options.SpareIdle after they are ready (or
// after the last request for them) are closed.
func (b *Backend) SpareForks(spec sandbox.Spec, n int) {
	if n <= 0 {
		return
	}
	spec = unlabelled(spec)
	key := spareKey(spec)
	s := &b.spares
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.touchLocked(key, b.opts.SpareIdle)
	if s.filling[key] || len(s.ready[key]) >= n {
		return
	}
	s.filling[key] = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		failures := 0
		for s.ctx.Err() == nil {
			s.mu.Lock()
			if len(s.ready[key]) >= n {
				s.filling[key] = false
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			c, err := b.create(s.ctx, spec)
			if err != nil {
				// The next fork creates cold and says why; stop after a few.
				if failures++; failures >= 3 || s.ctx.Err() != nil {
					break
				}
				time.Sleep(time.Duration(failures) * 100 * time.Millisecond)
				continue
			}
			s.mu.Lock()
			if s.closed {
				s.filling[key] = false
				s.mu.Unlock()
				c.Close()
				return
			}
			s.ready[key] = append(s.ready[key], c)
			// A spare's idle time counts from when it is ready: counted
			// from the request, a create slower than SpareIdle (a loaded
			// host, a short SpareIdle) closed every spare it made before
			// any fork could take it.
			s.touchLocked(key, b.opts.SpareIdle)
			if len(s.ready[key]) >= n {
				// Done under the same lock: a fork that takes them now
				// starts a refill of its own.
				s.filling[key] = false
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
		}
		s.mu.Lock()
		s.filling[key] = false
		s.mu.Unlock()
	}()
}

// SparesReady is how many spares of spec are ready.
func (b *Backend) SparesReady(spec sandbox.Spec) int {
	b.spares.mu.Lock()
	defer b.spares.mu.Unlock()
	return len(b.spares.ready[spareKey(spec)])
}

// ForkStats counts the forks' children (sandbox.ForkSpareStats).
func (b *Backend) ForkStats() sandbox.ForkStats {
	s := &b.spares
	s.mu.Lock()
	ready := 0
	for _, q := range s.ready {
		ready += len(q)
	}
	s.mu.Unlock()
	return sandbox.ForkStats{SparesReady: ready, FromSpares: s.taken.Load(), Cold: s.cold.Load()}
}
