package wasm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
)

func newBackend(t *testing.T, opts Options) *Backend {
	t.Helper()
	b, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestHelpersRunConfined(t *testing.T) {
	b := newBackend(t, Options{})
	c, err := b.Confinement(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("confinement: %+v", c)
	if missing := unconfined(c); len(missing) > 0 {
		t.Fatalf("the helper lacks %v (%v)", missing, c.Notes)
	}
}

// The helper's own self-test: confined as a helper is, it tries to write,
// read and probe host paths, open sockets, start programs, signal and trace
// other processes, change identity and mount; every attempt must fail.
func TestTheHelpersConfinementRefusesTheHost(t *testing.T) {
	b := newBackend(t, Options{})
	argv, err := b.helperCommand(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ro := t.TempDir()
	out, err := exec.Command(argv[0], "selftest", ro).Output()
	if err != nil {
		t.Errorf("selftest: %v", err)
	}
	t.Logf("%s", out)
	for _, must := range []string{`"name":"write a host file","ok":true`, `"name":"read a host file (/etc/passwd)","ok":true`, `"name":"start a host program","ok":true`} {
		if !strings.Contains(string(out), must) {
			t.Errorf("selftest output lacks %s", must)
		}
	}
}

// One exec runs in a helper at a time, so a helper that dies mid-exec was
// killed by that exec: the error is ErrSandboxAbuse (scored), not
// infrastructure. The next exec gets a new helper.
func TestAnExecWhoseHelperDiesIsTheAgentsDoing(t *testing.T) {
	b := newBackend(t, Options{})
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	done := make(chan error, 1)
	go func() {
		_, err := sb.Exec(context.Background(), sandbox.ExecRequest{Shell: "sleep 30"})
		done <- err
	}()
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); len(pids) == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		pids = b.busyHelperPids()
	}
	if len(pids) != 1 {
		t.Fatalf("busy helpers: %v", pids)
	}
	syscall.Kill(pids[0], syscall.SIGKILL)
	select {
	case err := <-done:
		if !sandbox.IsAbuse(err) || sandbox.IsInfra(err) {
			t.Fatalf("err = %v; want ErrSandboxAbuse, not infrastructure", err)
		}
		t.Logf("%v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the exec did not end when its helper died")
	}
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Shell: "echo again"})
	if err != nil || string(res.Stdout) != "again\n" {
		t.Fatalf("next exec: %v %q", err, res.Stdout)
	}
	if b.HelperDeaths() != 1 {
		t.Errorf("HelperDeaths = %d, want 1", b.HelperDeaths())
	}
}

// The kernel bounds a helper's memory: past its cgroup limit the helper
// alone dies, its exec is the agent's doing, and the other sandboxes go on.
func TestAHelperOverItsMemoryLimitDiesAlone(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil && os.Getenv("CI") != "true" {
		t.Skip("no cgroup v1 memory hierarchy")
	}
	b := newBackend(t, Options{})
	if b.cg == nil {
		t.Fatalf("no cgroups: %s", b.cgNote)
	}
	b.setHelperMemoryBase(0) // the limit is then twice the exec's memory, plus output
	ctx := context.Background()
	bystander, _ := b.Create(ctx, sandbox.Spec{})
	defer bystander.Close()
	sb, _ := b.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{MemoryMB: 8}})
	defer sb.Close()
	// With no base, the helper may hold 2×8 MB: loading the python guest
	// (tens of MB of machine code) is past it, and the kernel kills the
	// helper during the command.
	_, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "python -c 'print(1)'"})
	if !sandbox.IsAbuse(err) {
		t.Fatalf("err = %v; want ErrSandboxAbuse", err)
	}
	if !strings.Contains(err.Error(), "memory limit") {
		t.Errorf("err = %v; want it to name the memory limit", err)
	}
	b.setHelperMemoryBase(helperMemoryBase)
	res, err := bystander.Exec(ctx, sandbox.ExecRequest{Shell: "echo fine"})
	if err != nil || string(res.Stdout) != "fine\n" {
		t.Fatalf("bystander: %v %q", err, res.Stdout)
	}
}

