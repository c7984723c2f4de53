// Package vfs is the in-memory filesystem that holds an episode's state in
// the WASM backend. It is the only filesystem an episode's commands see:
// the host-side shell's builtins use its Go API and WASI modules reach it
// through SysFS. Nothing in it touches the host filesystem, so ".." and
// symlinks can only ever resolve to other nodes of the same tree (they are
// clamped at its root). Every byte of file data and every node is charged
// against a quota, so an episode's files cost bounded memory.
package vfs

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"maps"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// NodeOverhead is what each file, directory or symlink is charged against
// the quota beyond its data, so that millions of empty files are refused too.
const NodeOverhead = 256

// maxSymlinkHops bounds symlink resolution, like Linux's 40.
const maxSymlinkHops = 40

// device kinds of character-device nodes under /dev.
type device uint8

const (
	devNone device = iota
	devNull
	devZero
	devRandom
)

type node struct {
	mode     fs.FileMode // type bits and permissions
	mtime    int64       // unix nanoseconds
	ino      uint64
	data     []byte           // regular files
	children map[string]*node // directories
	target   string           // symlinks
	dev      device
	// gen is the generation of the FS that may change this node in place;
	// a node of another generation is shared with a clone and is copied
	// before it changes (see Clone).
	gen uint64
	// dataShared: data's backing array is shared with a clone's copy of
	// this node, so it is copied before it is written.
	dataShared bool
}

// generations numbers the owners of nodes (see Clone).
var generations atomic.Uint64

func (n *node) isDir() bool     { return n.mode.IsDir() }
func (n *node) isSymlink() bool { return n.mode&fs.ModeSymlink != 0 }
func (n *node) isRegular() bool { return n.mode.IsRegular() }

// FS is one episode's filesystem. The zero value is not usable; call New.
// Safe for concurrent use.
type FS struct {
	mu      sync.RWMutex
	root    *node
	used    int64 // bytes charged: data plus NodeOverhead per node
	limit   int64
	nextIno uint64
	now     func() time.Time
	gen     uint64 // the generation of the nodes this FS may change in place
}

// New returns a filesystem holding at most limit bytes (data plus
// NodeOverhead per node), with /dev/null, /dev/zero, /dev/urandom and
// /dev/random, and the directories dirs (made with their parents).
func New(limit int64, dirs ...string) *FS {
	f := &FS{limit: limit, now: time.Now, gen: generations.Add(1)}
	f.root = f.newNode(fs.ModeDir | 0o755)
	dev := f.newNode(fs.ModeDir | 0o755)
	f.root.children["dev"] = dev
	for name, d := range map[string]device{"null": devNull, "zero": devZero, "urandom": devRandom, "random": devRandom} {
		n := f.newNode(fs.ModeDevice | fs.ModeCharDevice | 0o666)
		n.dev = d
		dev.children[name] = n
	}
	for _, d := range dirs {
		f.MkdirAll(d, 0o755)
	}
	f.used = 0 // the skeleton is free
	return f
}

func (f *FS) newNode(mode fs.FileMode) *node {
	f.nextIno++
	n := &node{mode: mode, mtime: f.now().UnixNano(), ino: f.nextIno, gen: f.gen}
	if mode.IsDir() {
		n.children = map[string]*node{}
	}
	return n
}

// Drop empties the filesystem and refuses growth from then on, releasing
// every file's memory.
func (f *FS) Drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	// A new root, not the old one emptied: a clone may share the old.
	f.root = f.newNode(fs.ModeDir | 0o755)
	f.used, f.limit = 0, 0
}

// Used reports the bytes charged against the quota.
func (f *FS) Used() int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.used
}

// Limit reports the quota.
func (f *FS) Limit() int64 { return f.limit }

// charge adds delta bytes to the quota, refusing growth past the limit.
// Callers hold mu for writing.
func (f *FS) charge(delta int64) error {
	if delta > 0 && f.used+delta > f.limit {
		return syscall.ENOSPC
	}
	f.used += delta
	return nil
}

