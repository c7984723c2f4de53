//go:build linux

package guest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rollbox/rollbox/internal/guestproto"
	"github.com/rollbox/rollbox/sandbox"
)

// maxSymlinkHops bounds symlink resolution, as the kernel's ELOOP does.
const maxSymlinkHops = 40

// pathError is a file request's failure, with the protocol code it maps to.
func pathError(code, format string, args ...any) *guestproto.Error {
	return &guestproto.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func invalid(msg string) *guestproto.Error {
	return &guestproto.Error{Code: guestproto.CodeInvalid, Message: msg}
}

// errnoError maps a syscall failure on p to a protocol error. What the
// kernel answers about the file is the request's outcome, whatever the
// errno (sysfs answers EINVAL for a link speed, EIO, ENXIO, EOPNOTSUPP...):
// only the guest running out of descriptors of its own is the guest's
// failure (CodeInternal, which the host takes for a broken sandbox, not
// the agent's: a code a file of the agent's choice could produce would let
// it end its episode unscored).
func errnoError(p string, err error) *guestproto.Error {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return pathError(guestproto.CodeNotFound, "%s: no such file or directory", p)
	case errors.Is(err, unix.ELOOP):
		return pathError(guestproto.CodePathEscape, "%s: a symlink changed under the request", p)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		return pathError(guestproto.CodeDenied, "%s: %v", p, err)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return pathError(guestproto.CodeTooLarge, "%s: no space left in the sandbox", p)
	case errors.Is(err, unix.EMFILE), errors.Is(err, unix.ENFILE):
		return pathError(guestproto.CodeInternal, "%s: %v", p, err)
	}
	return pathError(guestproto.CodeInvalid, "%s: %v", p, err)
}

// rootFor returns the writable root p lies under (the longest), or "/" and
// false when it lies under none.
func (s *Server) rootFor(p string) (string, bool) {
	best := ""
	for _, r := range s.roots() {
		if (p == r || strings.HasPrefix(p, r+"/")) && len(r) > len(best) {
			best = r
		}
	}
	if best == "" {
		return "/", false
	}
	return best, true
}

// checkPath refuses paths that are not absolute and clean.
func checkPath(p string) *guestproto.Error {
	switch {
	case p == "" || p[0] != '/':
		return pathError(guestproto.CodePathEscape, "%q is not an absolute path", p)
	case strings.ContainsRune(p, 0):
		return pathError(guestproto.CodeInvalid, "%q contains NUL", p)
	case path.Clean(p) != p || strings.Contains(p, "/../") || strings.HasSuffix(p, "/.."):
		return pathError(guestproto.CodePathEscape, "%q is not a clean path (.. or //)", p)
	}
	return nil
}

// resolved is a path resolved beneath a root: dir is an O_PATH descriptor of
// the directory holding name; name is "" when the path is the root itself.
type resolved struct {
	dir  int
	name string
}

func (r resolved) close() { unix.Close(r.dir) }

