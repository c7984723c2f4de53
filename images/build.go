package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Module is this repository's module path.
const Module = "github.com/rollbox/rollbox"

// ErrNoSource is returned when a program must be built but neither the
// repository's source nor a prebuilt copy can be found.
var ErrNoSource = errors.New("rollbox source not found")

// Builder builds Go programs of this module for a target and caches them by
// the hash of everything that goes into them.
type Builder struct {
	// SourceDir is the module root (the directory holding go.mod).
	SourceDir string
	// CacheDir holds built programs; created on demand.
	CacheDir string
	// Progress, if set, gets one line per build actually run.
	Progress io.Writer

	mu    sync.Mutex
	built map[string]string // target key -> path, this process
	locks map[string]*sync.Mutex
}

// NewBuilder returns a builder over the module found by FindSource, caching in
// DefaultCacheDir. A missing source is reported by Build, not here, so
// prebuilt programs in the cache still work.
func NewBuilder(progress io.Writer) *Builder {
	src, _ := FindSource()
	return &Builder{SourceDir: src, CacheDir: DefaultCacheDir(), Progress: progress}
}

// DefaultCacheDir is the user's cache dir /rollbox (the temporary
// directory's rollbox-cache without one). rollbox honours $ROLLBOX_CACHE
// by setting CacheDir.
func DefaultCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "rollbox")
	}
	return filepath.Join(os.TempDir(), "rollbox-cache")
}

// FindSource finds the module root: the first directory above the working
// directory, or above this executable, whose go.mod declares Module.
// rollbox honours $ROLLBOX_SRC by setting SourceDir.
func FindSource() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	if _, file, _, ok := runtime.Caller(0); ok { // tests and go run from the tree
		starts = append(starts, filepath.Dir(file))
	}
	for _, d := range starts {
		for {
			if isModuleRoot(d) {
				return d, nil
			}
			parent := filepath.Dir(d)
			if parent == d {
				break
			}
			d = parent
		}
	}
	return "", fmt.Errorf("no go.mod for %s above the working directory (set ROLLBOX_SRC): %w", Module, ErrNoSource)
}

func isModuleRoot(d string) bool {
	b, err := os.ReadFile(filepath.Join(d, "go.mod"))
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(first) == "module "+Module
}

// Target is one program to build.
type Target struct {
	// Package is the import path below Module, e.g. "images/guest".
	Package string
	GOOS    string
	GOARCH  string
	// Name is the cached file's base name, e.g. "guest" or "sh.wasm".
	Name string
}

func (t Target) key() string { return t.Package + "|" + t.GOOS + "|" + t.GOARCH }

// Build returns the path of tgt built from the current source, building it
// (once per process and per content hash) when the cache lacks it.
func (b *Builder) Build(ctx context.Context, tgt Target) (string, error) {
	b.mu.Lock()
	if b.built == nil {
		b.built, b.locks = map[string]string{}, map[string]*sync.Mutex{}
	}
	if p, ok := b.built[tgt.key()]; ok {
		b.mu.Unlock()
		return p, nil
	}
	l := b.locks[tgt.key()]
	if l == nil {
		l = &sync.Mutex{}
		b.locks[tgt.key()] = l
	}
	b.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	b.mu.Lock()
	p, ok := b.built[tgt.key()]
	b.mu.Unlock()
	if ok {
		return p, nil
	}
	p, err := b.build(ctx, tgt)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	b.built[tgt.key()] = p
	b.mu.Unlock()
	return p, nil
}