// split cleans an absolute path into its components. ".." is kept for the
// walk to resolve (clamped at the root).
func split(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." {
			continue
		}
		out = append(out, c)
	}
	return out
}

// walk resolves p. With followLast the final component is resolved through
// symlinks too. It returns the node (nil when the last component does not
// exist but its parent does), its parent directory and its name.
func (f *FS) walk(p string, followLast bool) (n, parent *node, name string, err error) {
	hops := 0
	return f.walkFrom(f.root, nil, split(p), followLast, false, &hops)
}

// walkMut is walk for a change: every node on the way, the one found
// included, is this FS's own (copied from a clone's shared tree first), so
// the caller may change the node and its parent in place. Callers hold mu
// for writing.
func (f *FS) walkMut(p string, followLast bool) (n, parent *node, name string, err error) {
	hops := 0
	if f.root.gen != f.gen {
		f.root = f.copyNode(f.root)
	}
	return f.walkFrom(f.root, nil, split(p), followLast, true, &hops)
}

// copyNode is this FS's own copy of a node shared with a clone: a
// directory's entries are copied (the children stay shared until they
// change), a file's data is shared until it is written.
func (f *FS) copyNode(n *node) *node {
	cp := *n
	cp.gen = f.gen
	if n.children != nil {
		cp.children = maps.Clone(n.children)
	}
	if n.data != nil {
		cp.dataShared = true
	}
	return &cp
}

// ownData gives n a backing array of its own before its data is written.
func (n *node) ownData() {
	if n.dataShared {
		n.data = bytes.Clone(n.data)
		n.dataShared = false
	}
}

func (f *FS) walkFrom(cur *node, stack []*node, comps []string, followLast, mut bool, hops *int) (n, parent *node, name string, err error) {
	// stack holds the ancestors of cur, for "..".
	if len(comps) == 0 {
		var par *node
		if len(stack) > 0 {
			par = stack[len(stack)-1]
		}
		return cur, par, "", nil
	}
	for i, c := range comps {
		last := i == len(comps)-1
		if !cur.isDir() {
			return nil, nil, "", syscall.ENOTDIR
		}
		if c == ".." {
			if len(stack) > 0 {
				cur, stack = stack[len(stack)-1], stack[:len(stack)-1]
			}
			if last {
				var par *node
				if len(stack) > 0 {
					par = stack[len(stack)-1]
				}
				return cur, par, "", nil
			}
			continue
		}
		next := cur.children[c]
		if mut && next != nil && next.gen != f.gen {
			next = f.copyNode(next)
			cur.children[c] = next
		}
		if next == nil {
			if last {
				return nil, cur, c, nil
			}
			return nil, nil, "", syscall.ENOENT
		}
		if next.isSymlink() && (!last || followLast) {
			if *hops++; *hops > maxSymlinkHops {
				return nil, nil, "", syscall.ELOOP
			}
			tcomps := split(next.target)
			base, bstack := cur, stack
			if strings.HasPrefix(next.target, "/") {
				base, bstack = f.root, nil
			}
			rest := append(tcomps, comps[i+1:]...)
			if len(rest) == 0 {
				return base, nil, "", nil
			}
			return f.walkFrom(base, append([]*node(nil), bstack...), rest, followLast, mut, hops)
		}
		if last {
			return next, cur, c, nil
		}
		stack = append(stack, cur)
		cur = next
	}
	panic("unreachable")
}

func pathErr(op, p string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: p, Err: err}
}

// Stat follows symlinks.
func (f *FS) Stat(p string) (fs.FileInfo, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n, _, name, err := f.walk(p, true)
	if err == nil && n == nil {
		err = syscall.ENOENT
	}
	if err != nil {
		return nil, pathErr("stat", p, err)
	}
	return f.info(n, nameOf(p, name)), nil
}

// Lstat does not follow a final symlink.
func (f *FS) Lstat(p string) (fs.FileInfo, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n, _, name, err := f.walk(p, false)
	if err == nil && n == nil {
		err = syscall.ENOENT
	}
	if err != nil {
		return nil, pathErr("lstat", p, err)
	}
	return f.info(n, nameOf(p, name)), nil
}

