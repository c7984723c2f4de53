// Package python_test runs the Python client's pytest suite
// (clients/python/tests) from `go test ./...`, so the repository's one test
// command covers it: it builds rollbox and the fake policy server, then runs
// pytest with them. Under CI=true a missing python3 or pytest fails the test
// instead of skipping it (.ci/python.sh installs Debian's python3-pytest).
package python_test

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/rollbox/rollbox/internal/testbin"
)

func ci() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v == "true" || v == "1" || v == "yes"
}

// python finds an interpreter that has pytest: $ROLLBOX_PYTHON, Debian's
// /usr/bin/python3, then python3 on the PATH.
func python(t *testing.T) string {
	var tried []string
	for _, p := range []string{os.Getenv("ROLLBOX_PYTHON"), "/usr/bin/python3", "python3"} {
		if p == "" {
			continue
		}
		path, err := exec.LookPath(p)
		if err != nil {
			tried = append(tried, p+": not found")
			continue
		}
		if out, err := exec.Command(path, "-c", "import pytest").CombinedOutput(); err != nil {
			tried = append(tried, p+": no pytest ("+strings.TrimSpace(string(out))+")")
			continue
		}
		return path
	}
	msg := "no python3 with pytest (apt-get install python3-pytest, or bash .ci/python.sh): " + strings.Join(tried, "; ")
	if ci() {
		t.Fatal(msg + " (CI=true: may not skip)")
	}
	t.Skip(msg)
	return ""
}

func TestPythonClient(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the Python client's suite starts services")
	}
	py := python(t)
	rollbox := testbin.Build(t, "./cmd/rollbox")
	fake := testbin.Build(t, "./internal/fakepolicy/fakepolicyd")
	cmd := exec.CommandContext(t.Context(), py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests")
	cmd.Env = append(os.Environ(), "ROLLBOX_BIN="+rollbox, "ROLLBOX_FAKEPOLICY_BIN="+fake, "PYTHONDONTWRITEBYTECODE=1")
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			t.Log(sc.Text())
		}
	}()
	err := cmd.Run()
	w.Close()
	wg.Wait()
	if err != nil {
		t.Fatalf("pytest: %v (its output is above)", err)
	}
}
