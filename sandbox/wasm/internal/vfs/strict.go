package vfs

import (
	"errors"
	"io/fs"
	"path"
	"strings"
	"syscall"
)

// ErrEscape marks a path the host-facing API refuses: not absolute, not
// clean, or passing through a symlink.
var ErrEscape = errors.New("path is not absolute and clean, or passes through a symlink")

// checkStrict refuses p unless it is absolute and clean and no existing
// component of it is a symlink. The host-facing calls (ReadFile, WriteFile,
// ListFiles of the sandbox) never follow links planted by commands.
func (f *FS) checkStrict(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || strings.Contains(p, "\x00") {
		return ErrEscape
	}
	cur := f.root
	for _, c := range split(p) {
		if !cur.isDir() {
			return syscall.ENOTDIR
		}
		next := cur.children[c]
		if next == nil {
			return nil // the rest does not exist yet
		}
		if next.isSymlink() {
			return ErrEscape
		}
		cur = next
	}
	return nil
}

// StrictReadFile reads a regular file by a path that must not pass through a
// symlink; a file larger than max is a *TooLargeError.
func (f *FS) StrictReadFile(p string, max int64) ([]byte, error) {
	f.mu.RLock()
	err := f.checkStrict(p)
	f.mu.RUnlock()
	if err != nil {
		return nil, pathErr("read", p, err)
	}
	return f.ReadFile(p, max)
}

// StrictWriteFile creates or replaces a file, making its parents, by a path
// that must not pass through a symlink.
func (f *FS) StrictWriteFile(p string, data []byte, perm fs.FileMode) error {
	f.mu.Lock()
	err := f.checkStrict(p)
	f.mu.Unlock()
	if err != nil {
		return pathErr("write", p, err)
	}
	if err := f.MkdirAll(path.Dir(p), 0o755); err != nil {
		return err
	}
	// Re-check: MkdirAll ran unlocked, a concurrent command may have
	// planted a link meanwhile.
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkStrict(p); err != nil {
		return pathErr("write", p, err)
	}
	n, _, _, err := f.walk(p, false)
	if err == nil && n != nil && !n.isRegular() {
		err = syscall.EISDIR
		if !n.isDir() {
			err = syscall.EINVAL
		}
	}
	if err != nil {
		return pathErr("write", p, err)
	}
	h, err := f.openLocked(p, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, perm, false)
	if err == nil {
		h.n.mode = h.n.mode&^fs.ModePerm | perm.Perm()
		_, err = h.writeLocked(data, -1)
	}
	return pathErr("write", p, err)
}

// StrictReadDir lists a directory by a path that must not pass through a
// symlink.
func (f *FS) StrictReadDir(p string) ([]fs.DirEntry, error) {
	f.mu.RLock()
	err := f.checkStrict(p)
	f.mu.RUnlock()
	if err != nil {
		return nil, pathErr("readdir", p, err)
	}
	return f.ReadDir(p)
}
