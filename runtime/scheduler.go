package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// Limits bound what the service takes on. Zero fields take the defaults.
type Limits struct {
	// MaxRunning bounds rollout episodes running at once (default 10000).
	MaxRunning int
	// MaxQueued bounds episodes admitted but not started; a rollout that
	// would go past it is refused with 429 and Retry-After (default 100000).
	MaxQueued int
	// Backend bounds running episodes per sandbox backend (defaults: wasm
	// MaxRunning, docker 256).
	Backend map[string]int
	// PolicyConcurrency bounds policy calls in flight per endpoint (base
	// URL) across all rollouts (default 1024). A rollout may lower its own
	// with policy.max_concurrency.
	PolicyConcurrency int
	// CPUAtOnce bounds the rollout episodes doing CPU-bound work in this
	// process at once (internal/cpugate: recording a step, encoding a
	// policy request, writing the final record, a stream's lines); their
	// waits are outside it. Default 4×GOMAXPROCS (cpugate.Size); negative: no
	// bound (every woken episode is runnable at once, and a /healthz
	// probe waits behind them in Go's run queues).
	CPUAtOnce int
	// WarmPool is the most ready sandboxes kept per backend and spec; each
	// backend's pool keeps, of each spec, as many as episodes wait for it
	// (defaults: docker and containerd 16, wasm 0: a WASM sandbox is made in
	// microseconds).
	WarmPool map[string]int
	// InfraAttempts bounds the attempts of an episode whose sandbox failed
	// before the policy was asked anything (default 3).
	InfraAttempts int
	// MaxEnvEpisodes bounds open environment-mode episodes (default 1024).
	MaxEnvEpisodes int
	// EnvIdleTimeout closes an environment-mode episode nobody touched for
	// that long (default 10 minutes).
	EnvIdleTimeout time.Duration
	// MaxGroupSize bounds group_size (default 4096).
	MaxGroupSize int
	// KeepEnded is how long an ended rollout stays in memory (streams
	// already attached keep theirs); after that it is read back from the
	// store when asked for (default 10 minutes).
	KeepEnded time.Duration
	// DiskReserve is the free space of the data directory below which new
	// work is refused (507) and queued episodes wait, so that the episodes
	// running can still write their records (default 1 GiB).
	DiskReserve int64
	// StorageCheckEvery is how often the data directory's free space is
	// measured (default 1 s; every tenth check also writes a probe file).
	StorageCheckEvery time.Duration
	// MaxImports bounds imports (POST /v1/imports) running at once; one
	// more is refused with 429 (default 4).
	MaxImports int
	// MaxImportEpisodeBytes caps one imported episode (one NDJSON line);
	// a longer line is refused and skipped without being kept (default 16
	// MiB).
	MaxImportEpisodeBytes int
	// OutcomeCheckEvery is how often imported episodes whose outcome
	// window closed are scored (default 1 s; readers score what is due
	// before they read anyway).
	OutcomeCheckEvery time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxRunning <= 0 {
		l.MaxRunning = 10000
	}
	if l.MaxQueued <= 0 {
		l.MaxQueued = 100000
	}
	b := map[string]int{sandbox.BackendWASM: l.MaxRunning, sandbox.BackendDocker: 256}
	for k, v := range l.Backend {
		b[k] = v
	}
	l.Backend = b
	if l.PolicyConcurrency <= 0 {
		l.PolicyConcurrency = 1024
	}
	w := map[string]int{sandbox.BackendDocker: 16, sandbox.BackendContainerd: 16}
	for k, v := range l.WarmPool {
		w[k] = v
	}
	l.WarmPool = w
	if l.InfraAttempts <= 0 {
		l.InfraAttempts = 3
	}
	if l.MaxEnvEpisodes <= 0 {
		l.MaxEnvEpisodes = 1024
	}
	if l.EnvIdleTimeout <= 0 {
		l.EnvIdleTimeout = 10 * time.Minute
	}
	if l.MaxGroupSize <= 0 {
		l.MaxGroupSize = 4096
	}
	if l.KeepEnded <= 0 {
		l.KeepEnded = 10 * time.Minute
	}
	if l.DiskReserve <= 0 {
		l.DiskReserve = 1 << 30
	}
	if l.StorageCheckEvery <= 0 {
		l.StorageCheckEvery = time.Second
	}
	if l.MaxImports <= 0 {
		l.MaxImports = 4
	}
	if l.MaxImportEpisodeBytes <= 0 {
		l.MaxImportEpisodeBytes = 16 << 20
	}
	if l.OutcomeCheckEvery <= 0 {
		l.OutcomeCheckEvery = time.Second
	}
	return l
}

