package helper

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
	"golang.org/x/sys/unix"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/shell"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// aliases map command names to the guest programs the host builds.
var aliases = map[string]string{
	"python": "python", "python3": "python", "js": "js", "node": "js", "nodejs": "js",
}

// maxUserModules bounds the compiled episode modules kept in memory.
const maxUserModules = 16

// programs compiles and keeps the WASI modules of this helper: the host's
// guest programs (compiled by the host into the on-disk cache, which this
// runtime only reads) and modules found in episodes (compiled in a runtime
// of their own, never written to disk).
type programs struct {
	rt     wazero.Runtime
	userRT wazero.Runtime

	mu    sync.Mutex
	named map[string]*program // by host path
	user  map[[32]byte]*program
	order [][32]byte // user modules, oldest first
}

// program is a compiled module; refs counts the instances of it running,
// so a module is never closed under one.
type program struct {
	compiled wazero.CompiledModule
	refs     int
	evicted  bool
}

func newPrograms(cacheDir string) (*programs, error) {
	ctx := context.Background()
	cfg := wazero.NewRuntimeConfig().WithCloseOnContextDone(true)
	named := cfg
	if cacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(filepath.Join(cacheDir, "wazero"))
		if err != nil {
			return nil, fmt.Errorf("compilation cache: %w", err)
		}
		named = cfg.WithCompilationCache(cache)
	}
	p := &programs{rt: wazero.NewRuntimeWithConfig(ctx, named), userRT: wazero.NewRuntimeWithConfig(ctx, cfg),
		named: map[string]*program{}, user: map[[32]byte]*program{}}
	for _, rt := range []wazero.Runtime{p.rt, p.userRT} {
		if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
			return nil, fmt.Errorf("WASI: %w", err)
		}
	}
	return p, nil
}

// loadNamed compiles a guest program from its host path (a cache hit on
// disk, as the host compiled it first), once per helper.
func (p *programs) loadNamed(ctx context.Context, hostPath string) (*program, error) {
	p.mu.Lock()
	pr := p.named[hostPath]
	p.mu.Unlock()
	if pr != nil {
		return pr, nil
	}
	data, err := os.ReadFile(hostPath)
	if err != nil {
		return nil, err
	}
	m, err := p.rt.CompileModule(context.WithoutCancel(ctx), data)
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", path.Base(hostPath), err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.named[hostPath]; old != nil {
		m.Close(ctx)
		return old, nil
	}
	pr = &program{compiled: m}
	p.named[hostPath] = pr
	return pr, nil
}

// loadUser compiles a module of the episode, by content; the oldest unused
// ones are evicted past maxUserModules.
func (p *programs) loadUser(ctx context.Context, data []byte) (*program, error) {
	key := sha256.Sum256(data)
	p.mu.Lock()
	if pr := p.user[key]; pr != nil {
		pr.refs++
		p.mu.Unlock()
		return pr, nil
	}
	p.mu.Unlock()
	m, err := p.userRT.CompileModule(ctx, data)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr := p.user[key]; pr != nil {
		m.Close(ctx)
		pr.refs++
		return pr, nil
	}
	pr := &program{compiled: m, refs: 1}
	p.user[key] = pr
	p.order = append(p.order, key)
	for len(p.order) > maxUserModules {
		old := p.user[p.order[0]]
		delete(p.user, p.order[0])
		p.order = p.order[1:]
		old.evicted = true
		if old.refs == 0 {
			old.compiled.Close(context.Background())
		}
	}
	return pr, nil
}

// done ends one use of a user module, closing it if it was evicted meanwhile.
func (p *programs) done(pr *program) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr.refs--
	if pr.evicted && pr.refs == 0 {
		pr.compiled.Close(context.Background())
	}
}

// execPrograms runs the external programs of one exec: it implements the
// shell's ProgramRunner.
type execPrograms struct {
	progs    *programs
	cl       *caller
	exec     uint64
	fs       vfs.FileSystem
	memLimit uint64
	clock    *execClock
	names    map[string]bool // programs the host registered by name (Init.Programs)

	mu       sync.Mutex
	trap     string
	oom      bool
	internal error
}

func (e *execPrograms) result() (trap string, oom bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.trap, e.oom
}

func (e *execPrograms) internalErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.internal
}

