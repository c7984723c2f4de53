package wasm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/shell"
)

// Guest programs built from images/wasm.
var guests = map[string]string{
	"python": "images/wasm/python",
	"js":     "images/wasm/js",
}

// aliases map command names to guest or registered programs.
var aliases = map[string]string{
	"python": "python", "python3": "python", "js": "js", "node": "js", "nodejs": "js",
}

// program is a compiled module, ready to instantiate.
type program struct {
	once     sync.Once
	compiled wazero.CompiledModule
	err      error
	// mounts are read-only host directories the program needs (CPython's
	// standard library), host path → guest path.
	mounts map[string]string
	env    []string
}

// maxUserModules bounds the compiled user modules kept in memory.
const maxUserModules = 16

// loadNamed compiles a named program on first use: a guest built from this
// module's source, CPython when configured, or a registered .wasm.
func (b *Backend) loadNamed(ctx context.Context, name string) (*program, error) {
	b.mu.Lock()
	p := b.named[name]
	if p == nil {
		p = &program{}
		b.named[name] = p
	}
	b.mu.Unlock()
	p.once.Do(func() {
		var wasmPath string
		switch {
		case name == "python" && b.opts.PythonWASM != "":
			wasmPath = b.opts.PythonWASM
			if b.opts.PythonHome != "" {
				p.mounts = map[string]string{b.opts.PythonHome: "/usr/local"}
				p.env = []string{"PYTHONHOME=/usr/local"}
			}
		case b.opts.Programs[name] != "":
			wasmPath = b.opts.Programs[name]
		case guests[name] != "":
			wasmPath, p.err = b.builder.Build(ctx, images.Target{Package: guests[name], GOOS: "wasip1", GOARCH: "wasm", Name: name + ".wasm"})
			if p.err != nil {
				return
			}
		default:
			p.err = fmt.Errorf("no program %q", name)
			return
		}
		var data []byte
		if data, p.err = os.ReadFile(wasmPath); p.err != nil {
			return
		}
		p.compiled, p.err = b.compile(ctx, data, name)
	})
	if p.err != nil {
		// Let a later call retry a failed build.
		b.mu.Lock()
		if b.named[name] == p {
			delete(b.named, name)
		}
		b.mu.Unlock()
	}
	return p, p.err
}

func (b *Backend) compile(ctx context.Context, data []byte, name string) (wazero.CompiledModule, error) {
	start := time.Now()
	m, err := b.rt.CompileModule(ctx, data)
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", name, err)
	}
	if el := time.Since(start); el > 2*time.Second && b.opts.Progress != nil {
		fmt.Fprintf(b.opts.Progress, "rollbox: compiled %s in %v (cached on disk afterwards)\n", name, el.Round(time.Millisecond))
	}
	return m, nil
}

// loadUser compiles a .wasm file from an episode's filesystem, caching by
// content.
func (b *Backend) loadUser(ctx context.Context, fsys shell.FS, p string) (*program, error) {
	data, err := fsys.ReadFile(p, 256<<20)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(data, []byte("\x00asm")) {
		return nil, fmt.Errorf("%s is not a WebAssembly module", p)
	}
	sum := sha256.Sum256(data)
	key := string(sum[:])
	b.mu.Lock()
	if pr := b.user[key]; pr != nil {
		b.mu.Unlock()
		return pr, nil
	}
	b.mu.Unlock()
	m, err := b.compile(ctx, data, path.Base(p))
	if err != nil {
		return nil, err
	}
	pr := &program{compiled: m}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old := b.user[key]; old != nil {
		m.Close(ctx)
		return old, nil
	}
	if len(b.user) >= maxUserModules {
		for k, old := range b.user { // evict one; a running instance keeps its own reference
			delete(b.user, k)
			go old.compiled.Close(context.Background())
			break
		}
	}
	b.user[key] = pr
	return pr, nil
}

// execPrograms runs external programs for one Exec.
type execPrograms struct {
	b        *Backend
	sb       *Sandbox
	memLimit uint64
	// clock does not count the wait for an instance slot.
	clock *execClock

	mu   sync.Mutex
	trap string
	oom  bool
}

func (e *execPrograms) Lookup(fsys shell.FS, dir, name string) (string, bool) {
	if n, ok := aliases[name]; ok {
		return n, true
	}
	if _, ok := e.b.opts.Programs[name]; ok {
		return name, true
	}
	if strings.HasSuffix(name, ".wasm") {
		p := name
		if !path.IsAbs(p) {
			p = path.Join(dir, p)
		}
		if fi, err := fsys.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, true
		}
	}
	return "", false
}