func nameOf(p, name string) string {
	if name != "" {
		return name
	}
	if b := path.Base(path.Clean("/" + p)); b != "" {
		return b
	}
	return "/"
}

// Mkdir makes one directory.
func (f *FS) Mkdir(p string, perm fs.FileMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return pathErr("mkdir", p, f.mkdirLocked(p, perm))
}

func (f *FS) mkdirLocked(p string, perm fs.FileMode) error {
	n, parent, name, err := f.walkMut(p, false)
	if err != nil {
		return err
	}
	if n != nil {
		return syscall.EEXIST
	}
	if err := f.charge(NodeOverhead + int64(len(name))); err != nil {
		return err
	}
	parent.children[name] = f.newNode(fs.ModeDir | perm.Perm())
	parent.mtime = f.now().UnixNano()
	return nil
}

// MkdirAll makes a directory and its missing parents.
func (f *FS) MkdirAll(p string, perm fs.FileMode) error {
	comps := split(path.Clean("/" + p))
	cur := ""
	for _, c := range comps {
		cur += "/" + c
		st, err := f.Stat(cur)
		if err == nil {
			if !st.IsDir() {
				return pathErr("mkdir", cur, syscall.ENOTDIR)
			}
			continue
		}
		if err := f.Mkdir(cur, perm); err != nil && !errors.Is(err, syscall.EEXIST) {
			return err
		}
	}
	return nil
}

// ReadDir lists a directory (following symlinks), sorted by name.
func (f *FS) ReadDir(p string) ([]fs.DirEntry, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n, _, _, err := f.walk(p, true)
	if err == nil && n == nil {
		err = syscall.ENOENT
	}
	if err == nil && !n.isDir() {
		err = syscall.ENOTDIR
	}
	if err != nil {
		return nil, pathErr("readdir", p, err)
	}
	return f.entries(n), nil
}