// job is one queued rollout episode, with the plan of its task (its
// backend and sandbox spec, computed at admission).
type job struct {
	r    *rollout
	ep   *episodeState
	plan *plan
	// batch, on a coordinator, is the group this job is dispatched with as
	// one work item (a task with a prefix: the group forks from one
	// sandbox, so one worker runs it); nil for a job dispatched alone.
	batch *jobBatch
}

// jobBatch is the episodes of one group a coordinator started together
// (scheduler.pick) and publishes as one work item once the last of them is
// started (coordinator.start).
type jobBatch struct {
	jobs    []*job
	started int // under the coordinator's mu
}

// groupItem says whether a coordinator dispatches the job with its group
// as one work item.
func (j *job) groupItem() bool { return j.plan.task.Prefix != nil }

// demandKey names the sandboxes a job waits for: a backend's pool and a spec in it.
type demandKey struct{ backend, spec string }

// demand is how many queued jobs wait for one spec.
type demand struct {
	spec sandbox.Spec
	n    int
}

// scheduler starts queued episodes: round-robin across rollouts (one
// episode from each rollout with work in turn, so a big batch cannot starve
// a small one), within the global and per-backend bounds. A rollout whose
// next episode's backend is full is skipped this round, not waited on.
type scheduler struct {
	limits Limits
	start  func(*job) // runs a started job in its own goroutine
	// canStart says whether episodes may start now (the data directory
	// can take their records); the dispatcher is woken when it may again.
	canStart func() bool
	// queuedN and runningN mirror queued and running for readers that
	// take no lock (/healthz).
	queuedN, runningN atomic.Int64
	// busied is set whenever an episode is queued or running: the idle
	// loop (reclaimWhenIdle) takes it, so that work begun and ended
	// between two of its looks is not missed.
	busied atomic.Bool

	mu             sync.Mutex
	active         []*rollout // rollouts with queued jobs
	next           int
	queued         int
	running        int
	backendRunning map[string]int
	demand         map[demandKey]*demand
	demandDirty    bool
	ended          completions // recent completions, for Retry-After
	// waiters are sub-agents (and orchestrators going on after theirs)
	// waiting for a running slot: served, in order, before queued jobs.
	waiters []*slotWaiter

	// clusterSlots, when not nil (a coordinator), bound the episodes
	// dispatched and not ended per backend by the live workers' slots, in
	// place of Limits.Backend: a backend no worker serves runs none.
	clusterSlots map[string]int
	// clusterMaxSlots is the largest one live worker's slots per backend
	// (a coordinator): a group item runs on one worker, so a group larger
	// than every worker waits queued, holding no slot (none would take it;
	// started, its episodes would hold the cluster's slots for ever).
	clusterMaxSlots map[string]int
	// warn logs what an operator must act on (nil: nowhere).
	warn func(msg string, args ...any)

	wake     chan struct{}
	sizeWake chan struct{}
}

// setClusterSlots sets the live workers' slots per backend (a
// coordinator's bound) and the largest one worker's, and wakes the
// dispatcher.
func (sc *scheduler) setClusterSlots(slots, maxSlots map[string]int) {
	sc.mu.Lock()
	sc.clusterSlots, sc.clusterMaxSlots = slots, maxSlots
	sc.mu.Unlock()
	signal(sc.wake)
}

// backendFullLocked says whether backend runs as many episodes as it may.
func (sc *scheduler) backendFullLocked(backend string) bool {
	if sc.clusterSlots != nil {
		return sc.backendRunning[backend] >= sc.clusterSlots[backend]
	}
	l := sc.limits.Backend[backend]
	return l > 0 && sc.backendRunning[backend] >= l
}

func newScheduler(l Limits, start func(*job), canStart func() bool, cluster bool) *scheduler {
	sc := &scheduler{limits: l, start: start, canStart: canStart, backendRunning: map[string]int{}, demand: map[demandKey]*demand{},
		wake: make(chan struct{}, 1), sizeWake: make(chan struct{}, 1)}
	if cluster {
		sc.clusterSlots = map[string]int{}
	}
	return sc
}

