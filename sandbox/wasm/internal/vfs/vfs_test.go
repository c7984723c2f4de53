package vfs

import (
	"errors"
	"io"
	"syscall"
	"testing"
)

func TestSymlinksAndDotDotStayInside(t *testing.T) {
	f := New(1<<20, "/work")
	f.WriteFile("/work/a", []byte("A"), 0o644)
	f.Symlink("/", "/work/root")
	f.Symlink("../../../../work/a", "/work/up")
	f.Symlink("loop", "/work/loop")
	for p, want := range map[string]string{"/work/root/work/a": "A", "/work/up": "A", "/../../work/a": "A"} {
		if got, err := f.ReadFile(p, 0); err != nil || string(got) != want {
			t.Errorf("ReadFile(%s) = %q, %v", p, got, err)
		}
	}
	if _, err := f.ReadFile("/work/loop", 0); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("loop: %v", err)
	}
	for _, p := range []string{"/work/root/work/a", "/work/up", "work/a", "/work/../work/a"} {
		if _, err := f.StrictReadFile(p, 0); !errors.Is(err, ErrEscape) {
			t.Errorf("StrictReadFile(%s) = %v, want ErrEscape", p, err)
		}
	}
}

func TestQuotaCountsDataAndNodes(t *testing.T) {
	f := New(4096, "/work")
	if err := f.WriteFile("/work/big", make([]byte, 5000), 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("over quota: %v", err)
	}
	f.Remove("/work/big")
	if f.Used() != 0 {
		t.Errorf("Used after remove = %d", f.Used())
	}
	n := 0
	for ; n < 100; n++ {
		if err := f.Mkdir("/work/d"+string(rune('a'+n%26))+string(rune('a'+n/26)), 0o755); err != nil {
			break
		}
	}
	if n >= 100 || n < 10 {
		t.Errorf("made %d empty directories in a 4 KB quota", n)
	}
}

func TestOpenFileSemantics(t *testing.T) {
	f := New(1<<20, "/work")
	h, _ := f.OpenFile("/work/x", syscall.O_WRONLY|syscall.O_CREAT, 0o644)
	h.Write([]byte("hello"))
	h.Close()
	h, _ = f.OpenFile("/work/x", syscall.O_WRONLY|syscall.O_APPEND, 0)
	h.Write([]byte(" world"))
	h.Close()
	h, _ = f.Open("/work/x")
	data, _ := io.ReadAll(h)
	if string(data) != "hello world" {
		t.Errorf("data = %q", data)
	}
	if _, err := f.OpenFile("/work/x", syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o644); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("O_EXCL: %v", err)
	}
	if err := f.Rename("/work", "/work/sub"); err == nil {
		t.Errorf("renamed a directory into itself")
	}
	z, _ := f.Open("/dev/zero")
	buf := []byte{1, 2, 3}
	if n, _ := z.Read(buf); n != 3 || buf[0] != 0 {
		t.Errorf("/dev/zero read %d %v", n, buf)
	}
}