func (f *FS) entries(n *node) []fs.DirEntry {
	out := make([]fs.DirEntry, 0, len(n.children))
	for name, c := range n.children {
		out = append(out, fs.FileInfoToDirEntry(f.info(c, name)))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// Remove removes a file, a symlink or an empty directory.
func (f *FS) Remove(p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return pathErr("remove", p, f.removeLocked(p, false))
}

// RemoveAll removes p and everything under it; a missing p is no error.
func (f *FS) RemoveAll(p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.removeLocked(p, true)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return pathErr("remove", p, err)
}

func (f *FS) removeLocked(p string, all bool) error {
	n, parent, name, err := f.walkMut(p, false)
	if err != nil {
		return err
	}
	if n == nil {
		return syscall.ENOENT
	}
	if parent == nil || name == "" {
		return syscall.EBUSY // the root, or a path ending in ..
	}
	if n.isDir() && len(n.children) > 0 && !all {
		return syscall.ENOTEMPTY
	}
	delete(parent.children, name)
	parent.mtime = f.now().UnixNano()
	f.used -= int64(len(name)) + f.sizeOf(n)
	return nil
}

// sizeOf is what n and its subtree are charged.
func (f *FS) sizeOf(n *node) int64 {
	s := int64(NodeOverhead + len(n.data) + len(n.target))
	for name, c := range n.children {
		s += int64(len(name)) + f.sizeOf(c)
	}
	return s
}

// Rename moves a node, replacing a file or an empty directory at newp.
func (f *FS) Rename(oldp, newp string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return pathErr("rename", oldp, f.renameLocked(oldp, newp))
}

func (f *FS) renameLocked(oldp, newp string) error {
	n, oparent, oname, err := f.walkMut(oldp, false)
	if err != nil {
		return err
	}
	if n == nil {
		return syscall.ENOENT
	}
	if oparent == nil || oname == "" {
		return syscall.EBUSY
	}
	dst, nparent, nname, err := f.walkMut(newp, false)
	if err != nil {
		return err
	}
	if nparent == nil || nname == "" {
		return syscall.EBUSY
	}
	if dst == n {
		return nil
	}
	if n.isDir() && f.contains(n, nparent) {
		return syscall.EINVAL // a directory into itself
	}
	if dst != nil {
		switch {
		case dst.isDir() && !n.isDir():
			return syscall.EISDIR
		case !dst.isDir() && n.isDir():
			return syscall.ENOTDIR
		case dst.isDir() && len(dst.children) > 0:
			return syscall.ENOTEMPTY
		}
		f.used -= int64(len(nname)) + f.sizeOf(dst)
	}
	if err := f.charge(int64(len(nname) - len(oname))); err != nil {
		return err
	}
	delete(oparent.children, oname)
	nparent.children[nname] = n
	now := f.now().UnixNano()
	oparent.mtime, nparent.mtime = now, now
	return nil
}

func (f *FS) contains(dir, n *node) bool {
	if dir == n {
		return true
	}
	for _, c := range dir.children {
		if c.isDir() && f.contains(c, n) {
			return true
		}
	}
	return false
}

// Symlink makes link point at target. The target is stored as is and only
// ever resolved inside this filesystem.
func (f *FS) Symlink(target, link string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, parent, name, err := f.walkMut(link, false)
	if err == nil && n != nil {
		err = syscall.EEXIST
	}
	if err == nil && parent == nil {
		err = syscall.EINVAL
	}
	if err == nil {
		err = f.charge(NodeOverhead + int64(len(name)+len(target)))
	}
	if err != nil {
		return pathErr("symlink", link, err)
	}
	s := f.newNode(fs.ModeSymlink | 0o777)
	s.target = target
	parent.children[name] = s
	return nil
}

// Readlink returns a symlink's target.
func (f *FS) Readlink(p string) (string, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n, _, _, err := f.walk(p, false)
	if err == nil && n == nil {
		err = syscall.ENOENT
	}
	if err == nil && !n.isSymlink() {
		err = syscall.EINVAL
	}
	if err != nil {
		return "", pathErr("readlink", p, err)
	}
	return n.target, nil
}

// Chmod sets permission bits (following symlinks).
func (f *FS) Chmod(p string, perm fs.FileMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, _, _, err := f.walkMut(p, true)
	if err == nil && n == nil {
		err = syscall.ENOENT
	}
	if err != nil {
		return pathErr("chmod", p, err)
	}
	n.mode = n.mode&^fs.ModePerm | perm.Perm()
	return nil
}

// Chtimes sets the modification time (following symlinks).
func (f *FS) Chtimes(p string, mtime time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, _, _, err := f.walkMut(p, true)
	if err == nil && n == nil {
		err = syscall.ENOENT
	}
	if err != nil {
		return pathErr("chtimes", p, err)
	}
	n.mtime = mtime.UnixNano()
	return nil
}

// Truncate sets a regular file's size.
func (f *FS) Truncate(p string, size int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, _, _, err := f.walkMut(p, true)
	if err == nil && n == nil {
		err = syscall.ENOENT
	}
	if err == nil {
		err = f.truncateLocked(n, size)
	}
	return pathErr("truncate", p, err)
}

func (f *FS) truncateLocked(n *node, size int64) error {
	switch {
	case n.isDir():
		return syscall.EISDIR
	case !n.isRegular():
		return nil
	case size < 0:
		return syscall.EINVAL
	}
	if err := f.charge(size - int64(len(n.data))); err != nil {
		return err
	}
	n.ownData()
	if size <= int64(len(n.data)) {
		clear(n.data[size:])
		n.data = n.data[:size]
		if cap(n.data) > 2*len(n.data)+4096 {
			n.data = append([]byte(nil), n.data...)
		}
	} else {
		n.data = append(n.data, make([]byte, size-int64(len(n.data)))...)
	}
	n.mtime = f.now().UnixNano()
	return nil
}

// OpenFile opens p with os.OpenFile's flags (O_RDONLY, O_WRONLY, O_RDWR,
// O_CREATE, O_EXCL, O_TRUNC, O_APPEND). Directories open read-only, for
// ReadDir.
func (f *FS) OpenFile(p string, flag int, perm fs.FileMode) (File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, err := f.openLocked(p, flag, perm, flag&syscall.O_NOFOLLOW == 0)
	if err != nil {
		return nil, pathErr("open", p, err)
	}
	if flag&syscall.O_DIRECTORY != 0 && !h.n.isDir() {
		return nil, pathErr("open", p, syscall.ENOTDIR)
	}
	return h, nil
}

// Open opens p for reading.
func (f *FS) Open(p string) (File, error) { return f.OpenFile(p, syscall.O_RDONLY, 0) }

func (f *FS) openLocked(p string, flag int, perm fs.FileMode, follow bool) (*handle, error) {
	write := flag&(syscall.O_WRONLY|syscall.O_RDWR) != 0
	walk := f.walk
	if write || flag&(syscall.O_CREAT|syscall.O_TRUNC) != 0 {
		walk = f.walkMut
	}
	n, parent, name, err := walk(p, follow)
	if err != nil {
		return nil, err
	}
	if n == nil {
		if flag&syscall.O_CREAT == 0 {
			return nil, syscall.ENOENT
		}
		if parent == nil {
			return nil, syscall.EINVAL
		}
		if err := f.charge(NodeOverhead + int64(len(name))); err != nil {
			return nil, err
		}
		n = f.newNode(perm.Perm())
		parent.children[name] = n
		parent.mtime = n.mtime
	} else {
		if flag&syscall.O_CREAT != 0 && flag&syscall.O_EXCL != 0 {
			return nil, syscall.EEXIST
		}
		if n.isSymlink() {
			return nil, syscall.ELOOP // O_NOFOLLOW on a symlink
		}
		if n.isDir() && write {
			return nil, syscall.EISDIR
		}
		if write && n.isRegular() && n.mode.Perm()&0o222 == 0 {
			return nil, syscall.EACCES
		}
		if flag&syscall.O_TRUNC != 0 && write && n.isRegular() {
			if err := f.truncateLocked(n, 0); err != nil {
				return nil, err
			}
		}
	}
	return &handle{fs: f, n: n, name: nameOf(p, name), path: p, follow: follow, flag: flag &^ (syscall.O_NOFOLLOW | syscall.O_DIRECTORY)}, nil
}

// ReadFile returns a file's contents (following symlinks), refusing one
// larger than max bytes with a *TooLargeError when max > 0.
func (f *FS) ReadFile(p string, max int64) ([]byte, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n, _, _, err := f.walk(p, true)
	if err == nil && n == nil {
		err = syscall.ENOENT
	}
	if err == nil && n.isDir() {
		err = syscall.EISDIR
	}
	if err != nil {
		return nil, pathErr("read", p, err)
	}
	if !n.isRegular() {
		return nil, nil
	}
	if max > 0 && int64(len(n.data)) > max {
		return nil, &TooLargeError{Path: p, Size: int64(len(n.data)), Max: max}
	}
	return append([]byte{}, n.data...), nil
}

// WriteFile creates or replaces a file (following symlinks).
func (f *FS) WriteFile(p string, data []byte, perm fs.FileMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, err := f.openLocked(p, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, perm, true)
	if err == nil {
		_, err = h.writeLocked(data, -1)
	}
	return pathErr("write", p, err)
}

// TooLargeError reports a file over a read cap.
type TooLargeError struct {
	Path      string
	Size, Max int64
}

func (e *TooLargeError) Error() string {
	return "read " + e.Path + ": file of " + itoa(e.Size) + " bytes exceeds the cap of " + itoa(e.Max)
}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// Info is an fs.FileInfo snapshot of a node, with its inode number and
// link count.
type Info struct {
	name  string
	size  int64
	mode  fs.FileMode
	mtime int64
	ino   uint64
	nlink uint64
}

func (f *FS) info(n *node, name string) *Info {
	fi := &Info{name: name, mode: n.mode, mtime: n.mtime, ino: n.ino, nlink: 1}
	switch {
	case n.isRegular():
		fi.size = int64(len(n.data))
	case n.isSymlink():
		fi.size = int64(len(n.target))
	case n.isDir():
		fi.nlink = 2
	}
	return fi
}

func (fi *Info) Name() string       { return fi.name }
func (fi *Info) Size() int64        { return fi.size }
func (fi *Info) Mode() fs.FileMode  { return fi.mode }
func (fi *Info) ModTime() time.Time { return time.Unix(0, fi.mtime) }
func (fi *Info) IsDir() bool        { return fi.mode.IsDir() }
func (fi *Info) Sys() any           { return nil }

// Ino is the node's inode number.
func (fi *Info) Ino() uint64 { return fi.ino }

// Nlink is the node's link count.
func (fi *Info) Nlink() uint64 { return fi.nlink }

// NewInfo makes an Info (a file system served from another process
// describes its nodes with it).
func NewInfo(name string, size int64, mode fs.FileMode, mtime time.Time, ino, nlink uint64) *Info {
	return &Info{name: name, size: size, mode: mode, mtime: mtime.UnixNano(), ino: ino, nlink: nlink}
}

// handle is an open file or directory of an FS.
type handle struct {
	fs   *FS
	n    *node
	name string
	flag int
	// path and follow are how the handle was opened: a change through a
	// handle whose node a Clone shared since finds the FS's own copy by
	// them (see own).
	path   string
	follow bool

	mu     sync.Mutex
	pos    int64
	dirPos int
	closed bool
}

var _ File = (*handle)(nil)

func (h *handle) readable() bool { return h.flag&syscall.O_WRONLY == 0 }
func (h *handle) writable() bool { return h.flag&(syscall.O_WRONLY|syscall.O_RDWR) != 0 }

// Read reads from the current offset.
func (h *handle) Read(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, err := h.pread(p, h.pos)
	h.pos += int64(n)
	return n, err
}

// ReadAt reads at off.
func (h *handle) ReadAt(p []byte, off int64) (int, error) {
	return h.pread(p, off)
}

func (h *handle) pread(p []byte, off int64) (int, error) {
	if h.closed {
		return 0, fs.ErrClosed
	}
	if !h.readable() {
		return 0, syscall.EBADF
	}
	switch h.n.dev {
	case devNull:
		return 0, io.EOF
	case devZero:
		clear(p)
		return len(p), nil
	case devRandom:
		return rand.Read(p)
	}
	if h.n.isDir() {
		return 0, syscall.EISDIR
	}
	h.fs.mu.RLock()
	defer h.fs.mu.RUnlock()
	if off >= int64(len(h.n.data)) {
		return 0, io.EOF
	}
	return copy(p, h.n.data[off:]), nil
}

// Write writes at the current offset, or at the end with O_APPEND.
func (h *handle) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0, fs.ErrClosed
	}
	if !h.writable() {
		return 0, syscall.EBADF
	}
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	off := h.pos
	if h.flag&syscall.O_APPEND != 0 {
		off = -1
	}
	n, err := h.writeLocked(p, off)
	if off == -1 {
		h.pos = int64(len(h.n.data))
	} else {
		h.pos += int64(n)
	}
	return n, err
}