// A helper that cannot be started is infrastructure: unscored, named.
func TestAMissingHelperIsInfrastructure(t *testing.T) {
	b := newBackend(t, Options{HelperPath: filepath.Join(t.TempDir(), "no-such-helper")})
	sb, _ := b.Create(context.Background(), sandbox.Spec{})
	defer sb.Close()
	_, err := sb.Exec(context.Background(), sandbox.ExecRequest{Shell: "true"})
	if !sandbox.IsInfra(err) || sandbox.IsAbuse(err) {
		t.Fatalf("err = %v; want infrastructure", err)
	}
	// A program that is not the helper is refused at the handshake, not
	// hung on.
	b2 := newBackend(t, Options{HelperPath: "/bin/true"})
	sb2, _ := b2.Create(context.Background(), sandbox.Spec{})
	defer sb2.Close()
	start := time.Now()
	_, err = sb2.Exec(context.Background(), sandbox.ExecRequest{Shell: "true"})
	if !errors.Is(err, sandbox.ErrEngineUnavailable) || time.Since(start) > 15*time.Second {
		t.Fatalf("err = %v after %v; want ErrEngineUnavailable at once", err, time.Since(start))
	}
}

// Hostile scripts beside honest episodes: every honest one finishes with
// the right output, the host's files and this process's threads are
// unchanged, and no helper death is blamed on an honest episode.
func TestHostileScriptsBesideHonestEpisodes(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	hostDir := t.TempDir()
	t.Setenv("TMPDIR", hostDir)
	b := newBackend(t, Options{})
	ctx := context.Background()
	hostile := []string{
		`env TMPDIR=` + hostDir + ` sh -c 'cat <(echo pwned) > /tmp/x; echo pwned > ` + hostDir + `/f'`,
		`for i in $(seq 2000); do eval 'cat <(echo hi) >/dev/null'; done`,
		`x=a; while :; do x=$x$x; done`,
		`bomb() { bomb | bomb & }; bomb`,
		`f() { f; }; f`,
		`yes | sort`,
		`PWD=/proc/self/exe pwd -P; readlink -f /proc/self/exe; echo $$`,
		`head -c 100000000 /dev/zero > /work/big`,
		`while :; do :; done`,
		`exec 3>` + hostDir + `/fd; echo x >&3`,
	}
	threads := processThreads(t)
	before := listDir(t, hostDir)
	var wg sync.WaitGroup
	errs := make(chan string, 400)
	for i := 0; i < 200; i++ {
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			sb, err := b.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{MemoryMB: 32, PIDs: 64, DiskMB: 4, TmpMB: 1, ExecTimeout: time.Second}})
			if err != nil {
				errs <- err.Error()
				return
			}
			defer sb.Close()
			_, err = sb.Exec(ctx, sandbox.ExecRequest{Shell: hostile[i%len(hostile)]})
			if err != nil && !sandbox.IsAbuse(err) {
				errs <- "hostile " + hostile[i%len(hostile)] + ": " + err.Error()
			}
		}(i)
		go func(i int) {
			defer wg.Done()
			sb, err := b.Create(ctx, sandbox.Spec{})
			if err != nil {
				errs <- err.Error()
				return
			}
			defer sb.Close()
			want := strings.Repeat("ok\n", 3)
			for k := 0; k < 3; k++ {
				if err := sb.WriteFile(ctx, "/work/n", []byte("ok\n"), 0o644); err != nil {
					errs <- err.Error()
					return
				}
				res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "cat /work/n >> /work/out; sort /work/out | uniq -c | wc -l"})
				if err != nil || res.ExitCode != 0 {
					errs <- "honest: " + errString(err) + string(res.Stderr)
					return
				}
			}
			data, err := sb.ReadFile(ctx, "/work/out", 0)
			if err != nil || string(data) != want {
				errs <- "honest output: " + string(data) + errString(err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if after := listDir(t, hostDir); after != before {
		t.Errorf("the host directory changed:\n%s", after)
	}
	// This process keeps one thread per live helper (waiting for it to
	// exit), whatever the scripts do: bounded by MaxShells.
	if now := processThreads(t); now > threads+b.opts.MaxShells+8 {
		t.Errorf("threads grew from %d to %d (MaxShells %d)", threads, now, b.opts.MaxShells)
	}
	t.Logf("helper deaths: %d", b.HelperDeaths())
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func processThreads(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skip("no /proc/self/task")
	}
	return len(ents)
}

func listDir(t *testing.T, dir string) string {
	var out []string
	filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		out = append(out, p)
		return nil
	})
	return strings.Join(out, "\n")
}

