// Package testbin builds the repository's commands for tests that run them
// as processes (rollbox worker, rollbox serve, fakepolicyd). `go test ./...`
// runs each package's tests in a process of its own, and several of them
// need the same 110 MB rollbox binary: linking it is 10-20 s of a 2-core
// machine each time. Build keeps one binary per command and checkout in a
// directory of the temp dir and runs `go build -o` on it under a file lock:
// go build relinks only when the file there is not the build of the current
// sources (it compares build IDs), so the second package's build is a
// check of a second or two, and a changed source is never missed.
package testbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
)

// Root is the module's root directory (the checkout holding this file).
func Root() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if ok && filepath.IsAbs(file) {
		root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			return root, nil
		}
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("the module's root: go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// Build returns the path of the binary of pkg (a package path relative to
// the module's root, "./cmd/rollbox"), built from the current sources.
// It fails t when the build fails.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	path, err := build(pkg)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func build(pkg string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[pkg]; ok {
		return p, nil
	}
	root, err := Root()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(os.TempDir(), "rollbox-testbins-"+hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// One build at a time per checkout: another package's go build may be
	// writing the same file.
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	// A directory per command: a test may put it on PATH.
	name := filepath.Base(pkg)
	if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(dir, name, name)
	began := time.Now()
	b, err := goBuild(root, out, pkg)
	if err != nil {
		// go build writes over no file but an executable: a file cut short
		// (a build killed mid-copy) is removed and built again.
		os.Remove(out)
		b, err = goBuild(root, out, pkg)
	}
	if err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "testbin: go build %s took %v\n", pkg, time.Since(began).Round(time.Millisecond))
	}
	built[pkg] = out
	return out, nil
}

func goBuild(root, out, pkg string) ([]byte, error) {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	return cmd.CombinedOutput()
}
