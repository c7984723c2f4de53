package sandbox

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// File is one file to seed into a sandbox.
type File struct {
	Path string
	Data []byte
	Mode fs.FileMode
}

// Seed writes files into sb in path order (parents before what they hold).
// The caller's slice is left as it was.
func Seed(ctx context.Context, sb Sandbox, files []File) error {
	ordered := slices.SortedFunc(slices.Values(files), func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	for _, f := range ordered {
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := sb.WriteFile(ctx, f.Path, f.Data, mode); err != nil {
			return fmt.Errorf("seed %s: %w", f.Path, err)
		}
	}
	return nil
}

// maxSeedBytes caps the total size of a workspace copied into a sandbox.
const maxSeedBytes = 512 << 20

// FilesFromHost reads a host directory or a .tar file (plain or .tar.gz is
// not supported) into files placed under to. Symlinks and special files are
// skipped: a workspace is copied in, never bind-mounted, and copying never
// follows a link out of the tree.
func FilesFromHost(src, to string) ([]File, error) {
	if !path.IsAbs(to) {
		return nil, fieldErr("workspace.to", "%q is not an absolute path", to)
	}
	st, err := os.Stat(src)
	if err != nil {
		return nil, fieldErr("workspace.from", "%v", err)
	}
	if st.IsDir() {
		return filesFromDir(src, to)
	}
	f, err := os.Open(src)
	if err != nil {
		return nil, fieldErr("workspace.from", "%v", err)
	}
	defer f.Close()
	return FilesFromTar(f, to)
}

func filesFromDir(dir, to string) ([]File, error) {
	var out []File
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if total += info.Size(); total > maxSeedBytes {
			return fmt.Errorf("workspace %s: more than %d bytes: %w", dir, maxSeedBytes, ErrTooLarge)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, File{Path: path.Join(to, filepath.ToSlash(rel)), Data: data, Mode: info.Mode().Perm()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FilesFromTar reads regular files from a tar stream, placing them under to.
// Entries whose names climb out of the archive are refused.
func FilesFromTar(r io.Reader, to string) ([]File, error) {
	tr := tar.NewReader(r)
	var out []File
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("workspace tar: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := path.Clean("/" + h.Name)
		for _, part := range strings.Split(h.Name, "/") {
			if part == ".." {
				return nil, fmt.Errorf("workspace tar entry %q: %w", h.Name, ErrPathEscape)
			}
		}
		if total += h.Size; total > maxSeedBytes {
			return nil, fmt.Errorf("workspace tar: more than %d bytes: %w", maxSeedBytes, ErrTooLarge)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("workspace tar entry %q: %w", h.Name, err)
		}
		out = append(out, File{Path: path.Join(to, name), Data: data, Mode: fs.FileMode(h.Mode).Perm()})
	}
}