// WriteAt writes at off.
func (h *handle) WriteAt(p []byte, off int64) (int, error) {
	if !h.writable() {
		return 0, syscall.EBADF
	}
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	return h.writeLocked(p, off)
}

// own makes h.n this FS's own node before a change through h, under
// fs.mu: after a Clone shared it, the copy at the path h was opened by, if
// that is still the same file (its inode number); else EIO.
func (h *handle) own() error {
	if h.n.gen == h.fs.gen || h.n.dev != devNone {
		return nil
	}
	n, _, _, err := h.fs.walkMut(h.path, h.follow)
	if err != nil || n == nil || n.ino != h.n.ino {
		return syscall.EIO
	}
	h.n = n
	return nil
}

// writeLocked writes p at off (-1: append) under fs.mu.
func (h *handle) writeLocked(p []byte, off int64) (int, error) {
	if err := h.own(); err != nil {
		return 0, err
	}
	n := h.n
	n.ownData()
	switch {
	case n.dev != devNone:
		return len(p), nil
	case n.isDir():
		return 0, syscall.EISDIR
	}
	if off < 0 {
		off = int64(len(n.data))
	}
	end := off + int64(len(p))
	if grow := end - int64(len(n.data)); grow > 0 {
		if err := h.fs.charge(grow); err != nil {
			// Write what fits, like a full disk.
			room := h.fs.limit - h.fs.used
			k := int64(len(n.data)) - off + room
			if room <= 0 || k <= 0 {
				return 0, err
			}
			w, _ := h.writeLocked(p[:min(k, int64(len(p)))], off)
			return w, err
		}
		if end > int64(cap(n.data)) {
			nd := make([]byte, end, max(end, min(2*int64(cap(n.data)), end+(8<<20))))
			copy(nd, n.data)
			n.data = nd
		} else {
			n.data = n.data[:end]
		}
	}
	copy(n.data[off:], p)
	n.mtime = h.fs.now().UnixNano()
	return len(p), nil
}