// resolve walks p beneath root one component at a time with O_NOFOLLOW,
// following a symlink only while its target stays beneath root (an
// openat2 RESOLVE_BENEATH done by hand, for kernels and gVisor versions
// without it). With mkdir, missing directories are created (mkdir -p).
// The final component is followed too when it is a symlink.
func resolve(root, p string, mkdir bool) (resolved, *guestproto.Error) {
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return resolved{}, errnoError(root, err)
	}
	todo := splitPath(strings.TrimPrefix(p, root))
	cur, curPath := rootfd, []string(nil)
	// Where cur lies on a procfs, and whether it is the procfs's root
	// (where the pid directories are).
	rootProc := isProcfs(rootfd)
	curProc, procRoot := rootProc, rootProc
	hops := 0
	restart := func() {
		if cur != rootfd {
			unix.Close(cur)
		}
		cur, curPath = rootfd, nil
		curProc, procRoot = rootProc, rootProc
	}
	fail := func(e *guestproto.Error) (resolved, *guestproto.Error) {
		if cur != rootfd {
			unix.Close(cur)
		}
		unix.Close(rootfd)
		return resolved{}, e
	}
	for len(todo) > 0 {
		c := todo[0]
		last := len(todo) == 1
		if procRoot && guestsOwn(c) {
			return fail(pathError(guestproto.CodeDenied, "%s: /proc/%s is the guest agent's own, not a command's: file requests get what a command gets (run cat in bash for a command's own /proc/self)", p, c))
		}
		var st unix.Stat_t
		err := unix.Fstatat(cur, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) && mkdir && !last {
			if err = unix.Mkdirat(cur, c, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				err = unix.Fstatat(cur, c, &st, unix.AT_SYMLINK_NOFOLLOW)
			}
		}
		if errors.Is(err, unix.ENOENT) && last {
			break // a file to create, or a missing file the caller reports
		}
		if err != nil {
			return fail(errnoError(p, err))
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if hops++; hops > maxSymlinkHops {
				return fail(pathError(guestproto.CodePathEscape, "%s: too many symlinks", p))
			}
			target, err := readlinkat(cur, c)
			if err != nil {
				return fail(errnoError(p, err))
			}
			var next []string
			if strings.HasPrefix(target, "/") {
				t := path.Clean(target)
				if root != "/" && t != root && !strings.HasPrefix(t, root+"/") {
					return fail(pathError(guestproto.CodePathEscape, "%s: symlink to %s leaves %s", p, target, root))
				}
				next = splitPath(strings.TrimPrefix(t, root))
			} else {
				next = append(append([]string{}, curPath...), splitPath(target)...)
			}
			next = append(next, todo[1:]...)
			cleaned, ok := cleanBeneath(next)
			if !ok {
				return fail(pathError(guestproto.CodePathEscape, "%s: symlink to %s leaves %s", p, target, root))
			}
			restart()
			todo = cleaned
			continue
		}
		if last {
			break
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fail(pathError(guestproto.CodeNotFound, "%s: %s is not a directory", p, path.Join(append([]string{root}, append(curPath, c)...)...)))
		}
		fd, err := unix.Openat(cur, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(errnoError(p, err))
		}
		if cur != rootfd {
			unix.Close(cur)
		}
		fdProc := isProcfs(fd)
		procRoot = fdProc && !curProc
		cur, curPath, curProc = fd, append(curPath, c), fdProc
		todo = todo[1:]
	}
	if len(todo) == 0 { // the root itself
		if cur != rootfd {
			unix.Close(rootfd)
		}
		return resolved{dir: cur}, nil
	}
	if cur != rootfd {
		unix.Close(rootfd)
	}
	return resolved{dir: cur, name: todo[0]}, nil
}

// isProcfs reports whether fd lies on a procfs.
func isProcfs(fd int) bool {
	var st unix.Statfs_t
	return unix.Fstatfs(fd, &st) == nil && st.Type == unix.PROC_SUPER_MAGIC
}

// guestsOwn reports whether name, an entry of a procfs root, is the guest's
// own: "self", "thread-self", its pid, or the id of one of its threads
// (hidden from a listing of /proc, reachable by name). The guest serves
// file requests as the commands' user, but as itself: without this, a
// file request would read the guest's memory map, environment and file
// descriptors (the protocol stream among them) where a command is refused
// them, a confused deputy. A command's /proc/self is its own; a request
// has none.
func guestsOwn(name string) bool {
	switch name {
	case "self", "thread-self":
		return true
	}
	if name == "" || name[0] < '0' || name[0] > '9' {
		return false
	}
	n, err := strconv.Atoi(name)
	if err != nil {
		return false
	}
	if n == os.Getpid() {
		return true
	}
	var st unix.Stat_t
	return unix.Lstat("/proc/self/task/"+strconv.Itoa(n), &st) == nil
}

func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// cleanBeneath applies .. lexically, failing if it climbs above the root.
func cleanBeneath(comps []string) ([]string, bool) {
	out := make([]string, 0, len(comps))
	for _, c := range comps {
		switch c {
		case "", ".":
		case "..":
			if len(out) == 0 {
				return nil, false
			}
			out = out[:len(out)-1]
		default:
			out = append(out, c)
		}
	}
	return out, true
}