// syncCountsLocked publishes queued and running to the lock-free readers.
func (sc *scheduler) syncCountsLocked() {
	sc.queuedN.Store(int64(sc.queued))
	sc.runningN.Store(int64(sc.running))
	if sc.queued+sc.running > 0 {
		sc.busied.Store(true)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// admit queues a rollout's jobs, or refuses them when the service is full:
// a 429 with a Retry-After estimated from the recent completion rate, or a
// 413 when the rollout alone is larger than the service ever holds.
func (sc *scheduler) admit(r *rollout, jobs []*job) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	n := len(jobs)
	if err := sc.fitsLocked(n); err != nil {
		return err
	}
	r.queue = jobs
	sc.active = append(sc.active, r)
	sc.queued += n
	sc.syncCountsLocked()
	for _, j := range jobs {
		sc.addDemandLocked(j, 1)
	}
	signal(sc.wake)
	return nil
}

// resume takes back a rollout a restarted coordinator dispatches again:
// inflight are running on workers already (counted as running), queued
// wait as admitted jobs do (whatever the queue's bound: they were admitted).
func (sc *scheduler) resume(r *rollout, inflight, queued []*job) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.running += len(inflight)
	r.started += len(inflight)
	for _, j := range inflight {
		sc.backendRunning[j.plan.backend]++
	}
	if len(queued) > 0 {
		r.queue = queued
		sc.active = append(sc.active, r)
		sc.queued += len(queued)
		for _, j := range queued {
			sc.addDemandLocked(j, 1)
		}
	}
	sc.syncCountsLocked()
	signal(sc.wake)
}

// fits says, without queuing anything, whether n episodes would be admitted
// now: the 413 or 429 admit would answer, or nil.
func (sc *scheduler) fits(n int) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.fitsLocked(n)
}

func (sc *scheduler) fitsLocked(n int) error {
	capacity := sc.limits.MaxRunning + sc.limits.MaxQueued
	if n > capacity {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: codeTooLarge, Field: "tasks",
			Message: fmt.Sprintf("%d episodes (tasks × group_size) is more than this service holds at once (%d); split the rollout", n, capacity)}
	}
	// What would wait after every free running slot is taken.
	waiting := sc.queued + n - max(0, sc.limits.MaxRunning-sc.running)
	if waiting > sc.limits.MaxQueued {
		over := waiting - sc.limits.MaxQueued
		return &apiError{Status: http.StatusTooManyRequests, Code: codeOverloaded, RetryAfter: sc.retryAfterLocked(over),
			Message: fmt.Sprintf("the service is full: %d episodes running and %d queued (max queued %d); %d more would not fit",
				sc.running, sc.queued, sc.limits.MaxQueued, over)}
	}
	return nil
}

// retryAfterLocked estimates the seconds until over episodes' worth of room
// frees up, from completions in the last minute.
func (sc *scheduler) retryAfterLocked(over int) int {
	rate := sc.ended.rate(time.Now())
	if rate <= 0 {
		return 5
	}
	return int(min(300, max(1, math.Ceil(float64(over)/rate))))
}

// completions counts episode completions in the last minute, a second a
// bucket: a fixed few hundred bytes, however many episodes a week-long run
// ends (a time each, kept until a 429 trimmed them, held up to 100,000).
type completions struct {
	sec [60]int64 // the Unix second each bucket counts, 0 for none
	n   [60]int
}

func (c *completions) add(now time.Time) {
	t := now.Unix()
	i := t % int64(len(c.sec))
	if c.sec[i] != t {
		c.sec[i], c.n[i] = t, 0
	}
	c.n[i]++
}

// rate is completions a second over the last minute, from the oldest
// second with any (0 for none).
func (c *completions) rate(now time.Time) float64 {
	t := now.Unix()
	total, oldest := 0, t
	for i, s := range c.sec {
		if s > t-int64(len(c.sec)) && s <= t && c.n[i] > 0 {
			total += c.n[i]
			oldest = min(oldest, s)
		}
	}
	if total == 0 {
		return 0
	}
	return float64(total) / max(1, now.Sub(time.Unix(oldest, 0)).Seconds())
}