// Execs queued for a helper (more at once than MaxShells) leave nothing
// behind once they ran: the queue of waiters does not keep its backing
// array, and with it every waiter's channel, after a burst (a rollout of
// thousands of episodes on a few helpers kept ~1.5 MB so).
func TestQueuedExecsLeaveNoWaitersBehind(t *testing.T) {
	b := newBackend(t, Options{MaxShells: 1})
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 24 {
		sb, err := b.Create(ctx, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx := ctx
			if i%4 == 3 { // some give up while queued
				c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
				defer cancel()
				cctx = c
			}
			sb.Exec(cctx, sandbox.ExecRequest{Shell: "sleep 0.05"})
		}()
	}
	wg.Wait()
	b.mu.Lock()
	n, c := len(b.waiters), cap(b.waiters)
	b.mu.Unlock()
	if n != 0 || c != 0 {
		t.Fatalf("after the burst the waiters queue has length %d and keeps room for %d", n, c)
	}
}

// A program compiled into the on-disk cache is not compiled again by a
// later backend (another run: the compile subprocess cost 0.5-1.1 s a
// guest every run before), and is compiled again when what the cache holds
// is gone or the program changed, so a run never starts helpers on a cache
// that lacks it.
func TestACompiledProgramIsNotCompiledAgainByALaterRun(t *testing.T) {
	mod := buildC(t, `#include <stdio.h>
int main(void) { printf("hello\n"); return 0; }
`)
	dir := t.TempDir()
	prog := filepath.Join(dir, "hello.wasm")
	if err := os.WriteFile(prog, mod, 0o644); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	builder := images.NewBuilder(nil) // the helper from the usual cache
	ctx := context.Background()
	run := func(what string, wantCompiles int64) {
		t.Helper()
		b := newBackend(t, Options{CacheDir: cache, Builder: builder, Programs: map[string]string{"hello": prog}})
		if err := b.Warm(ctx, "hello"); err != nil {
			t.Fatalf("%s: warm: %v", what, err)
		}
		if got := b.compiles.Load(); got != wantCompiles {
			t.Errorf("%s: %d compile(s), want %d", what, got, wantCompiles)
		}
		sb, err := b.Create(ctx, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close()
		res := execT(t, sb, sandbox.ExecRequest{Argv: []string{"hello"}})
		if res.ExitCode != 0 || string(res.Stdout) != "hello\n" {
			t.Errorf("%s: hello: exit %d stdout %q stderr %q", what, res.ExitCode, res.Stdout, res.Stderr)
		}
	}
	run("first run", 1)
	run("second run", 0)
	if err := os.RemoveAll(filepath.Join(cache, "wazero")); err != nil {
		t.Fatal(err)
	}
	run("after the compilation cache was removed", 1)
	run("after it was filled again", 0)
	// The program's file written again (a new build at the same path).
	later := time.Now().Add(2 * time.Second)
	if err := os.WriteFile(prog, mod, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(prog, later, later); err != nil {
		t.Fatal(err)
	}
	run("after the program was written again", 1)
}
