package cluster_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
)

// TestAWorkerStoppedBySIGTERMFinishesWhatItRuns: SIGTERM makes a worker
// take no more work and finish the episode it runs (stored, finished, with
// its reward), and it says so, not that its episodes are recorded
// interrupted (what rollbox serve and run say).
func TestAWorkerStoppedBySIGTERMFinishesWhatItRuns(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	pol, blocked, release := gatePolicy()
	defer pol.Close()
	defer release()
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	w := startWorker(t, ns.url, "wterm", "wasm", 1)
	coord.waitWorkers(1)
	id := coord.submit(rolloutRequest(pol.URL(), exactTasks(1), 1, nil))
	<-blocked
	w.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- w.cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the worker exited (%v) before the episode it runs ended:\n%s", err, w.logText())
	case <-time.After(500 * time.Millisecond):
	}
	release()
	tr := one(t, coord.episodes(id, time.Minute))
	if tr.Termination.Reason != trajectory.EndFinished || tr.Termination.Interrupted || tr.Reward == nil || tr.Reward.Total == nil || *tr.Reward.Total != 1 {
		t.Errorf("episode %s: %+v reward %+v, want finished with reward 1", tr.EpisodeID, tr.Termination, tr.Reward)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not exit after its episode was stored:\n%s", w.logText())
	}
	log := w.logText()
	if strings.Contains(log, "recorded interrupted") || !strings.Contains(log, "SIGTERM: stopping: no more work is taken; the episodes running here finish") {
		t.Errorf("the worker's SIGTERM notice does not say what it does:\n%s", log)
	}
}

// TestASecondWorkerWithALiveWorkersIDIsRefused: a worker started with the
// --id of a live worker exits at once with an error naming the flag and
// the live worker; the live one keeps its ID and its work.
func TestASecondWorkerWithALiveWorkersIDIsRefused(t *testing.T) {
	pol := scripted(0)
	defer pol.Close()
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	first := startWorker(t, ns.url, "same", "wasm", 2)
	first.waitStarted(t)
	second := startWorker(t, ns.url, "same", "wasm", 2)
	done := make(chan error, 1)
	go func() { done <- second.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Errorf("the second worker exited with %v, want a failure", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("a second worker with a live worker's --id was not refused:\n%s", second.logText())
	}
	if log := second.logText(); !strings.Contains(log, "--id same") || !strings.Contains(log, "answers to it") || strings.Contains(log, `"msg":"worker started"`) {
		t.Errorf("the second worker's error does not name --id and the live worker (or it started):\n%s", log)
	}
	if first.cmd.ProcessState != nil {
		t.Fatalf("the live worker exited:\n%s", first.logText())
	}
	coord.waitWorkers(1)
	id := coord.submit(rolloutRequest(pol.URL(), exactTasks(2), 2, nil))
	for _, tr := range coord.episodes(id, time.Minute) {
		if tr.Termination.Reason != trajectory.EndFinished {
			t.Errorf("episode %s: %+v, want finished on the live worker", tr.EpisodeID, tr.Termination)
		}
	}
	// A killed worker's ID is free again at once.
	first.kill()
	startWorker(t, ns.url, "same", "wasm", 2).waitStarted(t)
}

// TestAWorkerFreesARolloutsPolicyClient: the policy client a worker makes
// for a rollout is freed once the rollout's episodes have ended (after the
// rollout idle time), so a long-lived worker holds none of the rollouts it
// ran before.
func TestAWorkerFreesARolloutsPolicyClient(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() {
		ended <- runtime.RunWorker(ctx, runtime.WorkerOptions{URL: ns.url, ID: "inproc", Backend: "wasm", Slots: 4, DataDir: t.TempDir(),
			Heartbeat: 200 * time.Millisecond, RolloutIdle: 300 * time.Millisecond, Logger: quietLogger(), Registry: reg,
			Backends: wasmOnly(t)})
	}()
	defer func() {
		cancel()
		if err := <-ended; err != nil {
			t.Errorf("RunWorker: %v", err)
		}
	}()
	coord.waitWorkers(1)
	clients := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "rollbox_worker_rollout_clients" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("the worker has no rollbox_worker_rollout_clients gauge")
		return 0
	}
	for round := range 3 {
		pol, blocked, release := gatePolicy()
		defer pol.Close()
		defer release() // before RunWorker's end, which waits for its episodes
		id := coord.submit(rolloutRequest(pol.URL(), exactTasks(2), 2, nil))
		<-blocked
		if n := clients(); n != 1 {
			t.Errorf("round %d: %v rollout clients held while a rollout runs, want 1", round, n)
		}
		release()
		if got := coord.episodes(id, time.Minute); len(got) != 4 {
			t.Fatalf("round %d: %d episodes, want 4", round, len(got))
		}
		deadline := time.Now().Add(10 * time.Second)
		for clients() != 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if n := clients(); n != 0 {
			t.Fatalf("round %d: %v rollout clients held after the rollout ended, want 0", round, n)
		}
	}
}

// TestAWorkerWantsAnAckWaitOfASecondOrMore: --ack-wait under a second (its
// work items would be redelivered between the news it sends) is refused
// before the worker connects, naming the flag.
func TestAWorkerWantsAnAckWaitOfASecondOrMore(t *testing.T) {
	for _, v := range []string{"0s", "500ms", "-1s"} {
		out, err := exec.Command(rollboxBinary(t), "worker", "--cluster", "nats://127.0.0.1:1", "--slots", "1", "--ack-wait="+v).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !strings.Contains(string(out), "--ack-wait "+v) {
			t.Errorf("--ack-wait=%s: %v, %q; want refused naming --ack-wait", v, err, out)
		}
	}
}
