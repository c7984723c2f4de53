package wasm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/helper"
)

// Guest programs built from images/wasm.
var guests = map[string]string{
	"python": "images/wasm/python",
	"js":     "images/wasm/js",
}

// helperPackage is the helper program, built like the guests.
const helperPackage = "sandbox/wasm/internal/helper/cmd"

// loading is one program being built and compiled into the on-disk cache.
// Its work runs in a context of its own: one caller's cancellation does not
// fail the others waiting for it.
type loading struct {
	done chan struct{}
	prog helper.Program
	err  error
}

// program resolves a named program for a helper: the path of its module
// (built from this module's source for the guests), compiled into the
// on-disk cache by this process first so that helpers, which may only read
// the cache, load it without compiling. A name that is no program wraps
// fs.ErrNotExist; any other error is the runtime's.
func (b *Backend) program(ctx context.Context, name string) (helper.Program, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return helper.Program{}, fmt.Errorf("wasm backend closed")
	}
	l := b.named[name]
	if l == nil {
		l = &loading{done: make(chan struct{})}
		b.named[name] = l
		go b.load(name, l)
	}
	b.mu.Unlock()
	select {
	case <-l.done:
	case <-ctx.Done():
		return helper.Program{}, context.Cause(ctx)
	}
	if l.err != nil {
		// Let a later call try again.
		b.mu.Lock()
		if b.named[name] == l {
			delete(b.named, name)
		}
		b.mu.Unlock()
	}
	return l.prog, l.err
}

func (b *Backend) load(name string, l *loading) {
	defer close(l.done)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var prog helper.Program
	switch {
	case name == "python" && b.opts.PythonWASM != "":
		prog = helper.Program{Argv0: "python3", Path: b.opts.PythonWASM}
		if b.opts.PythonHome != "" {
			prog.Mounts = map[string]string{b.opts.PythonHome: "/usr/local"}
			prog.Env = []string{"PYTHONHOME=/usr/local"}
		}
	case b.opts.Programs[name] != "":
		prog = helper.Program{Path: b.opts.Programs[name]}
	case guests[name] != "":
		p, err := b.builder.Build(ctx, images.Target{Package: guests[name], GOOS: "wasip1", GOARCH: "wasm", Name: name + ".wasm"})
		if err != nil {
			l.err = fmt.Errorf("build %s: %w", guests[name], err)
			return
		}
		prog = helper.Program{Path: p}
	default:
		l.err = fmt.Errorf("no program %q: %w", name, fs.ErrNotExist)
		return
	}
	if err := b.compileToCache(ctx, prog.Path, name); err != nil {
		l.err = err
		return
	}
	l.prog = prog
}

// compileToCache compiles a module into the on-disk cache with the helper
// program itself (same wazero build, same configuration: the cache key
// depends on both), so the confined helpers, which may only read the
// cache, load it without compiling. A compile this cache already holds
// (compileMark) is not run again: on a hit the subprocess still reads and
// decodes the whole module (0.5-1.1 s for the guests).
func (b *Backend) compileToCache(ctx context.Context, p, name string) error {
	argv, err := b.helperCommand(ctx)
	if err != nil {
		return err
	}
	mark := compileMark{cacheDir: b.opts.CacheDir, helper: argv[0], module: p}
	if mark.holds() {
		return nil
	}
	b.compiles.Add(1)
	start := time.Now()
	cmd := exec.CommandContext(ctx, argv[0], "compile", b.opts.CacheDir, p)
	cmd.Env = []string{"GOTRACEBACK=single"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("compile %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	if el := time.Since(start); el > 2*time.Second && b.opts.Progress != nil {
		fmt.Fprintf(b.opts.Progress, "rollbox: compiled %s in %v (cached on disk until it changes)\n", name, el.Round(time.Millisecond))
	}
	mark.write()
	return nil
}

// compileMark records that a helper compiled a module into the cache: the
// helper's and the module's files (size, modification time) and what the
// compilation cache held afterwards (each file's name and size: wazero
// names them by content and never rewrites one). It holds while all of
// that reads the same, so a cache emptied or trimmed, another helper or a
// rewritten module compiles again.
type compileMark struct {
	cacheDir, helper, module string
}

type compileRecord struct {
	Helper, Module string
	Cache          map[string]int64
}

func (m compileMark) path() string {
	sum := sha256.Sum256([]byte(m.helper + "\x00" + m.module))
	return filepath.Join(m.cacheDir, "compiled", hex.EncodeToString(sum[:8])+".json")
}

func (m compileMark) record() (compileRecord, error) {
	r := compileRecord{Cache: map[string]int64{}}
	for _, f := range []struct {
		path string
		to   *string
	}{{m.helper, &r.Helper}, {m.module, &r.Module}} {
		st, err := os.Stat(f.path)
		if err != nil {
			return r, err
		}
		*f.to = fmt.Sprintf("%s %d %d", f.path, st.Size(), st.ModTime().UnixNano())
	}
	root := filepath.Join(m.cacheDir, "wazero")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		r.Cache[rel] = fi.Size()
		return nil
	})
	return r, err
}

func (m compileMark) holds() bool {
	data, err := os.ReadFile(m.path())
	if err != nil {
		return false
	}
	var want compileRecord
	if json.Unmarshal(data, &want) != nil || len(want.Cache) == 0 {
		return false
	}
	got, err := m.record()
	if err != nil || got.Helper != want.Helper || got.Module != want.Module {
		return false
	}
	for name, size := range want.Cache {
		if got.Cache[name] != size {
			return false
		}
	}
	return true
}

// write stores the mark, atomically; a mark not written is a compile next
// time, nothing worse.
func (m compileMark) write() {
	r, err := m.record()
	if err != nil || len(r.Cache) == 0 {
		return
	}
	data, err := json.Marshal(r)
	if err != nil || os.MkdirAll(filepath.Dir(m.path()), 0o755) != nil {
		return
	}
	tmp := fmt.Sprintf("%s.tmp%d", m.path(), os.Getpid())
	if os.WriteFile(tmp, data, 0o644) != nil || os.Rename(tmp, m.path()) != nil {
		os.Remove(tmp)
	}
}

// helperCommand returns the helper program, building it on first use (a
// failed build is tried again by the next caller: nothing is cached but
// success).
func (b *Backend) helperCommand(ctx context.Context) ([]string, error) {
	if b.opts.HelperPath != "" {
		return []string{b.opts.HelperPath}, nil
	}
	b.mu.Lock()
	l := b.helperBuild
	if l == nil {
		l = &loading{done: make(chan struct{})}
		b.helperBuild = l
		go func() {
			defer close(l.done)
			bctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			defer cancel()
			l.prog.Path, l.err = b.builder.Build(bctx, images.Target{Package: helperPackage, GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, Name: "wasm-helper"})
		}()
	}
	b.mu.Unlock()
	select {
	case <-l.done:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	if l.err != nil {
		b.mu.Lock()
		if b.helperBuild == l {
			b.helperBuild = nil
		}
		b.mu.Unlock()
		return nil, fmt.Errorf("build the WASM helper: %w", l.err)
	}
	return []string{l.prog.Path}, nil
}