func readlinkat(dir int, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dir, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func (s *Server) readFile(req *guestproto.ReadFile) (*guestproto.FileData, *guestproto.Error) {
	if e := checkPath(req.Path); e != nil {
		return nil, e
	}
	limit := req.MaxBytes
	if limit <= 0 || limit > sandbox.MaxFileBytes {
		limit = sandbox.MaxFileBytes
	}
	root, _ := s.rootFor(req.Path)
	r, e := resolve(root, req.Path, false)
	if e != nil {
		return nil, e
	}
	defer r.close()
	if r.name == "" {
		return nil, pathError(guestproto.CodeInvalid, "%s is a directory", req.Path)
	}
	fd, err := unix.Openat(r.dir, r.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errnoError(req.Path, err)
	}
	f := os.NewFile(uintptr(fd), req.Path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, errnoError(req.Path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, pathError(guestproto.CodeInvalid, "%s is not a regular file (%v)", req.Path, st.Mode().Type())
	}
	if st.Size() > limit {
		return nil, pathError(guestproto.CodeTooLarge, "%s is %d bytes, more than the %d allowed", req.Path, st.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, errnoError(req.Path, err)
	}
	if int64(len(data)) > limit {
		return nil, pathError(guestproto.CodeTooLarge, "%s is more than the %d bytes allowed", req.Path, limit)
	}
	return &guestproto.FileData{Data: data}, nil
}

func (s *Server) writeFile(req *guestproto.WriteFile) *guestproto.Error {
	if e := checkPath(req.Path); e != nil {
		return e
	}
	if len(req.Data) > sandbox.MaxFileBytes {
		return pathError(guestproto.CodeTooLarge, "%s: %d bytes, more than the %d allowed", req.Path, len(req.Data), sandbox.MaxFileBytes)
	}
	root, writable := s.rootFor(req.Path)
	if !writable {
		return pathError(guestproto.CodePathEscape, "%s is outside the writable directories %v", req.Path, s.roots())
	}
	r, e := resolve(root, req.Path, true)
	if e != nil {
		return e
	}
	defer r.close()
	if r.name == "" {
		return pathError(guestproto.CodeInvalid, "%s is a directory", req.Path)
	}
	// Write a temporary file beside the target and rename it over: a reader
	// never sees half a file, and an existing symlink is replaced, not
	// followed.
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := ".rollbox-" + hex.EncodeToString(rnd[:])
	mode := uint32(fs.FileMode(req.Mode).Perm())
	if mode == 0 {
		mode = 0o644
	}
	fd, err := unix.Openat(r.dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return errnoError(req.Path, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(req.Data)
	if err == nil {
		err = f.Chmod(fs.FileMode(mode)) // not reduced by the umask
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(r.dir, tmp, r.dir, r.name)
	}
	if err != nil {
		unix.Unlinkat(r.dir, tmp, 0)
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return pathError(guestproto.CodeTooLarge, "%s: no space left in the sandbox", req.Path)
		}
		return errnoError(req.Path, err)
	}
	return nil
}

func (s *Server) listDir(req *guestproto.ListDir) (*guestproto.DirList, *guestproto.Error) {
	if e := checkPath(req.Path); e != nil {
		return nil, e
	}
	root, _ := s.rootFor(req.Path)
	r, e := resolve(root, req.Path, false)
	if e != nil {
		return nil, e
	}
	defer r.close()
	name := r.name
	if name == "" {
		name = "."
	}
	fd, err := unix.Openat(r.dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errnoError(req.Path, err)
	}
	f := os.NewFile(uintptr(fd), req.Path)
	defer f.Close()
	// The listing is bounded as it is read: a directory of the commands'
	// making can hold more entries (empty files cost no space in a tmpfs)
	// and longer symlink targets than one reply carries (MaxMessage) or
	// the guest's memory holds. A reply too large to send was logged and
	// never answered (the caller waited forever); one the guest had no
	// memory for got it OOM-killed.
	tooLarge := func(n int) *guestproto.Error {
		return pathError(guestproto.CodeTooLarge, "%s: the listing is more than %d bytes (%d entries read)", req.Path, s.maxList, n)
	}
	var names []string
	size := 0
	for {
		chunk, err := f.Readdirnames(1024)
		for _, n := range chunk {
			size += len(n) + listEntryBytes
		}
		names = append(names, chunk...)
		if size > s.maxList {
			return nil, tooLarge(len(names))
		}
		if errors.Is(err, io.EOF) || (err == nil && len(chunk) == 0) {
			break
		}
		if err != nil {
			return nil, errnoError(req.Path, err)
		}
	}
	sort.Strings(names)
	out := &guestproto.DirList{Entries: make([]guestproto.DirEntry, 0, len(names))}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		en := guestproto.DirEntry{
			Name:    n,
			Size:    st.Size,
			Mode:    uint32(fileMode(st.Mode)),
			IsDir:   st.Mode&unix.S_IFMT == unix.S_IFDIR,
			ModTime: time.Unix(st.Mtim.Unix()),
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			en.Link, _ = readlinkat(fd, n)
			if size += len(en.Link); size > s.maxList {
				return nil, tooLarge(len(out.Entries))
			}
		}
		out.Entries = append(out.Entries, en)
	}
	return out, nil
}

// maxListBytes bounds a directory listing's reply: as much as a file's
// (sandbox.MaxFileBytes), well within a message (guestproto.MaxMessage).
const maxListBytes = sandbox.MaxFileBytes

// listEntryBytes is what an entry costs in a reply beside its name and
// link: its size, mode, kind and time, and the lengths.
const listEntryBytes = 48

// fileMode converts a stat mode to an io/fs one.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