func (b *Builder) build(ctx context.Context, tgt Target) (string, error) {
	if b.SourceDir == "" {
		return "", fmt.Errorf("build %s: %w (set ROLLBOX_SRC to a checkout)", tgt.Package, ErrNoSource)
	}
	if !isModuleRoot(b.SourceDir) {
		return "", fmt.Errorf("build %s: %s holds no go.mod for %s: %w (set ROLLBOX_SRC to a checkout)", tgt.Package, b.SourceDir, Module, ErrNoSource)
	}
	hash, err := b.sourceHash(ctx, tgt)
	if err != nil {
		return "", fmt.Errorf("build %s: %w", tgt.Package, err)
	}
	dir := filepath.Join(b.CacheDir, "bin", tgt.GOOS+"_"+tgt.GOARCH)
	out := filepath.Join(dir, hash[:16]+"-"+tgt.Name)
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if b.Progress != nil {
		fmt.Fprintf(b.Progress, "rollbox: building %s for %s/%s (cached until its source changes)\n", tgt.Package, tgt.GOOS, tgt.GOARCH)
	}
	tmp := fmt.Sprintf("%s.tmp%d", out, os.Getpid())
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, "./"+tgt.Package)
	cmd.Dir = b.SourceDir
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0", "GOOS="+tgt.GOOS, "GOARCH="+tgt.GOARCH, "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("build %s for %s/%s: %v: %s", tgt.Package, tgt.GOOS, tgt.GOARCH, err, strings.TrimSpace(stderr.String()))
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	return out, nil
}