func (sc *scheduler) addDemandLocked(j *job, d int) {
	if j.plan.specKey == "" {
		return
	}
	k := demandKey{j.plan.backend, j.plan.specKey}
	dm := sc.demand[k]
	if dm == nil {
		dm = &demand{spec: j.plan.spec}
		sc.demand[k] = dm
	}
	dm.n += d
	sc.demandDirty = true
}

// pick takes the next jobs to start: one job, or on a coordinator the
// queued episodes of a group it dispatches as one work item (job.batch),
// all at once and only when the live workers' slots hold them all; nil
// when none may start.
func (sc *scheduler) pick() []*job {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.grantLocked()
	if sc.running >= sc.limits.MaxRunning || (sc.canStart != nil && !sc.canStart()) {
		return nil
	}
	for i := range sc.active {
		idx := (sc.next + i) % len(sc.active)
		r := sc.active[idx]
		j, k := sc.headLocked(r)
		if j == nil || sc.backendFullLocked(j.plan.backend) {
			continue
		}
		if sc.clusterSlots != nil && j.groupItem() {
			if sc.backendRunning[j.plan.backend]+k > sc.clusterSlots[j.plan.backend] || sc.running+k > sc.limits.MaxRunning {
				continue
			}
		}
		if sc.waitingLocked(j.plan.backend) {
			continue // a sub-agent waits for this backend's next slot
		}
		// A "groups" rollout starts a group only when the whole group fits
		// its window; the group's other episodes then follow it at once.
		if r.window > 0 && j.ep.rec.GroupIndex == 0 && r.started > 0 && r.started+len(j.ep.group.members) > r.window {
			continue
		}
		jobs := slices.Clone(r.queue[:k])
		clear(r.queue[:k])
		r.queue = r.queue[k:]
		if len(r.queue) == 0 {
			sc.active = slices.Delete(sc.active, idx, idx+1) // zeroes the tail: no stale reference
			sc.next = idx
		} else {
			sc.next = idx + 1
		}
		if len(sc.active) > 0 {
			sc.next %= len(sc.active)
		} else {
			sc.next = 0
		}
		sc.queued -= k
		sc.running += k
		r.started += k
		sc.syncCountsLocked()
		sc.backendRunning[j.plan.backend] += k
		for _, x := range jobs {
			sc.addDemandLocked(x, -1)
		}
		if sc.clusterSlots != nil && j.groupItem() {
			b := &jobBatch{jobs: jobs}
			for _, x := range jobs {
				x.batch = b
			}
		}
		return jobs
	}
	return nil
}

// headLocked is the job at the head of r's queue and how many start with
// it (k: the group of a coordinator's group item, else 1). A group item no
// live worker has a slot for each of (it runs whole on one worker) waits
// for one: noted once, and moved behind the rest of r's queue so that r's
// other episodes start meanwhile; nil when nothing of r can start for that
// reason.
func (sc *scheduler) headLocked(r *rollout) (*job, int) {
	for moved := 0; ; {
		j := r.queue[0]
		if sc.clusterSlots == nil || !j.groupItem() {
			return j, 1
		}
		k := 1
		for k < len(r.queue) && r.queue[k].ep.group == j.ep.group {
			k++
		}
		largest := sc.clusterMaxSlots[j.plan.backend]
		if k <= largest {
			return j, k
		}
		if g := j.ep.group; !g.waitNoted && sc.warn != nil {
			g.waitNoted = true
			sc.warn("cluster: a group waits for a worker with a slot for each of its episodes (it runs whole on one worker, from one prefix)",
				"group", g.id, "episodes", k, "backend", j.plan.backend, "largest_worker_slots", largest)
		}
		if moved+k >= len(r.queue) {
			return nil, 0 // every queued episode of r is such a group
		}
		g := slices.Clone(r.queue[:k])
		copy(r.queue, r.queue[k:])
		copy(r.queue[len(r.queue)-k:], g)
		moved += k
	}
}

