package vfs

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"syscall"
	"testing"
	"time"
)

func mustWrite(t *testing.T, f *FS, p, data string) {
	t.Helper()
	if err := f.MkdirAll(dirOf(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := f.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func dirOf(p string) string {
	for i := len(p) - 1; i > 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return "/"
}

func read(f *FS, p string) string {
	b, err := f.ReadFile(p, 0)
	if err != nil {
		return "error: " + err.Error()
	}
	return string(b)
}

// A clone and its original each see only their own changes, whatever the
// change: a write, an append, a truncate, a new file, a removal, a rename,
// a chmod, a symlink, a new directory.
func TestACloneAndItsOriginalChangeIndependently(t *testing.T) {
	changes := []struct {
		name  string
		do    func(t *testing.T, f *FS)
		check func(f *FS) string
	}{
		{"a file rewritten", func(t *testing.T, f *FS) { mustWrite(t, f, "/work/a.txt", "changed") },
			func(f *FS) string { return read(f, "/work/a.txt") }},
		{"a file appended to through a handle", func(t *testing.T, f *FS) {
			h, err := f.OpenFile("/work/a.txt", syscall.O_WRONLY|syscall.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			h.Write([]byte("+more"))
			h.Close()
		}, func(f *FS) string { return read(f, "/work/a.txt") }},
		{"a file truncated", func(t *testing.T, f *FS) {
			if err := f.Truncate("/work/src/deep/b.txt", 1); err != nil {
				t.Fatal(err)
			}
		}, func(f *FS) string { return read(f, "/work/src/deep/b.txt") }},
		{"a new file deep down", func(t *testing.T, f *FS) { mustWrite(t, f, "/work/src/deep/new.txt", "new") },
			func(f *FS) string { return read(f, "/work/src/deep/new.txt") }},
		{"a file removed", func(t *testing.T, f *FS) {
			if err := f.Remove("/work/src/deep/b.txt"); err != nil {
				t.Fatal(err)
			}
		}, func(f *FS) string { return read(f, "/work/src/deep/b.txt") }},
		{"a directory renamed", func(t *testing.T, f *FS) {
			if err := f.Rename("/work/src", "/work/moved"); err != nil {
				t.Fatal(err)
			}
		}, func(f *FS) string { return read(f, "/work/src/deep/b.txt") + "|" + read(f, "/work/moved/deep/b.txt") }},
		{"a mode changed", func(t *testing.T, f *FS) {
			if err := f.Chmod("/work/a.txt", 0o600); err != nil {
				t.Fatal(err)
			}
		}, func(f *FS) string { st, _ := f.Stat("/work/a.txt"); return st.Mode().String() }},
		{"a symlink made", func(t *testing.T, f *FS) {
			if err := f.Symlink("/work/a.txt", "/tmp/link"); err != nil {
				t.Fatal(err)
			}
		}, func(f *FS) string { l, err := f.Readlink("/tmp/link"); return fmt.Sprint(l, err) }},
		{"the tree removed", func(t *testing.T, f *FS) {
			if err := f.RemoveAll("/work"); err != nil {
				t.Fatal(err)
			}
		}, func(f *FS) string { return read(f, "/work/a.txt") }},
	}
	for _, c := range changes {
		for _, side := range []string{"the clone", "the original"} {
			t.Run(c.name+" in "+side, func(t *testing.T) {
				orig := New(1<<20, "/work", "/tmp")
				mustWrite(t, orig, "/work/a.txt", "original")
				mustWrite(t, orig, "/work/src/deep/b.txt", "bbbb")
				clone := orig.Clone()
				changed, other := clone, orig
				if side == "the original" {
					changed, other = orig, clone
				}
				before := c.check(other)
				c.do(t, changed)
				if after := c.check(other); after != before {
					t.Errorf("the other side saw the change: %q -> %q", before, after)
				}
				if c.check(changed) == before {
					t.Errorf("the changed side did not change: %q", before)
				}
			})
		}
	}
}

// Cloning is O(1): a filesystem of 100 MB in 2,000 files clones in far
// less than a copy would take, and a clone costs no file data until it is
// written.
func TestCloneIsConstantTimeAndSharesData(t *testing.T) {
	f := New(200<<20, "/work")
	chunk := bytes.Repeat([]byte{'x'}, 50<<10)
	for i := range 2000 {
		if err := f.WriteFile(fmt.Sprintf("/work/d%02d/f%04d", i%50, i), nil, 0o644); err != nil {
			f.MkdirAll(fmt.Sprintf("/work/d%02d", i%50), 0o755)
		}
		if err := f.WriteFile(fmt.Sprintf("/work/d%02d/f%04d", i%50, i), chunk, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	clones := make([]*FS, 8)
	for i := range clones {
		clones[i] = f.Clone()
	}
	if d := time.Since(start); d > 5*time.Millisecond {
		t.Errorf("8 clones of 100 MB took %v", d)
	}
	// The data is shared until written: both read the same backing array.
	n1, _, _, _ := f.walk("/work/d07/f0007", true)
	n2, _, _, _ := clones[3].walk("/work/d07/f0007", true)
	if &n1.data[0] != &n2.data[0] {
		t.Error("a clone copied file data it never wrote")
	}
	if err := clones[3].WriteFile("/work/d07/f0007", []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := read(f, "/work/d07/f0007"); len(got) != len(chunk) {
		t.Errorf("the original's file changed to %d bytes", len(got))
	}
	if u1, u2 := f.Used(), clones[3].Used(); u2 >= u1 {
		t.Errorf("the clone's charge %d did not drop below the original's %d after it shrank a file", u2, u1)
	}
}

// A file open when the filesystem is cloned stays the original's: writes
// through it are not seen by the clone.
func TestAFileOpenAcrossACloneWritesTheOriginalOnly(t *testing.T) {
	f := New(1<<20, "/work")
	mustWrite(t, f, "/work/log", "a")
	h, err := f.OpenFile("/work/log", syscall.O_RDWR|syscall.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	clone := f.Clone()
	if _, err := h.Write([]byte("b")); err != nil {
		t.Fatal(err)
	}
	if got, want := read(f, "/work/log"), "ab"; got != want {
		t.Errorf("original %q, want %q", got, want)
	}
	if got, want := read(clone, "/work/log"), "a"; got != want {
		t.Errorf("clone %q, want %q", got, want)
	}
	h.Seek(0, io.SeekStart)
	b, _ := io.ReadAll(h)
	if string(b) != "ab" {
		t.Errorf("the handle reads %q", b)
	}
	var _ fs.File = h
}

func BenchmarkClone100MB(b *testing.B) {
	f := New(200<<20, "/work")
	chunk := bytes.Repeat([]byte{'x'}, 50<<10)
	for i := range 2000 {
		f.MkdirAll(fmt.Sprintf("/work/d%02d", i%50), 0o755)
		f.WriteFile(fmt.Sprintf("/work/d%02d/f%04d", i%50, i), chunk, 0o644)
	}
	b.ResetTimer()
	for b.Loop() {
		for range 8 {
			f.Clone()
		}
	}
}