// Seek sets the offset.
func (h *handle) Seek(offset int64, whence int) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var base int64
	switch whence {
	case io.SeekCurrent:
		base = h.pos
	case io.SeekEnd:
		h.fs.mu.RLock()
		base = int64(len(h.n.data))
		h.fs.mu.RUnlock()
	}
	if base+offset < 0 {
		return h.pos, syscall.EINVAL
	}
	h.pos = base + offset
	if h.n.isDir() && h.pos == 0 {
		h.dirPos = 0
	}
	return h.pos, nil
}

// Stat describes the open file.
func (h *handle) Stat() (fs.FileInfo, error) {
	h.fs.mu.RLock()
	defer h.fs.mu.RUnlock()
	return h.fs.info(h.n, h.name), nil
}

// ReadDir reads directory entries, like os.File.ReadDir.
func (h *handle) ReadDir(n int) ([]fs.DirEntry, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.n.isDir() {
		return nil, syscall.ENOTDIR
	}
	h.fs.mu.RLock()
	all := h.fs.entries(h.n)
	h.fs.mu.RUnlock()
	if h.dirPos > len(all) {
		h.dirPos = len(all)
	}
	rest := all[h.dirPos:]
	if n > 0 && len(rest) > n {
		rest = rest[:n]
	}
	h.dirPos += len(rest)
	if n > 0 && len(rest) == 0 {
		return nil, io.EOF
	}
	return rest, nil
}

