package wasm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/helper"
)

// Options configures a Backend. The zero value works: guests and the
// helper are built from this module's source on first use and everything is
// cached under images.DefaultCacheDir().
type Options struct {
	// CacheDir holds built guests and the helper (bin/) and wazero's
	// compiled modules (wazero/). Default images.DefaultCacheDir().
	CacheDir string
	// Builder builds the guest programs and the helper; default
	// images.NewBuilder over CacheDir, reporting to Progress.
	Builder *images.Builder
	// Progress gets one line per first-use build or slow compile.
	Progress io.Writer
	// MaxInstances bounds the WASI module instances running at once across
	// all sandboxes (each may use up to its spec's MemoryMB). Default
	// 2×GOMAXPROCS, at least 2.
	MaxInstances int
	// MaxShells bounds the command lines running at once across all
	// sandboxes: each runs in a helper process of its own. Default
	// 4×GOMAXPROCS, at least 8.
	MaxShells int
	// Programs registers extra WASI command modules by name: name → host
	// path of a .wasm file.
	Programs map[string]string
	// PythonWASM is a CPython WASI build (python.wasm) used for python and
	// python3 in preference to the built-in gpython; PythonHome is its
	// prefix (the directory holding lib/python3.X), mounted read-only at
	// /usr/local.
	PythonWASM, PythonHome string
	// HelperPath is a prebuilt helper program; default: built from source.
	HelperPath string
	// Cgroups names the parent cgroup of the helpers ("" derives one from
	// the process id; "-" runs them without cgroups). Without cgroups (not
	// root, no controllers) the helpers still run confined, and Confinement
	// says so.
	Cgroups string
	// HelperIdle is how long an idle helper is kept (default 30s).
	HelperIdle time.Duration
	// AllowUnconfined runs helpers that could not confine themselves
	// (no seccomp, no Landlock on a kernel that has it, capabilities
	// kept): a loosening, reported by Confinement and the audit. Off, such
	// a helper is refused and the backend is unavailable.
	AllowUnconfined bool
}

// Backend creates WASM sandboxes. Commands run in helper processes (one
// command line at a time each, started on demand up to MaxShells): the
// interpreter, the builtins and WASI modules confined there, the episodes'
// files here, served to the helper over its connection. See RATIONALE.md.
type Backend struct {
	opts    Options
	builder *images.Builder
	slots   chan struct{}
	cg      *helper.Cgroups
	cgNote  string
	nextID  atomic.Int64
	live    sync.Map // id → *Sandbox, until Close

	mu          sync.Mutex
	named       map[string]*loading
	helperBuild *loading
	idle        []*idleHelper
	helpers     int // started and not dead
	waiters     []chan struct{}
	closed      bool
	busy        map[*helper.Process]bool
	deaths      int64
	compiles    atomic.Int64 // compile subprocesses run
	reaper      *time.Timer
	// memoryBase is the helpers' memory beyond an exec's (tests lower it).
	memoryBase int64
}

type idleHelper struct {
	p     *helper.Process
	since time.Time
}

// New makes a backend. It builds and compiles nothing yet: the helper and
// the guests are built when first needed.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if opts.CacheDir == "" {
		opts.CacheDir = images.DefaultCacheDir()
	}
	if opts.MaxInstances <= 0 {
		opts.MaxInstances = max(2, 2*runtime.GOMAXPROCS(0))
	}
	if opts.MaxShells <= 0 {
		opts.MaxShells = max(8, 4*runtime.GOMAXPROCS(0))
	}
	if opts.HelperIdle <= 0 {
		opts.HelperIdle = 30 * time.Second
	}
	if opts.PythonWASM != "" {
		if _, err := os.Stat(opts.PythonWASM); err != nil {
			return nil, fmt.Errorf("wasm backend: python.wasm: %v: %w", err, sandbox.ErrImageNotFound)
		}
	}
	builder := opts.Builder
	if builder == nil {
		builder = images.NewBuilder(opts.Progress)
		builder.CacheDir = opts.CacheDir
	}
	if err := os.MkdirAll(filepath.Join(opts.CacheDir, "wazero"), 0o755); err != nil {
		return nil, fmt.Errorf("wasm backend: cache: %v: %w", err, sandbox.ErrEngineUnavailable)
	}
	var err error
	b := &Backend{
		opts: opts, builder: builder,
		slots: make(chan struct{}, opts.MaxInstances),
		named: map[string]*loading{}, busy: map[*helper.Process]bool{},
		memoryBase: helperMemoryBase,
	}
	helper.PruneStale(cgroupPrefix)
	switch opts.Cgroups {
	case "-":
		b.cgNote = "cgroups: off by configuration"
	default:
		name := opts.Cgroups
		if name == "" {
			name = cgroupPrefix + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(backendSeq.Add(1), 10)
		}
		if b.cg, err = helper.NewCgroups(name); err != nil {
			b.cgNote = "cgroups: unavailable (" + err.Error() + ")"
			b.cg = nil
		}
	}
	return b, nil
}

