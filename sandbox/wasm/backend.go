package wasm

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
)

// Options configures a Backend. The zero value works: guests are built from
// this module's source on first use and everything is cached under
// images.DefaultCacheDir().
type Options struct {
	// CacheDir holds built guests (bin/) and wazero's compiled modules
	// (wazero/). Default images.DefaultCacheDir().
	CacheDir string
	// Builder builds the guest programs; default images.NewBuilder over
	// CacheDir, reporting to Progress.
	Builder *images.Builder
	// Progress gets one line per first-use build or slow compile.
	Progress io.Writer
	// MaxInstances bounds the WASI module instances running at once across
	// all sandboxes (each may use up to its spec's MemoryMB). Default
	// 2×GOMAXPROCS, at least 2.
	MaxInstances int
	// MaxShells bounds the command lines interpreted at once across all
	// sandboxes. Default 256.
	MaxShells int
	// Programs registers extra WASI command modules by name: name → host
	// path of a .wasm file.
	Programs map[string]string
	// PythonWASM is a CPython WASI build (python.wasm) used for python and
	// python3 in preference to the built-in gpython; PythonHome is its
	// prefix (the directory holding lib/python3.X), mounted read-only at
	// /usr/local. Defaults: $ROLLBOX_PYTHON_WASM and $ROLLBOX_PYTHON_HOME.
	PythonWASM, PythonHome string
}

// Backend creates WASM sandboxes. One wazero runtime and one compilation
// cache (on disk) serve every sandbox it makes.
type Backend struct {
	opts      Options
	builder   *images.Builder
	rt        wazero.Runtime
	cache     wazero.CompilationCache
	instances chan struct{}
	shells    chan struct{}
	nextID    atomic.Int64
	live      sync.Map // id → *Sandbox, until Close

	mu     sync.Mutex
	named  map[string]*program
	user   map[string]*program
	closed bool
}

// New makes a backend. It compiles nothing yet: guests are built and
// compiled when a command first needs them.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if opts.CacheDir == "" {
		opts.CacheDir = images.DefaultCacheDir()
	}
	if opts.MaxInstances <= 0 {
		opts.MaxInstances = max(2, 2*runtime.GOMAXPROCS(0))
	}
	if opts.MaxShells <= 0 {
		opts.MaxShells = 256
	}
	if opts.PythonWASM == "" {
		opts.PythonWASM = os.Getenv("ROLLBOX_PYTHON_WASM")
	}
	if opts.PythonHome == "" {
		opts.PythonHome = os.Getenv("ROLLBOX_PYTHON_HOME")
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
	cache, err := wazero.NewCompilationCacheWithDir(filepath.Join(opts.CacheDir, "wazero"))
	if err != nil {
		return nil, fmt.Errorf("wasm backend: compilation cache: %v: %w", err, sandbox.ErrEngineUnavailable)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().
		WithCloseOnContextDone(true).
		WithCompilationCache(cache))
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		rt.Close(ctx)
		cache.Close(ctx)
		return nil, fmt.Errorf("wasm backend: WASI: %v: %w", err, sandbox.ErrEngineUnavailable)
	}
	return &Backend{
		opts: opts, builder: builder, rt: rt, cache: cache,
		instances: make(chan struct{}, opts.MaxInstances),
		shells:    make(chan struct{}, opts.MaxShells),
		named:     map[string]*program{}, user: map[string]*program{},
	}, nil
}

// Name is "wasm".
func (b *Backend) Name() string { return "wasm" }

// Close releases the runtime and the in-memory part of the compilation
// cache. Sandboxes already handed out fail their next program exec.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	ctx := context.Background()
	err := b.rt.Close(ctx)
	b.cache.Close(ctx)
	return err
}

// Warm builds and compiles the named guest programs now (python, js),
// instead of on first use.
func (b *Backend) Warm(ctx context.Context, names ...string) error {
	for _, n := range names {
		if _, err := b.loadNamed(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

func acquire(ctx context.Context, sem chan struct{}) error {
	select {
	case sem <- struct{}{}:
		return nil
	default:
	}
	select {
	case sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (b *Backend) acquireInstance(ctx context.Context) error { return acquire(ctx, b.instances) }
func (b *Backend) releaseInstance()                          { <-b.instances }

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
