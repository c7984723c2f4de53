package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/internal/testbin"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// TestGCAfterAKilledRunLeavesNothing kills a `rollbox run` (the built
// binary, docker backend, several long episodes) with SIGKILL mid-batch,
// runs `rollbox gc` beside another live run, and checks that gc removed the
// killed run's containers and temp files but not the live run's, that a
// second gc finds nothing, and that the killed run's trajectories recover
// as interrupted.
func TestGCAfterAKilledRunLeavesNothing(t *testing.T) {
	t.Parallel() // waits on its processes and containers (its own owners, TMPDIR and lease directory)
	needDocker(t)
	ctx := context.Background()
	dir := t.TempDir()
	bin := testbin.Build(t, "./cmd/rollbox")
	guest, err := images.NewBuilder(nil).Build(ctx, guestTarget)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp") // the processes' TMPDIR and lease directory
	os.Mkdir(tmp, 0o755)
	leases := filepath.Join(tmp, "leases")
	tasks := writeFile(t, dir, "tasks.jsonl", `{"id": "long", "prompt": "wait", "sandbox": {"backend": "docker", "image": "base"}, "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "x"}, "limits": {"max_turns": 3}}`)
	policy := writeFile(t, dir, "policy.jsonl", `{"task_id": "long", "turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 50", "timeout_s": 55}}]}, {"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`)
	killed, live := fmt.Sprintf("rollbox-gc-test-%d-killed", os.Getpid()), fmt.Sprintf("rollbox-gc-test-%d-live", os.Getpid())
	cli, err := docker.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	t.Cleanup(func() {
		docker.Cleanup(context.Background(), cli, killed)
		docker.Cleanup(context.Background(), cli, live)
	})
	env := append(os.Environ(), "TMPDIR="+tmp, "ROLLBOX_LEASE_DIR="+leases, "ROLLBOX_GUEST="+guest)
	start := func(owner, out string, group int) *exec.Cmd {
		cmd := exec.Command(bin, "run", "--tasks", tasks, "--policy", "scripted:"+policy, "--group", fmt.Sprint(group),
			"--concurrency", fmt.Sprint(group), "--out", out)
		cmd.Env = append(env, "ROLLBOX_OWNER="+owner)
		cmd.Stderr = &prefixWriter{t: t, prefix: owner}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	outKilled := filepath.Join(dir, "out-killed")
	victim := start(killed, outKilled, 3)
	other := start(live, filepath.Join(dir, "out-live"), 1)
	defer other.Process.Kill()
	defer victim.Process.Kill()

	count := func(owner string) int {
		list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", docker.LabelOwner+"="+owner))})
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	journals := func() []string {
		m, _ := filepath.Glob(filepath.Join(outKilled, "episodes", "*"+trajectory.PartialSuffix))
		return m
	}
	deadline := time.Now().Add(90 * time.Second)
	for count(killed) < 3 || count(live) < 1 || len(journals()) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("episodes did not start: %d + %d containers, %d journals", count(killed), count(live), len(journals()))
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // into the sleep 50
	victim.Process.Signal(syscall.SIGKILL)
	victim.Wait()
	if n := count(killed); n != 3 {
		t.Fatalf("after SIGKILL %d containers are left, want the 3 the run had", n)
	}

	gc := func() string {
		cmd := exec.Command(bin, "gc")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("rollbox gc: %v\n%s", err, out)
		}
		return string(out)
	}
	out := gc()
	t.Logf("first gc:\n%s", out)
	if n := count(killed); n != 0 {
		t.Errorf("gc left %d containers of the killed run", n)
	}
	if n := count(live); n != 1 {
		t.Errorf("gc removed the live run's container (%d left)", n)
	}
	// Other rollbox processes on this machine may have left orphans too:
	// at least the killed run's.
	if !regexp.MustCompile(`removed ([3-9]|\d\d+) orphaned containers`).MatchString(out) || !strings.Contains(out, "removed 1 lease files") {
		t.Errorf("first gc said %q", out)
	}

	// The live run ends cleanly; a second gc has nothing left to do.
	other.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- other.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the live run did not end on SIGTERM")
	}
	out = gc()
	t.Logf("second gc:\n%s", out)
	if !strings.Contains(out, "removed 0 lease files") {
		t.Errorf("second gc said %q", out)
	}
	if n := count(live); n != 0 {
		t.Errorf("%d containers of the ended run are left", n)
	}
	var files []string
	filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) > 0 {
		t.Errorf("temp files left: %v", files)
	}

	ts, _, err := trajectory.RecoverDir(filepath.Join(outKilled, "episodes"))
	if err != nil || len(ts) != 3 {
		t.Fatalf("recovered %d trajectories, err %v; want 3", len(ts), err)
	}
	for _, tr := range ts {
		if tr.Termination == nil || tr.Termination.Reason != trajectory.EndInterrupted || tr.Reward != nil {
			t.Errorf("%s: termination %+v reward %v, want interrupted and unscored", tr.EpisodeID, tr.Termination, tr.Reward)
		}
	}
}

// prefixWriter logs a child's stderr through t.
type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Logf("%s: %s", w.prefix, l)
	}
	return len(p), nil
}