// Name is "wasm".
func (b *Backend) Name() string { return "wasm" }

// Close stops the helpers and releases the compiler. Sandboxes already
// handed out fail their next exec.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	idle := b.idle
	b.idle = nil
	for _, w := range b.waiters {
		close(w)
	}
	b.waiters = nil
	if b.reaper != nil {
		b.reaper.Stop()
	}
	b.mu.Unlock()
	for _, h := range idle {
		h.p.Kill()
	}
	if b.cg != nil {
		go func() {
			time.Sleep(6 * time.Second) // after the helpers' cgroups are gone
			b.cg.Remove()
		}()
	}
	return nil
}

// Warm builds and compiles the named guest programs and the helper now
// (python, js), instead of on first use, the programs side by side.
func (b *Backend) Warm(ctx context.Context, names ...string) error {
	if _, err := b.helperCommand(ctx); err != nil {
		return fmt.Errorf("wasm backend: %v: %w", err, sandbox.ErrEngineUnavailable)
	}
	// Built and compiled side by side: each is mostly one process on one
	// core (go build, then a single-threaded compile).
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() { _, errs[i] = b.program(ctx, n) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Confinement reports how the helpers are confined (starting one if none
// ran yet), for audits.
func (b *Backend) Confinement(ctx context.Context) (helper.Confinement, error) {
	p, err := b.acquire(ctx)
	if err != nil {
		return helper.Confinement{}, err
	}
	c := p.Confinement()
	b.release(p)
	if b.cgNote != "" {
		c.Notes = append(c.Notes, b.cgNote)
	}
	return c, nil
}

// HelperDeaths counts helpers that died while running a command.
func (b *Backend) HelperDeaths() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.deaths
}

// acquire takes an idle helper or starts one, waiting while MaxShells run.
// The wait is the runtime's, not the command's: the exec's clock starts
// in the helper.
func (b *Backend) acquire(ctx context.Context) (*helper.Process, error) {
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, fmt.Errorf("wasm backend: %w", sandbox.ErrClosed)
		}
		for len(b.idle) > 0 {
			h := b.idle[len(b.idle)-1]
			b.idle = b.idle[:len(b.idle)-1]
			if h.p.Alive() {
				b.busy[h.p] = true
				b.mu.Unlock()
				return h.p, nil
			}
			b.helpers--
		}
		if b.helpers < b.opts.MaxShells {
			b.helpers++
			b.mu.Unlock()
			p, err := b.start(ctx)
			b.mu.Lock()
			if err != nil {
				b.helpers--
				b.wakeLocked()
				b.mu.Unlock()
				return nil, err
			}
			b.busy[p] = true
			b.mu.Unlock()
			return p, nil
		}
		w := make(chan struct{})
		b.waiters = append(b.waiters, w)
		b.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			b.mu.Lock()
			if i := slices.Index(b.waiters, w); i >= 0 {
				b.waiters = slices.Delete(b.waiters, i, i+1) // clears the freed slot
			}
			if len(b.waiters) == 0 {
				b.waiters = nil
			}
			b.mu.Unlock()
			return nil, context.Cause(ctx)
		}
	}
}

func (b *Backend) wakeLocked() {
	if len(b.waiters) > 0 {
		close(b.waiters[0])
		// The slot is cleared and an empty queue drops its array: a burst
		// of thousands of waiters keeps neither their channels nor the
		// room for them once they were served.
		b.waiters[0] = nil
		b.waiters = b.waiters[1:]
		if len(b.waiters) == 0 {
			b.waiters = nil
		}
	}
}

// release returns a helper to the idle list (or forgets a dead one).
func (b *Backend) release(p *helper.Process) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.busy, p)
	if !p.Alive() || b.closed {
		b.helpers--
		if b.closed {
			p.Kill()
		}
		b.wakeLocked()
		return
	}
	b.idle = append(b.idle, &idleHelper{p: p, since: time.Now()})
	if b.reaper == nil {
		b.reaper = time.AfterFunc(b.opts.HelperIdle, b.reap)
	}
	b.wakeLocked()
}

