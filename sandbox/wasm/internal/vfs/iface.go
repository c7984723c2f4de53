package vfs

import (
	"io"
	"io/fs"
	"time"
)

// FileSystem is an episode filesystem as commands use it: *FS in this
// process, or a client of one served from another process (the WASM
// backend's confined helper reaches the service's *FS that way). Paths are
// absolute within the episode; errors are *fs.PathError wrapping a
// syscall.Errno, or a *TooLargeError, or ErrEscape.
type FileSystem interface {
	Stat(p string) (fs.FileInfo, error)
	Lstat(p string) (fs.FileInfo, error)
	// OpenFile takes os.O_* / syscall.O_* flags, including O_NOFOLLOW and
	// O_DIRECTORY.
	OpenFile(p string, flag int, perm fs.FileMode) (File, error)
	ReadDir(p string) ([]fs.DirEntry, error)
	Mkdir(p string, perm fs.FileMode) error
	MkdirAll(p string, perm fs.FileMode) error
	Remove(p string) error
	RemoveAll(p string) error
	Rename(oldp, newp string) error
	Symlink(target, link string) error
	Readlink(p string) (string, error)
	Chmod(p string, perm fs.FileMode) error
	Chtimes(p string, mtime time.Time) error
	Truncate(p string, size int64) error
	// ReadFile refuses a file larger than max (> 0) with a *TooLargeError.
	ReadFile(p string, max int64) ([]byte, error)
	WriteFile(p string, data []byte, perm fs.FileMode) error
	// Usage reports the bytes charged against the quota, and the quota.
	Usage() (used, limit int64)
}

// File is an open file or directory of a FileSystem.
type File interface {
	io.Reader
	io.Writer
	io.ReaderAt
	io.WriterAt
	io.Seeker
	io.Closer
	Stat() (fs.FileInfo, error)
	ReadDir(n int) ([]fs.DirEntry, error)
	Truncate(size int64) error
	Append() bool
	SetAppend(on bool) error
	SetModTime(t time.Time) error
}

var _ FileSystem = (*FS)(nil)