// sourceHash digests every file of every in-module package tgt depends on,
// go.mod, go.sum and the target itself. Which files those are comes from
// go list (0.3-0.6 s a target), or from what an earlier go list found while
// nothing that decides it has changed (see depsMemo); their contents are
// read and hashed every time.
func (b *Builder) sourceHash(ctx context.Context, tgt Target) (string, error) {
	memoPath := filepath.Join(b.CacheDir, "deps", tgt.GOOS+"_"+tgt.GOARCH, strings.ReplaceAll(tgt.Package, "/", "_")+".json")
	files, ok := b.readDepsMemo(memoPath, tgt)
	if !ok {
		var memo depsMemo
		var err error
		files, memo, err = b.listDeps(ctx, tgt)
		if err != nil {
			return "", err
		}
		b.writeDepsMemo(memoPath, memo) // a memo not written is a go list next time
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s %s %s %s\n", runtime.Version(), tgt.Package, tgt.GOOS, tgt.GOARCH)
	for _, f := range files {
		if strings.HasPrefix(f, "module:") {
			fmt.Fprintln(h, f)
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		rel, _ := filepath.Rel(b.SourceDir, f)
		fmt.Fprintf(h, "%s %d\n", rel, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// listDeps asks go list which files go into tgt: the sorted list sourceHash
// digests, and the memo that lets a later build skip asking.
func (b *Builder) listDeps(ctx context.Context, tgt Target) ([]string, depsMemo, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-json=Dir,GoFiles,EmbedFiles,Module", "./"+tgt.Package)
	cmd.Dir = b.SourceDir
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0", "GOOS="+tgt.GOOS, "GOARCH="+tgt.GOARCH, "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, depsMemo{}, fmt.Errorf("go list: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var files []string
	dirs := map[string]bool{b.SourceDir: true} // go.mod, go.sum, go.work
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			Dir        string
			GoFiles    []string
			EmbedFiles []string
			Module     *struct{ Path, Version string }
		}
		if err := dec.Decode(&p); err != nil {
			return nil, depsMemo{}, err
		}
		if p.Module == nil {
			continue // standard library: covered by the Go version
		}
		if p.Module.Path != Module {
			files = append(files, "module:"+p.Module.Path+"@"+p.Module.Version)
			continue
		}
		dirs[p.Dir] = true
		for _, f := range p.GoFiles {
			files = append(files, filepath.Join(p.Dir, f))
		}
		for _, f := range p.EmbedFiles {
			// Embedded directories gain files below the package's own
			// directory: every directory between it and the file counts.
			for d := filepath.Dir(filepath.Join(p.Dir, f)); d != p.Dir && strings.HasPrefix(d, p.Dir); d = filepath.Dir(d) {
				dirs[d] = true
			}
			files = append(files, filepath.Join(p.Dir, f))
		}
	}
	files = append(files, filepath.Join(b.SourceDir, "go.mod"), filepath.Join(b.SourceDir, "go.sum"))
	sort.Strings(files)
	memo := depsMemo{Env: b.listEnv(tgt), Files: files, Dirs: map[string]string{}}
	for d := range dirs {
		fp, err := dirPrint(d)
		if err != nil {
			return files, depsMemo{}, nil // no memo: listed again next time
		}
		memo.Dirs[d] = fp
	}
	return files, memo, nil
}

// depsMemo is what one go list of a target found, kept in the cache. What
// go list answers depends only on the files in the directories of the
// packages it listed (which files exist, their build constraints, their
// imports), go.mod, go.sum and go.work, and the environment: the memo holds
// for as long as every one of those directories lists the same entries with
// the same sizes and modification times, in the same environment. A new
// import is an edit of a listed file, so it shows; a change the metadata
// hides changes nothing go list says about imports only if the file's
// imports stayed, and its contents are hashed anyway.
type depsMemo struct {
	Env   string            `json:"env"`
	Files []string          `json:"files"`
	Dirs  map[string]string `json:"dirs"` // directory -> dirPrint
}

// listEnv is what besides the source decides go list's answer.
func (b *Builder) listEnv(tgt Target) string {
	goBin, _ := exec.LookPath("go")
	var goStamp string
	if st, err := os.Stat(goBin); err == nil {
		goStamp = fmt.Sprintf("%d %d", st.Size(), st.ModTime().UnixNano())
	}
	parts := []string{runtime.Version(), b.SourceDir, tgt.key(), goBin, goStamp}
	for _, k := range []string{"GOFLAGS", "GOEXPERIMENT", "GOWORK", "GOTOOLCHAIN", "GOROOT", "GOPATH", "GOAMD64", "GOARM64"} {
		parts = append(parts, k+"="+os.Getenv(k))
	}
	return strings.Join(parts, "\x00")
}

// dirPrint fingerprints a directory's entries: names, kinds, and for files
// size and modification time.
func dirPrint(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return "", err
		}
		if e.IsDir() {
			fmt.Fprintf(h, "d %s\n", e.Name())
			continue
		}
		fmt.Fprintf(h, "f %s %v %d %d\n", e.Name(), fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// readDepsMemo returns the memo's file list if it still holds.
func (b *Builder) readDepsMemo(path string, tgt Target) ([]string, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	var m depsMemo
	if json.Unmarshal(data, &m) != nil || len(m.Files) == 0 || len(m.Dirs) == 0 {
		return nil, false
	}
	if m.Env != b.listEnv(tgt) {
		return nil, false
	}
	for d, want := range m.Dirs {
		if got, err := dirPrint(d); err != nil || got != want {
			return nil, false
		}
	}
	return m.Files, true
}

// writeDepsMemo stores a memo, atomically; it is only ever a shortcut.
func (b *Builder) writeDepsMemo(path string, m depsMemo) {
	if len(m.Dirs) == 0 {
		return
	}
	data, err := json.Marshal(m)
	if err != nil {
		return
	}
	if os.MkdirAll(filepath.Dir(path), 0o755) != nil {
		return
	}
	tmp := fmt.Sprintf("%s.tmp%d", path, os.Getpid())
	if os.WriteFile(tmp, data, 0o644) != nil || os.Rename(tmp, path) != nil {
		os.Remove(tmp)
	}
}

// CleanupPartial removes the half-written programs that builds killed midway
// left in the cache (NAME.tmpPID whose process is gone) and returns their
// paths. Built programs are the cache, not leftovers: they stay.
func (b *Builder) CleanupPartial() ([]string, error) {
	var matches []string
	for _, dir := range []string{"bin", "deps"} {
		m, err := filepath.Glob(filepath.Join(b.CacheDir, dir, "*", "*.tmp*"))
		if err != nil {
			return nil, err
		}
		matches = append(matches, m...)
	}
	var removed []string
	var errs []error
	for _, m := range matches {
		i := strings.LastIndex(m, ".tmp")
		pid, err := strconv.Atoi(m[i+len(".tmp"):])
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		if err := os.Remove(m); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, m)
	}
	return removed, errors.Join(errs...)
}

// processAlive reports whether pid names a live process (or one we may not
// signal, which is alive too).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
