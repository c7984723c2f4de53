// Package tmpfs mounts small tmpfs file systems for tests that need a disk
// that really fills up (ENOSPC from the kernel, not a fake): a full data
// directory, a record that cannot be written.
package tmpfs

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Mount mounts a tmpfs of size bytes on a fresh directory and unmounts it
// when the test ends. It needs root (CAP_SYS_ADMIN): without it the test is
// skipped, or fails under CI=true.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mounting a tmpfs (needed under CI=true): %v", err)
		}
		t.Skipf("mounting a tmpfs needs root: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes a file of zeros at path until the file system is full (or
// max bytes were written), and returns how many bytes it wrote. Remove the
// file to free the space.
func Fill(t testing.TB, path string, max int64) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	var n int64
	for n < max {
		k, err := f.Write(buf[:min(int64(len(buf)), max-n)])
		n += int64(k)
		if err != nil {
			break
		}
	}
	// A few bytes may fit in a smaller write.
	for n < max {
		k, err := f.Write(buf[:1])
		n += int64(k)
		if err != nil {
			break
		}
	}
	return n
}
