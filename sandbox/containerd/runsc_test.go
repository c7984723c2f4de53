package containerd_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
)

// runscProcess is the host pid of a runsc sandbox's process whose
// command line starts with name (runsc-sandbox: the sentry; runsc-gofer:
// its file server) and names the sandbox id, or 0.
func runscProcess(t *testing.T, name, id string) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if args[0] != name || !strings.Contains(string(b), id) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		return pid
	}
	return 0
}

// alive says whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// A runsc sandbox whose sentry or gofer is wedged (here: its host process
// stopped) is still closed within seconds, with nothing left of it. Before,
// Close asked the runc shim for `runsc kill --all`, which waits for the
// sentry to pause every task of the sandbox: a sentry that does not answer,
// or a task stuck in a call to a gofer that does not, held the kill until
// the removal's deadline (2 minutes by default) and Close failed with
// "kill: context deadline exceeded", leaving the container behind.
func TestCloseOfAWedgedRunscSandboxIsBounded(t *testing.T) {
	b := newBackend(t, containerd.Options{RemoveTimeout: 40 * time.Second})
	for _, wedged := range []string{"runsc-sandbox", "runsc-gofer"} {
		t.Run(wedged, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: sandbox.RuntimeRunsc})
			if err != nil {
				t.Fatal(err)
			}
			id := sb.Info().ID
			pid := runscProcess(t, wedged, id)
			if pid == 0 {
				sb.Close()
				t.Fatalf("no %s process of %s on the host", wedged, id)
			}
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
			// A command that opens files: with the gofer stopped, its
			// task is stuck in a call to it.
			go sb.Exec(ctx, sandbox.ExecRequest{Shell: "cat /etc/hostname; ls -R / >/dev/null", Timeout: time.Minute})
			time.Sleep(500 * time.Millisecond)
			start := time.Now()
			err = sb.Close()
			took := time.Since(start)
			if err != nil || took > 15*time.Second {
				t.Fatalf("Close took %v (at most 15s): %v", took.Round(time.Millisecond), err)
			}
			if alive(pid) {
				t.Errorf("the %s process %d still runs after Close", wedged, pid)
			}
			if left := remains(t, sb.Info()); len(left) > 0 {
				t.Errorf("left after Close: %v", left)
			}
			t.Logf("Close of a sandbox with %s stopped: %v", wedged, took.Round(time.Millisecond))
		})
	}
}