// Truncate sets the file's size.
func (h *handle) Truncate(size int64) error {
	if !h.writable() {
		return syscall.EBADF
	}
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.own(); err != nil {
		return err
	}
	return h.fs.truncateLocked(h.n, size)
}

// Close is idempotent.
func (h *handle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return nil
}

// SetAppend turns O_APPEND on or off (WASI's fd_fdstat_set_flags).
func (h *handle) SetAppend(on bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if on {
		h.flag |= syscall.O_APPEND
	} else {
		h.flag &^= syscall.O_APPEND
	}
	return nil
}

// Append reports O_APPEND.
func (h *handle) Append() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.flag&syscall.O_APPEND != 0
}

// SetModTime sets the open node's modification time.
func (h *handle) SetModTime(t time.Time) error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.own(); err != nil {
		return err
	}
	h.n.mtime = t.UnixNano()
	return nil
}

// Clone returns a copy of the filesystem in O(1): the two share every
// node until one of them changes it, and then only that one pays for a
// copy of the nodes on the changed path (a directory's entries, or a
// file's data when it is written). Each goes on with its own quota,
// starting from what was charged when it was cloned. Files open at the
// time stay this FS's: a change through one copies the node it names
// then, and fails with EIO if its path names another file by then.
func (f *FS) Clone() *FS {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := &FS{root: f.root, used: f.used, limit: f.limit, nextIno: f.nextIno, now: f.now, gen: generations.Add(1)}
	f.gen = generations.Add(1)
	return g
}

// Usage reports the bytes charged and the quota.
func (f *FS) Usage() (used, limit int64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.used, f.limit
}