// Run instantiates the program against the episode's filesystem.
func (e *execPrograms) Run(ctx context.Context, p shell.Proc) (int, error) {
	var prog *program
	var err error
	name := p.Args[0]
	if path.IsAbs(name) {
		prog, err = e.b.loadUser(ctx, e.sb.fs, name)
		if err != nil {
			fmt.Fprintf(p.Stderr, "%s: %v\n", name, err)
			return 126, nil
		}
	} else {
		prog, err = e.b.loadNamed(ctx, name)
		if err != nil {
			return 0, err
		}
		if name == "python" && e.b.opts.PythonWASM != "" {
			name = "python3"
		}
	}
	e.clock.waitStart()
	err = e.b.acquireInstance(ctx)
	e.clock.waitEnd(err == nil)
	if err != nil {
		return 0, err
	}
	defer e.clock.runEnd()
	defer e.b.releaseInstance()

	fsc := wazero.NewFSConfig().(sysfs.FSConfig).WithSysFSMount(e.sb.fs.SysFS(), "/")
	for host, guest := range prog.mounts {
		fsc = fsc.WithReadOnlyDirMount(host, guest)
	}
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithArgs(append([]string{name}, p.Args[1:]...)...).
		WithStdin(p.Stdin).WithStdout(p.Stdout).WithStderr(p.Stderr).
		WithFSConfig(fsc).
		WithSysWalltime().WithSysNanotime().
		WithNanosleep(func(ns int64) { sleepCtx(ctx, ns) }).
		WithRandSource(rand.Reader)
	env := append(append([]string(nil), p.Env...), "PWD="+p.Dir)
	env = append(env, prog.env...)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		cfg = cfg.WithEnv(k, v)
	}
	var oom atomic.Bool
	alloc := &capAllocator{limit: e.memLimit, oom: &oom}
	ictx := experimental.WithMemoryAllocator(ctx, alloc)
	mod, err := e.b.rt.InstantiateModule(ictx, prog.compiled, cfg)
	if mod != nil {
		mod.Close(context.WithoutCancel(ctx))
	}
	code := 0
	var exit *sys.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = int(exit.ExitCode())
		if exit.ExitCode() == sys.ExitCodeDeadlineExceeded || exit.ExitCode() == sys.ExitCodeContextCanceled {
			if ctx.Err() != nil {
				return 0, context.Cause(ctx)
			}
		}
	case ctx.Err() != nil:
		return 0, context.Cause(ctx)
	default:
		// A trap, or a module that is not a WASI command: a result of
		// the command, not a failure of the sandbox.
		e.mu.Lock()
		e.trap = trapText(err)
		e.mu.Unlock()
		fmt.Fprintf(p.Stderr, "%s: %s\n", path.Base(p.Args[0]), trapText(err))
		code = 134
	}
	if oom.Load() && code != 0 {
		e.mu.Lock()
		e.oom = true
		if e.trap == "" {
			e.trap = fmt.Sprintf("memory.grow refused: the module asked for more than the %d MB memory limit", e.memLimit>>20)
		}
		e.mu.Unlock()
		code = 137
	}
	return code, nil
}

func trapText(err error) string {
	s := err.Error()
	if i := strings.Index(s, "\nwasm stack trace:"); i > 0 {
		s = s[:i]
	}
	return strings.TrimPrefix(s, "wasm error: ")
}

func sleepCtx(ctx context.Context, ns int64) {
	t := time.NewTimer(time.Duration(ns))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// capAllocator gives each linear memory a hard cap: a memory.grow past it
// fails (the module sees -1) and the exec is reported as out of memory.
type capAllocator struct {
	limit uint64
	oom   *atomic.Bool
}

func (a *capAllocator) Allocate(capacity, maximum uint64) experimental.LinearMemory {
	return &linearMemory{limit: min(a.limit, maximum), oom: a.oom}
}

type linearMemory struct {
	buf   []byte
	limit uint64
	oom   *atomic.Bool
}

func (m *linearMemory) Reallocate(size uint64) []byte {
	if size > m.limit {
		m.oom.Store(true)
		if m.buf != nil {
			return nil
		}
		// The module's declared minimum is above the cap: wazero needs a
		// buffer to instantiate, the exec is reported as OOM.
	}
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
		return m.buf
	}
	c := max(size, min(2*uint64(cap(m.buf)), m.limit))
	nb := make([]byte, size, c)
	copy(nb, m.buf)
	m.buf = nb
	return nb
}

func (m *linearMemory) Free() { m.buf = nil }

var _ api.Module = nil