// requeue puts a coordinator's started jobs back at the end of r's queue,
// their slots freed (a group item no live worker can hold, taken back from
// the workers); false, and nothing done, when r has stopped (cancelled:
// the caller ends them).
func (sc *scheduler) requeue(r *rollout, jobs []*job) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	r.mu.Lock()
	stopped := terminalState(r.rec.State)
	r.mu.Unlock()
	if stopped {
		return false
	}
	n := len(jobs)
	sc.running -= n
	r.started -= n
	for _, j := range jobs {
		sc.backendRunning[j.plan.backend]--
		j.batch = nil
		sc.addDemandLocked(j, 1)
	}
	if len(r.queue) == 0 {
		sc.active = append(sc.active, r)
	}
	r.queue = append(r.queue, jobs...)
	sc.queued += n
	sc.syncCountsLocked()
	sc.grantLocked()
	signal(sc.wake)
	return true
}

// done releases a finished job's slots.
func (sc *scheduler) done(j *job) {
	sc.mu.Lock()
	sc.running--
	j.r.started--
	sc.syncCountsLocked()
	sc.backendRunning[j.plan.backend]--
	sc.ended.add(time.Now())
	sc.grantLocked()
	sc.mu.Unlock()
	signal(sc.wake)
}

// slotWaiter is one Acquire waiting for a slot of backend.
type slotWaiter struct {
	backend string
	ch      chan struct{}
}

// fitsSlotLocked says whether one more episode of backend may run now.
func (sc *scheduler) fitsSlotLocked(backend string) bool {
	if sc.running >= sc.limits.MaxRunning {
		return false
	}
	return !sc.backendFullLocked(backend)
}

func (sc *scheduler) takeSlotLocked(backend string) {
	sc.running++
	sc.backendRunning[backend]++
	sc.syncCountsLocked()
}

// grantLocked gives the free slots to the waiters, in order.
func (sc *scheduler) grantLocked() {
	kept := sc.waiters[:0]
	for _, w := range sc.waiters {
		if sc.fitsSlotLocked(w.backend) {
			sc.takeSlotLocked(w.backend)
			w.ch <- struct{}{}
			continue
		}
		kept = append(kept, w)
	}
	clear(sc.waiters[len(kept):])
	sc.waiters = kept
}

// waitingLocked says whether a sub-agent waits for a slot that an episode
// of backend would take.
func (sc *scheduler) waitingLocked(backend string) bool {
	for _, w := range sc.waiters {
		if w.backend == backend || sc.running >= sc.limits.MaxRunning {
			return true
		}
	}
	return false
}

// Acquire takes a running slot of backend for a sub-agent, or for an
// orchestrator going on after its sub-agents (agent.Slots): it counts in
// the service's running episodes and the backend's bound, and is served
// before every queued episode. It waits until one is free or ctx ends.
func (sc *scheduler) Acquire(ctx context.Context, backend string) error {
	sc.mu.Lock()
	if len(sc.waiters) == 0 && sc.fitsSlotLocked(backend) {
		sc.takeSlotLocked(backend)
		sc.mu.Unlock()
		return nil
	}
	w := &slotWaiter{backend: backend, ch: make(chan struct{}, 1)}
	sc.waiters = append(sc.waiters, w)
	sc.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for i, x := range sc.waiters {
		if x == w {
			sc.waiters = append(sc.waiters[:i], sc.waiters[i+1:]...)
			return ctx.Err()
		}
	}
	// Granted as ctx ended: hand it on.
	sc.releaseLocked(backend)
	signal(sc.wake)
	return ctx.Err()
}

// Release gives back a slot taken by Acquire, or an orchestrator's own
// while it waits on its sub-agents (agent.Slots).
func (sc *scheduler) Release(backend string) {
	sc.mu.Lock()
	sc.releaseLocked(backend)
	sc.mu.Unlock()
	signal(sc.wake)
}

func (sc *scheduler) releaseLocked(backend string) {
	sc.running--
	sc.backendRunning[backend]--
	sc.syncCountsLocked()
	sc.grantLocked()
}

// withdraw removes a rollout's queued jobs (cancellation, shutdown) and
// returns them.
func (sc *scheduler) withdraw(r *rollout) []*job {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	jobs := r.queue
	r.queue = nil
	for i, a := range sc.active {
		if a == r {
			sc.active = slices.Delete(sc.active, i, i+1)
			if sc.next > i {
				sc.next--
			}
			if len(sc.active) > 0 {
				sc.next %= len(sc.active)
			} else {
				sc.next = 0
			}
			break
		}
	}
	sc.queued -= len(jobs)
	sc.syncCountsLocked()
	for _, j := range jobs {
		sc.addDemandLocked(j, -1)
	}
	signal(sc.sizeWake)
	return jobs
}