func (e *execPrograms) Lookup(fsys shell.FS, dir, name string) (string, bool) {
	if n, ok := aliases[name]; ok {
		return n, true
	}
	if e.names[name] {
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
	name := p.Args[0]
	var pr *program
	var mounts map[string]string
	var env []string
	if path.IsAbs(name) {
		e.clock.waitStart()
		data, err := e.fs.ReadFile(name, 256<<20)
		if err == nil && !bytes.HasPrefix(data, []byte("\x00asm")) {
			err = fmt.Errorf("%s is not a WebAssembly module", name)
		}
		if err == nil {
			pr, err = e.progs.loadUser(ctx, data)
		}
		e.clock.waitEnd(false)
		if err != nil {
			fmt.Fprintf(p.Stderr, "%s: %v\n", name, err)
			return 126, nil
		}
		defer e.progs.done(pr)
	} else {
		// The host builds and compiles guests; the wait is the runtime's,
		// not the command's.
		e.clock.waitStart()
		prog, err := e.resolve(name)
		if err == nil {
			pr, err = e.progs.loadNamed(ctx, prog.Path)
		}
		e.clock.waitEnd(false)
		if err != nil {
			if ctx.Err() != nil {
				return 0, context.Cause(ctx)
			}
			if errors.Is(err, fs.ErrNotExist) {
				fmt.Fprintf(p.Stderr, "sh: %s: command not found\n", name)
				return 127, nil
			}
			// The program could not be loaded: the runtime failed, not the
			// command.
			e.mu.Lock()
			if e.internal == nil {
				e.internal = fmt.Errorf("load %s: %w", name, err)
			}
			e.mu.Unlock()
			return 0, err
		}
		mounts, env = prog.Mounts, prog.Env
		if prog.Argv0 != "" {
			name = prog.Argv0
		}
	}
	e.clock.waitStart()
	_, err := e.cl.call(e.exec, opSlot, nil)
	e.clock.waitEnd(err == nil)
	if err != nil {
		return 0, err
	}
	defer e.clock.runEnd()
	defer e.cl.notify(e.exec, opSlotRelease, nil)

	fsc := wazero.NewFSConfig().(sysfs.FSConfig).WithSysFSMount(vfs.SysFS(e.fs), "/")
	for host, guest := range mounts {
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
	for _, kv := range append(append(append([]string(nil), p.Env...), "PWD="+p.Dir), env...) {
		k, v, _ := strings.Cut(kv, "=")
		cfg = cfg.WithEnv(k, v)
	}
	var oom atomic.Bool
	alloc := &capAllocator{limit: e.memLimit, oom: &oom}
	ictx := experimental.WithMemoryAllocator(ctx, alloc)
	rt := e.progs.rt
	if path.IsAbs(p.Args[0]) {
		rt = e.progs.userRT
	}
	mod, err := rt.InstantiateModule(ictx, pr.compiled, cfg)
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

// resolve asks the host for a guest program.
func (e *execPrograms) resolve(name string) (Program, error) {
	d, err := e.cl.call(e.exec, opProgram, func(en *encoder) { en.str(name) })
	if err != nil {
		return Program{}, err
	}
	prog := Program{Argv0: d.str(256), Path: d.str(maxPath)}
	mounts := d.strs(64, maxPath)
	prog.Env = d.strs(64, maxPath)
	if err := d.done(); err != nil {
		return Program{}, err
	}
	if len(mounts) > 0 {
		prog.Mounts = map[string]string{}
		for i := 0; i+1 < len(mounts); i += 2 {
			prog.Mounts[mounts[i]] = mounts[i+1]
		}
	}
	return prog, nil
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
// The memory is one reservation of the cap's address space (no pages
// until touched) made readable and writable as it grows: growing never
// copies, so an instance holds at most its cap, not the old buffer beside
// the new.
type capAllocator struct {
	limit uint64
	oom   *atomic.Bool
}

func (a *capAllocator) Allocate(capacity, maximum uint64) experimental.LinearMemory {
	return &linearMemory{limit: min(a.limit, maximum), oom: a.oom}
}

type linearMemory struct {
	res   []byte // the reservation
	size  uint64 // committed
	limit uint64
	oom   *atomic.Bool
}

const pageSize = 64 << 10

func (m *linearMemory) Reallocate(size uint64) []byte {
	if size > m.limit {
		m.oom.Store(true)
		if m.res != nil {
			return nil
		}
		// The module's declared minimum is above the cap: wazero needs a
		// buffer to instantiate, the exec is reported as OOM.
		return make([]byte, size)
	}
	if m.res == nil {
		n := (m.limit + pageSize - 1) / pageSize * pageSize
		if n == 0 {
			n = pageSize
		}
		res, err := unix.Mmap(-1, 0, int(n), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
		if err != nil {
			m.oom.Store(true)
			return nil
		}
		m.res = res
	}
	if size > m.size {
		lo := m.size / pageSize * pageSize
		hi := (size + pageSize - 1) / pageSize * pageSize
		if err := unix.Mprotect(m.res[lo:hi], unix.PROT_READ|unix.PROT_WRITE); err != nil {
			m.oom.Store(true)
			return nil
		}
		m.size = size
	}
	return m.res[:size:size]
}

func (m *linearMemory) Free() {
	if m.res != nil {
		unix.Munmap(m.res)
		m.res = nil
	}
}
