package cluster_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cluster"
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

// consumerAckWait is the ack wait of backend's work queue consumer as the
// NATS server at url holds it.
func consumerAckWait(t *testing.T, url, backend string) time.Duration {
	t.Helper()
	nc, js, err := cluster.Connect(url, "test-consumer-info")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, cluster.WorkStream, cluster.WorkConsumer(backend))
	if err != nil {
		t.Fatal(err)
	}
	return cons.CachedInfo().Config.AckWait
}

// TestAWorkerWithAnotherAckWaitThanTheLiveWorkersIsRefused: a worker
// started with an --ack-wait other than the one the live workers of its
// backend use exits at once, naming the flag and both values, and leaves
// the work queue as it is: the episode a live worker runs (kept with
// news every third of 6 s) is not redelivered to it after its 1 s, and
// ends once, finished. Once no live worker of the backend is left, a
// worker with another --ack-wait sets it on the work queue.
func TestAWorkerWithAnotherAckWaitThanTheLiveWorkersIsRefused(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	pol, blocked, release := gatePolicy()
	defer pol.Close()
	defer release()
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	first := startWorker(t, ns.url, "wslow", "wasm", 1, "--ack-wait", "6s")
	first.waitStarted(t)
	coord.waitWorkers(1)
	id := coord.submit(rolloutRequest(pol.URL(), exactTasks(1), 1, nil))
	<-blocked // the episode runs on the first worker and has asked the policy
	second := startWorker(t, ns.url, "wfast", "wasm", 1, "--ack-wait", "1s")
	exited := make(chan error, 1)
	go func() { exited <- second.cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Errorf("the worker with --ack-wait 1s exited with %v, want a failure", err)
		}
		if log := second.logText(); !strings.Contains(log, "--ack-wait 1s") || !strings.Contains(log, "6s") || strings.Contains(log, `"msg":"worker started"`) {
			t.Errorf("the refused worker's error does not name --ack-wait and both values (or it started):\n%s", log)
		}
	case <-time.After(8 * time.Second): // eight of its ack waits beside the live worker
		t.Errorf("a worker with --ack-wait 1s ran beside a live worker at 6s:\n%s", second.logText())
	}
	release()
	tr := one(t, coord.episodes(id, time.Minute))
	if tr.Termination.Reason != trajectory.EndFinished || tr.Termination.Interrupted || tr.Reward == nil || tr.Reward.Total == nil || *tr.Reward.Total != 1 {
		t.Errorf("episode %s: %+v, want finished with reward 1 on the first worker (not redelivered while it ran)", tr.EpisodeID, tr.Termination)
	}
	if got := consumerAckWait(t, ns.url, "wasm"); got != 6*time.Second {
		t.Errorf("the work queue's ack wait is %s with the 6s worker live, want 6s", got)
	}
	first.term()
	waitProcess(first.cmd, 20*time.Second)
	startWorker(t, ns.url, "wnext", "wasm", 1, "--ack-wait", "2s").waitStarted(t)
	if got := consumerAckWait(t, ns.url, "wasm"); got != 2*time.Second {
		t.Errorf("the work queue's ack wait is %s after the only live worker left and one at 2s started, want 2s", got)
	}
}

// TestAWorkerFollowsTheWorkQueuesAckWait: the ack wait of a backend's work
// queue changed on the NATS server (here from the worker's 6 s to 1.5 s,
// just after the worker sent news of its item) is followed by the worker
// running an episode: it sends news every third of the new value, so the
// item is not redelivered (to its own free slot) and the episode ends
// once, finished.
func TestAWorkerFollowsTheWorkQueuesAckWait(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	pol, blocked, release := gatePolicy()
	defer pol.Close()
	defer release()
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	startWorker(t, ns.url, "wfollow", "wasm", 2, "--ack-wait", "6s").waitStarted(t)
	coord.waitWorkers(1)
	nc, js, err := cluster.Connect(ns.url, "test-ack-wait")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	acks := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe("$JS.ACK."+cluster.WorkStream+".>", acks)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	id := coord.submit(rolloutRequest(pol.URL(), exactTasks(1), 1, nil))
	<-blocked
	deadline := time.After(30 * time.Second)
wpi:
	for {
		select {
		case m := <-acks:
			if string(m.Data) == "+WPI" {
				break wpi
			}
		case <-deadline:
			t.Fatal("the worker sent no news (InProgress) of the item it runs within 30 s")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.UpdateConsumer(ctx, cluster.WorkStream, cluster.WorkConsumerConfig("wasm", 1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // two of the worker's former news intervals
	release()
	tr := one(t, coord.episodes(id, time.Minute))
	if tr.Termination.Reason != trajectory.EndFinished || tr.Termination.Interrupted {
		t.Errorf("episode %s: %+v, want finished (its item not redelivered while it ran)", tr.EpisodeID, tr.Termination)
	}
}