// reap stops helpers idle for longer than HelperIdle, keeping one.
func (b *Backend) reap() {
	b.mu.Lock()
	b.reaper = nil
	if b.closed {
		b.mu.Unlock()
		return
	}
	sort.Slice(b.idle, func(i, j int) bool { return b.idle[i].since.Before(b.idle[j].since) })
	var stop []*helper.Process
	keep := b.idle[:0]
	for i, h := range b.idle {
		if i < len(b.idle)-1 && time.Since(h.since) >= b.opts.HelperIdle {
			stop = append(stop, h.p)
			b.helpers--
			continue
		}
		keep = append(keep, h)
	}
	b.idle = keep
	if len(b.idle) > 1 {
		b.reaper = time.AfterFunc(b.opts.HelperIdle, b.reap)
	}
	b.mu.Unlock()
	for _, p := range stop {
		p.Kill()
	}
}

// start starts and initialises one helper.
func (b *Backend) start(ctx context.Context) (*helper.Process, error) {
	argv, err := b.helperCommand(ctx)
	if err != nil {
		return nil, fmt.Errorf("wasm backend: %v: %w", err, sandbox.ErrEngineUnavailable)
	}
	// Readable: the compiled-module cache and the built guests (which may
	// live in another builder's cache), a CPython, registered programs.
	ro := []string{b.opts.CacheDir}
	if b.builder.CacheDir != "" && b.builder.CacheDir != b.opts.CacheDir {
		ro = append(ro, b.builder.CacheDir)
	}
	for _, p := range []string{b.opts.PythonWASM, b.opts.PythonHome} {
		if p != "" {
			ro = append(ro, p)
		}
	}
	var names []string
	for n, p := range b.opts.Programs {
		names = append(names, n)
		ro = append(ro, p)
	}
	sort.Strings(names)
	p, err := helper.Start(ctx, helper.StartOptions{
		Command: argv,
		Init: helper.Init{ReadOnly: ro, CacheDir: b.opts.CacheDir, Programs: names,
			MaxThreads: helperThreads, Confine: true},
		Cgroup:     b.cg,
		MemoryBase: b.memoryBase,
		Pids:       helperThreads + 16,
	})
	if err != nil {
		return nil, fmt.Errorf("wasm backend: %v: %w", err, sandbox.ErrEngineUnavailable)
	}
	if missing := unconfined(p.Confinement()); len(missing) > 0 && !b.opts.AllowUnconfined {
		p.Kill()
		return nil, fmt.Errorf("wasm backend: the helper could not confine itself (%s; %s): refusing to run commands unconfined: %w",
			strings.Join(missing, ", "), strings.Join(p.Confinement().Notes, "; "), sandbox.ErrEngineUnavailable)
	}
	return p, nil
}

// unconfined lists what a helper's confinement lacks of what this host
// can give: seccomp, no_new_privs, rlimits, no capabilities, and Landlock
// where the kernel has it.
func unconfined(c helper.Confinement) []string {
	var out []string
	if !c.NoNewPrivs {
		out = append(out, "no_new_privs")
	}
	if !c.Seccomp {
		out = append(out, "seccomp")
	}
	if !c.Rlimits {
		out = append(out, "rlimits")
	}
	if !c.CapsDropped {
		out = append(out, "capabilities")
	}
	if c.Landlock == 0 && helper.LandlockAvailable() {
		out = append(out, "landlock")
	}
	return out
}

// A helper's own needs beyond an exec's limits: the Go runtime and the
// compiled guests (python and js: ~60 MB of machine code), and its threads
// (Go needs a few; nothing in a helper blocks a thread per command).
const (
	helperMemoryBase = 256 << 20
	helperThreads    = 48
)

func (b *Backend) acquireSlot(ctx context.Context) error {
	select {
	case b.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Create makes a sandbox: an empty filesystem with the workdir, /tmp and
// /root, capped at DiskMB+TmpMB.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.Network != "" && spec.Network != sandbox.NetworkNone {
		return nil, &sandbox.FieldError{Field: "network", Message: fmt.Sprintf("%q: the wasm backend has no network at all", spec.Network)}
	}
	if spec.Image != "" && spec.Image != "wasm" && spec.Image != "base" && spec.Image != "python" {
		return nil, fmt.Errorf("wasm backend: image %q: only the built-in guests (base, python) exist: %w", spec.Image, sandbox.ErrImageNotFound)
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("wasm backend: %w", sandbox.ErrClosed)
	}
	sb := newSandbox(b, spec.WithDefaults())
	b.live.Store(sb.id, sb)
	return sb, nil
}

// Live lists the ids of the sandboxes not yet closed, for audits and tests.
func (b *Backend) Live() []string {
	var ids []string
	b.live.Range(func(k, _ any) bool {
		ids = append(ids, k.(string))
		return true
	})
	return ids
}

// cgroupPrefix names the helpers' parent cgroups: PREFIX<pid>-<n>, one a
// backend.
const cgroupPrefix = "rollbox-wasm-"

var backendSeq atomic.Int64

// errHelperDied is how an exec that killed its helper is reported.
var errHelperDied = errors.New("the command killed its helper process")