func (sc *scheduler) counts() (queued, running int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.queued, sc.running
}

// run is the dispatcher: it starts whatever can start whenever something
// changes, until ctx ends.
func (sc *scheduler) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sc.wake:
		}
		for {
			jobs := sc.pick()
			if len(jobs) == 0 {
				break
			}
			for _, j := range jobs {
				sc.start(j)
			}
		}
		signal(sc.sizeWake)
	}
}

// sizePools keeps each warm pool as large as the episodes waiting for its
// spec (capped per backend), until ctx ends. Shrinking closes sandboxes, so
// this runs apart from the dispatcher.
func (sc *scheduler) sizePools(ctx context.Context, sbx *sandboxes) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sc.sizeWake:
		}
		sc.mu.Lock()
		if !sc.demandDirty {
			sc.mu.Unlock()
			continue
		}
		sc.demandDirty = false
		type want struct {
			backend string
			demand
		}
		var wants []want
		for k, dm := range sc.demand {
			wants = append(wants, want{k.backend, *dm})
			if dm.n == 0 {
				delete(sc.demand, k)
			}
		}
		sc.mu.Unlock()
		for _, w := range wants {
			sbx.setDemand(ctx, w.backend, w.spec, w.n)
		}
	}
}

// sandboxes makes the episodes' sandboxes: straight from the backend, or
// through the backend's warm pool where it keeps one.
type sandboxes struct {
	backends *backendOpener
	metrics  *Metrics
	warm     map[string]int

	mu     sync.Mutex
	pools  map[string]*sandbox.Pool // by backend
	closed bool
}

// pool returns backend's warm pool, or nil when it keeps none.
func (x *sandboxes) pool(backend string, be sandbox.Backend) *sandbox.Pool {
	if x.warm[backend] <= 0 {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	p := x.pools[backend]
	if p == nil {
		p = sandbox.NewPool(be, 0)
		x.pools[backend] = p
	}
	return p
}

// setDemand sizes backend's warm pool for n episodes waiting for spec.
func (x *sandboxes) setDemand(ctx context.Context, backend string, spec sandbox.Spec, n int) {
	be, err := x.backends.get(ctx, backend)
	if err != nil {
		return // the episodes will fail at create and say why
	}
	if p := x.pool(backend, be); p != nil {
		p.SetDemand(spec, min(n, x.warm[backend]))
	}
}

// create makes an episode's sandbox (agent.SandboxFactory): from the
// backend's warm pool when it keeps one, else created for the episode.
func (x *sandboxes) create(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error) {
	be, err := x.backends.get(ctx, backend)
	if err != nil {
		x.metrics.SandboxFailures.WithLabelValues(backend).Inc()
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, errors.Join(err, sandbox.ErrEngineUnavailable)
	}
	start := time.Now()
	source := "create"
	var sb sandbox.Sandbox
	if p := x.pool(backend, be); p != nil {
		source = "pool"
		sb, err = p.Get(ctx, spec)
	} else {
		sb, err = be.Create(ctx, spec)
	}
	x.metrics.SandboxAcquire.WithLabelValues(backend, source).Observe(seconds(time.Since(start)))
	if err != nil {
		x.metrics.SandboxFailures.WithLabelValues(backend).Inc()
	}
	x.backends.noteCreate(backend, err)
	return sb, err
}

// poolStat sums a backend's warm pools.
type poolStat struct {
	Ready, Target        int
	Hits, Misses, Errors int64
}

func (x *sandboxes) poolStats() map[string]poolStat {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string]poolStat{}
	for backend, p := range x.pools {
		st := p.Stats()
		agg := out[backend]
		for _, n := range st.Ready {
			agg.Ready += n
		}
		for _, n := range st.Target {
			agg.Target += n
		}
		agg.Hits += st.Hits
		agg.Misses += st.Misses
		agg.Errors += st.CreateErrors
		out[backend] = agg
	}
	return out
}

func (x *sandboxes) Close() error {
	x.mu.Lock()
	x.closed = true
	pools := x.pools
	x.pools = map[string]*sandbox.Pool{}
	x.mu.Unlock()
	var errs []error
	for _, p := range pools {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
