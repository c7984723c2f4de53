package containerd

import (
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rollbox/rollbox/sandbox"
)

// copyTree copies the directory src into dst (made here, with src's owner
// and mode) as root, without ever following a symbolic link: the tree is
// the sandbox's, and what its commands left in it is hostile. Every step is
// relative to a directory descriptor opened with O_NOFOLLOW, so a link to
// a host path is copied as a link and never read through. Regular files,
// directories and links are copied with their owner, mode and times; FIFOs
// are made anew; sockets and devices (which the sandbox's user cannot make)
// are skipped. Hard links become separate files.
//
// The walk holds two descriptors a level, so a tree deeper than
// maxCopyDepth is refused (ErrTooLarge: the sandbox's doing), and at most
// copiesAtOnce copies run at once: a tree its commands made thousands of
// levels deep would otherwise take every descriptor this process may open.
func copyTree(src, dst string) error {
	copies <- struct{}{}
	defer func() { <-copies }()
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return err
	}
	if err := unix.Mkdir(dst, 0o700); err != nil {
		return err
	}
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := copyDir(sfd, dfd, src, 0); err != nil {
		return err
	}
	return setAttrs(dfd, "", &st)
}

// maxCopyDepth is how deep a tree copyTree copies; copiesAtOnce how many
// copies run at once (2 × maxCopyDepth × copiesAtOnce descriptors at most).
const (
	maxCopyDepth = 400
	copiesAtOnce = 4
)

var copies = make(chan struct{}, copiesAtOnce)

// copyDir copies the entries of the directory sfd, depth levels below the
// tree's root, into dfd.
func copyDir(sfd, dfd int, where string, depth int) error {
	if depth >= maxCopyDepth {
		return fmt.Errorf("%s...: a directory tree deeper than the %d levels a fork copies: %w", where[:min(len(where), 200)], maxCopyDepth, sandbox.ErrTooLarge)
	}
	// A duplicate, since reading a directory through os.File takes its
	// descriptor over.
	rfd, err := unix.Dup(sfd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(rfd), where)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("list %s: %w", where, err)
	}
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				continue // removed meanwhile
			}
			return fmt.Errorf("stat %s/%s: %w", where, name, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
				return err
			}
			csfd, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %s/%s: %w", where, name, err)
			}
			cdfd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == nil {
				err = copyDir(csfd, cdfd, where+"/"+name, depth+1)
				if err == nil {
					err = setAttrs(cdfd, "", &st)
				}
				unix.Close(cdfd)
			}
			unix.Close(csfd)
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := copyFile(sfd, dfd, name, where, &st); err != nil {
				return err
			}
		case unix.S_IFLNK:
			buf := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(sfd, name, buf)
			if err != nil {
				return fmt.Errorf("readlink %s/%s: %w", where, name, err)
			}
			if err := unix.Symlinkat(string(buf[:n]), dfd, name); err != nil {
				return err
			}
			if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		case unix.S_IFIFO:
			if err := unix.Mkfifoat(dfd, name, st.Mode&0o7777); err != nil {
				return err
			}
			if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(sfd, dfd int, name, where string, st *unix.Stat_t) error {
	in, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s/%s: %w", where, name, err)
	}
	src := os.NewFile(uintptr(in), name)
	defer src.Close()
	out, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	dst := os.NewFile(uintptr(out), name)
	defer dst.Close()
	if _, err := io.Copy(dst, src); err != nil {
		return fmt.Errorf("copy %s/%s: %w", where, name, err)
	}
	return setAttrs(out, "", st)
}

// setAttrs gives the file open as fd the owner, mode and times of st.
func setAttrs(fd int, _ string, st *unix.Stat_t) error {
	if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, st.Mode&0o7777); err != nil {
		return err
	}
	return unix.Futimes(fd, []unix.Timeval{unix.NsecToTimeval(unix.TimespecToNsec(st.Atim)), unix.NsecToTimeval(unix.TimespecToNsec(st.Mtim))})
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
