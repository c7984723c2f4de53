package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cluster"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// prefixTasks are exactTasks(n) whose even tasks have a prefix (one
// scripted turn appending "prefix" to /work/n, which the scripted policy
// then reads): their groups run as group items, the odd tasks' episodes
// as single items beside them.
func prefixTasks(n int) []map[string]any {
	tasks := exactTasks(n)
	for i, t := range tasks {
		if i%2 == 0 {
			t["prefix"] = map[string]any{"turns": []any{map[string]any{"content": "setting up", "tool_calls": []any{
				map[string]any{"name": "bash", "arguments": map[string]any{"command": "echo prefix >> /work/n"}}}}}}
		}
	}
	return tasks
}

// shape is what of an episode's record must be the same on every host
// beyond its outcome: where it forked from and its steps (type, tool,
// output), rollout ids stripped.
func shape(tr *trajectory.Trajectory) string {
	var b strings.Builder
	if f := tr.ForkedFrom; f != nil {
		fmt.Fprintf(&b, "forked_from %s step %d; ", strings.TrimPrefix(f.EpisodeID, tr.RolloutID+"."), f.Step)
	}
	for _, s := range tr.Steps {
		fmt.Fprintf(&b, "[%s %s %q %q]", s.Type, s.Name, s.Content, s.Output)
	}
	return b.String()
}

func shapes(ts []*trajectory.Trajectory) map[string]string {
	out := map[string]string{}
	for _, tr := range ts {
		out[strings.TrimPrefix(tr.EpisodeID, tr.RolloutID+".")] = shape(tr)
	}
	return out
}

// waitRecord waits (10 s at most) for a file and reads it as a record.
func waitRecord(t *testing.T, path string) *trajectory.Trajectory {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tr, err := trajectory.Read(path)
		if err == nil {
			return tr
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record at %s: %v", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAPrefixRolloutOverWorkersMatchesOneHost: a rollout whose tasks have
// a prefix runs each group as one work item on one worker (a worker with
// fewer slots than the group leaves it to one with room): the prefix runs
// once, each episode is a fork of it, and the records (forked_from, the
// steps), rewards and group statistics are those of the same rollout on
// one host; the prefix's own record is kept under DATA/prefixes as one
// host keeps it.
func TestAPrefixRolloutOverWorkersMatchesOneHost(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	pol := prefixScript(0, nil)
	defer pol.Close()
	tasks, group := prefixTasks(4), 3

	single := startService(t, "", "")
	want := single.episodes(single.submit(rolloutRequest(pol.URL(), tasks, group, nil)), 2*time.Minute)

	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	startWorker(t, ns.url, "big", "wasm", 4)
	small := startWorker(t, ns.url, "small", "wasm", 2)
	coord.waitWorkers(2)
	id := coord.submit(rolloutRequest(pol.URL(), tasks, group, nil))
	got := coord.episodes(id, 3*time.Minute)
	compareOutcomes(t, outcomes(t, got), outcomes(t, want))
	gs, ws := shapes(got), shapes(want)
	for k, w := range ws {
		if gs[k] != w {
			t.Errorf("episode %s over workers:\n  %s\non one host:\n  %s", k, gs[k], w)
		}
	}
	for _, tr := range got {
		if strings.HasSuffix(tr.TaskID, "0") || strings.HasSuffix(tr.TaskID, "2") {
			if tr.ForkedFrom == nil || tr.ForkedFrom.EpisodeID != tr.GroupID+".prefix" {
				t.Errorf("episode %s: forked_from %+v, want the group's prefix %s.prefix", tr.EpisodeID, tr.ForkedFrom, tr.GroupID)
			}
			if len(tr.Steps) < 4 || !strings.Contains(tr.Steps[3].Output, "prefix") {
				t.Errorf("episode %s does not see the prefix's file: %s", tr.EpisodeID, shape(tr))
			}
		}
	}
	for _, task := range []string{"t0", "t2"} {
		pre := waitRecord(t, filepath.Join(coord.data, "prefixes", id+"."+task+".prefix.json"))
		if pre.Termination == nil || !strings.Contains(pre.Termination.Message, "prefix done: 3 episodes") || len(pre.Steps) != 2 {
			t.Errorf("prefix %s: %+v with %d steps, want ended \"prefix done: 3 episodes …\" after its 2 steps", pre.EpisodeID, pre.Termination, len(pre.Steps))
		}
	}
	if log := small.logText(); strings.Contains(log, "group") && !strings.Contains(log, "more than this worker's --slots") {
		t.Errorf("the small worker took a group item without the reason:\n%s", log)
	}
	var st struct {
		State        string `json:"state"`
		EpisodesDone int    `json:"episodes_done"`
		InfraRetries int    `json:"infra_retries"`
	}
	coord.do("GET", "/v1/rollouts/"+id, nil, &st)
	if st.State != "done" || st.EpisodesDone != len(tasks)*group || st.InfraRetries != 0 {
		t.Errorf("rollout %s: %+v, want done with %d episodes, no infra retry", id, st, len(tasks)*group)
	}
}

// prefixScript answers like scripted, one turn later: a prefix task's
// episodes start after the prefix's turn, so each asks the policy twice
// (cat, then finish); the other tasks cat twice, then finish.
func prefixScript(latency time.Duration, fault func(int64, *fakepolicy.Request) fakepolicy.Fault) *fakepolicy.Server {
	cat := fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command":"cat /work/n"}`}}}
	return mustPolicy(fakepolicy.Config{Latency: latency, Fault: fault, Responder: fakepolicy.Script(cat, cat,
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer":"a"}`}}})})
}

// TestAWorkerKilledMidGroup: SIGKILL of the worker running a prefix group
// (1) before any member asked the policy (the prefix's open is held on a
// FIFO workspace): the group is redelivered whole and runs on another
// worker, to the ends it would have had, each lost attempt kept as an
// infrastructure attempt; (2) after every member asked: each ends
// cancelled, interrupted, with its partial journal, once, and nothing runs
// again; (3) the same with retry_interrupted: the group runs again.
func TestAWorkerKilledMidGroup(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	top := t
	var natsURL string
	workers := map[string]*worker{}
	start := func(id string, slots int) *worker {
		w := startWorker(top, natsURL, id, "wasm", slots)
		workers[id] = w
		return w
	}
	gate, ws, tarball := fifoGateTask(t, `"prefix": {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo prefix >> /work/n"}}]}]}`)
	ns := startNATS(t, "", 0)
	natsURL = ns.url
	coord := startService(t, "", ns.url, func(o *runtime.Options) { o.Catalog = []*agent.Task{gate} })
	const group = 3
	submit := func(pol *fakepolicy.Server, extra map[string]any) string {
		req := map[string]any{"tasks": []any{map[string]any{"id": "gate"}}, "group_size": group,
			"policy": map[string]any{"base_url": pol.URL(), "model": "fake-model"}}
		for k, v := range extra {
			req[k] = v
		}
		return coord.submit(req)
	}
	finished := func(t *testing.T, tr *trajectory.Trajectory, prefix string) {
		t.Helper()
		if tr.Termination.Reason != trajectory.EndFinished || tr.Reward == nil || tr.Reward.Total == nil || *tr.Reward.Total != 1 ||
			tr.ForkedFrom == nil || tr.ForkedFrom.EpisodeID != tr.GroupID+prefix {
			t.Errorf("episode %s: %+v reward %+v forked_from %+v, want finished with reward 1, forked from %s%s",
				tr.EpisodeID, tr.Termination, tr.Reward, tr.ForkedFrom, tr.GroupID, prefix)
		}
	}

	t.Run("before any member asked, the group runs again elsewhere", func(t *testing.T) {
		pol := prefixScript(0, nil)
		defer pol.Close()
		wA := start("wA", group)
		coord.waitWorkers(1)
		id := submit(pol, nil)
		coord.waitRunning("wA", group)
		wA.kill()
		start("wB", group)
		go func() {
			f, err := os.OpenFile(ws, os.O_WRONLY, 0) // blocks until wB reads
			if err == nil {
				f.Write(tarball)
				f.Close()
			}
		}()
		got := coord.episodes(id, time.Minute)
		if len(got) != group {
			t.Fatalf("%d episodes, want %d", len(got), group)
		}
		for _, tr := range got {
			finished(t, tr, ".prefix.2") // the prefix's second run
			kept, err := trajectory.Read(filepath.Join(coord.data, "attempts", tr.EpisodeID+".1.json"))
			if err != nil || !strings.Contains(kept.Termination.Message, "wA") {
				t.Errorf("the lost attempt of %s is not kept naming wA: %v", tr.EpisodeID, err)
			}
		}
		if pol.Calls() != 2*group {
			t.Errorf("the policy was called %d times, want %d (the lost attempts asked nothing)", pol.Calls(), 2*group)
		}
		var st struct {
			InfraRetries int `json:"infra_retries"`
		}
		coord.do("GET", "/v1/rollouts/"+id, nil, &st)
		if st.InfraRetries != group {
			t.Errorf("infra_retries %d, want %d", st.InfraRetries, group)
		}
	})
	// From here the workspace is a plain archive: the open goes through.
	os.Remove(ws)
	if err := os.WriteFile(ws, tarball, 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name         string
		retry        bool
		victim, next string
	}{
		{"after every member asked, each ends cancelled and interrupted with its partial journal, once", false, "wB", "wC"},
		{"after every member asked, with retry_interrupted the group runs again", true, "wC", "wD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every member's second call is held.
			h := newCallHold()
			blocked, release := h.blocked, h.release
			defer release()
			pol := prefixScript(0, func(_ int64, req *fakepolicy.Request) fakepolicy.Fault {
				if req.AssistantTurns() >= 2 {
					h.hold()
				}
				return fakepolicy.Fault{}
			})
			defer pol.Close()
			coord.waitWorkers(1)
			extra := map[string]any{}
			if tc.retry {
				extra["retry_interrupted"] = true
			}
			id := submit(pol, extra)
			for range group {
				<-blocked
			}
			workers[tc.victim].kill()
			release()
			start(tc.next, group)
			got := coord.episodes(id, time.Minute)
			if len(got) != group {
				t.Fatalf("%d episodes, want %d", len(got), group)
			}
			for _, tr := range got {
				if tc.retry {
					finished(t, tr, ".prefix.2")
					continue
				}
				if tr.Termination.Reason != trajectory.EndCancelled || !tr.Termination.Interrupted || tr.Reward != nil && tr.Reward.Total != nil || len(tr.Steps) != 4 {
					t.Errorf("episode %s: %+v reward %+v, %d steps; want cancelled, interrupted, unscored, with the prefix's 2 steps and its first turn's 2",
						tr.EpisodeID, tr.Termination, tr.Reward, len(tr.Steps))
				}
			}
			if !tc.retry && pol.Calls() != 2*group {
				t.Errorf("the policy was called %d times, want %d (no re-run)", pol.Calls(), 2*group)
			}
			if tc.retry && pol.Calls() != 4*group {
				t.Errorf("the policy was called %d times, want %d (each member twice per run)", pol.Calls(), 4*group)
			}
		})
	}
}

// parlTasks are n WASM orchestrator tasks: the frozen sub-agents are
// served by sub, the reward is PARL's over an exact answer "done".
func parlTasks(n int, sub *fakepolicy.Server) []map[string]any {
	tasks := exactTasks(n)
	for _, t := range tasks {
		t["orchestrator"] = map[string]any{"subagent_policy": map[string]any{"base_url": sub.URL(), "model": "frozen"}, "max_parallel": 3}
		t["reward"] = map[string]any{"type": "parl", "perf": map[string]any{"type": "exact", "answer": "done"},
			"lambda_parallel": 0.5, "lambda_finish": 0.5, "parallel_cap": 3, "anneal": map[string]any{"schedule": "cosine", "steps": 100}}
	}
	return tasks
}

// TestAPARLRolloutOverWorkersMatchesOneHost: orchestrator (PARL) episodes
// run over workers, each tree on one worker: its sub-agents take that
// worker's slots (two slots for orchestrators of three sub-agents each:
// a waiting orchestrator lends its own), and the records (the tree, the
// critical and total steps, the annealed reward), group statistics and
// the sub-agents' own records, kept beside the episodes' as on one host,
// are those of the same rollout on one host.
func TestAPARLRolloutOverWorkersMatchesOneHost(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	orch := mustPolicy(fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "spawn_subagents", Arguments: `{"tasks": [{"prompt": "look at a"}, {"prompt": "look at b"}, {"prompt": "look at c"}]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}})})
	defer orch.Close()
	sub := mustPolicy(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	defer sub.Close()
	tasks, group := parlTasks(2, sub), 2
	extra := map[string]any{"train_step": 50}

	single := startService(t, "", "")
	want := single.episodes(single.submit(rolloutRequest(orch.URL(), tasks, group, extra)), 2*time.Minute)
	subCalls := sub.Calls()

	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	startWorker(t, ns.url, "w1", "wasm", 2)
	coord.waitWorkers(1)
	id := coord.submit(rolloutRequest(orch.URL(), tasks, group, extra))
	got := coord.episodes(id, 3*time.Minute)
	compareOutcomes(t, outcomes(t, got), outcomes(t, want))
	tree := func(tr *trajectory.Trajectory) string {
		s := fmt.Sprintf("reward %v; ", tr.Reward.Components)
		if tr.Stats.CriticalSteps != nil && tr.Stats.TotalSteps != nil {
			s += fmt.Sprintf("critical %d total %d; ", *tr.Stats.CriticalSteps, *tr.Stats.TotalSteps)
		}
		for _, sa := range tr.Subagents {
			s += fmt.Sprintf("[%s %s %s useful=%v] ", strings.TrimPrefix(sa.EpisodeID, tr.RolloutID+"."), sa.End, strings.TrimPrefix(sa.File, "subagents/"+tr.RolloutID+"."), sa.Useful)
		}
		return s + shape(tr)
	}
	ws := map[string]string{}
	for _, tr := range want {
		ws[strings.TrimPrefix(tr.EpisodeID, tr.RolloutID+".")] = tree(tr)
	}
	for _, tr := range got {
		k := strings.TrimPrefix(tr.EpisodeID, tr.RolloutID+".")
		if g := tree(tr); g != ws[k] {
			t.Errorf("episode %s over workers:\n  %s\non one host:\n  %s", k, g, ws[k])
		}
		if len(tr.Subagents) != 3 {
			t.Errorf("episode %s has %d sub-agents, want 3", tr.EpisodeID, len(tr.Subagents))
		}
		for _, sa := range tr.Subagents {
			st, err := trajectory.Read(filepath.Join(coord.data, "episodes", sa.File))
			if err != nil || st.Parent == nil || st.Parent.EpisodeID != tr.EpisodeID || st.Policy.Model != "frozen" || st.Termination == nil {
				t.Errorf("sub-agent %s: no record beside the episode's on the coordinator (%v), or not the tree's: %+v", sa.EpisodeID, err, st)
			}
		}
	}
	if n := sub.Calls() - subCalls; n != subCalls {
		t.Errorf("the sub-agent policy answered %d calls over workers, %d on one host", n, subCalls)
	}
}

// TestAWorkerKilledWhileAnOrchestratorsSubagentsRun: the worker running
// an orchestrator episode is SIGKILLed while its sub-agents run (after
// the orchestrator asked the policy): the episode ends cancelled,
// interrupted, with its partial journal, once, and nothing runs again; with
// retry_interrupted it runs again, tree and all, on another worker.
func TestAWorkerKilledWhileAnOrchestratorsSubagentsRun(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	orch := mustPolicy(fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "spawn_subagents", Arguments: `{"tasks": [{"prompt": "look at a"}, {"prompt": "look at b"}]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}})})
	defer orch.Close()
	h := newCallHold()
	blocked, release := h.blocked, h.release
	defer release()
	sub := mustPolicy(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1), Fault: func(_ int64, _ *fakepolicy.Request) fakepolicy.Fault {
		h.hold()
		return fakepolicy.Fault{}
	}})
	defer sub.Close()
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	victim := startWorker(t, ns.url, "wA", "wasm", 2)
	coord.waitWorkers(1)
	for _, retry := range []bool{false, true} {
		extra := map[string]any{}
		if retry {
			extra["retry_interrupted"] = true
		}
		id := coord.submit(rolloutRequest(orch.URL(), parlTasks(1, sub), 1, extra))
		<-blocked
		<-blocked // both sub-agents ask their policy
		victim.kill()
		if retry {
			release()
		}
		next := startWorker(t, ns.url, fmt.Sprintf("w%v", retry), "wasm", 2)
		tr := one(t, coord.episodes(id, time.Minute))
		switch {
		case !retry && (tr.Termination.Reason != trajectory.EndCancelled || !tr.Termination.Interrupted || tr.Reward != nil && tr.Reward.Total != nil || len(tr.Steps) == 0 || len(tr.Steps[0].ToolCalls) != 1 || tr.Steps[0].ToolCalls[0].Name != "spawn_subagents"):
			t.Errorf("episode %s: %+v reward %+v, %d steps; want cancelled, interrupted, unscored, with the orchestrator's spawn in its partial journal", tr.EpisodeID, tr.Termination, tr.Reward, len(tr.Steps))
		case retry && (tr.Termination.Reason != trajectory.EndFinished || tr.Reward == nil || tr.Reward.Total == nil || len(tr.Subagents) != 2):
			t.Errorf("episode %s: %+v reward %+v, %d sub-agents; want finished, scored, with its 2 sub-agents", tr.EpisodeID, tr.Termination, tr.Reward, len(tr.Subagents))
		}
		if !retry && orch.Calls() != 1 {
			t.Errorf("the orchestrator's policy was called %d times, want 1 (no re-run)", orch.Calls())
		}
		victim = next
	}
}

// TestTheCoordinatorKilledMidGroupLosesNothing: the coordinator (rollbox
// serve --cluster) is SIGKILLed while prefix groups run on workers and is
// started again on its data directory: it finds each group's item still in
// the stream (in flight) or dispatches the group again, and every episode
// ends once, with the records and group statistics of one host.
func TestTheCoordinatorKilledMidGroupLosesNothing(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	pol := prefixScript(150*time.Millisecond, nil)
	defer pol.Close()
	tasks, group := prefixTasks(6), 3
	single := startService(t, "", "")
	want := single.episodes(single.submit(rolloutRequest(pol.URL(), tasks, group, nil)), 2*time.Minute)

	ns := startNATS(t, "", 0)
	data, port := t.TempDir(), freePort(t)
	coord := startServe(t, ns.url, data, port)
	startWorker(t, ns.url, "w1", "wasm", 3)
	startWorker(t, ns.url, "w2", "wasm", 3)
	coord.waitWorkers(2)
	id := coord.submit(rolloutRequest(pol.URL(), tasks, group, nil))
	coord.waitDone(id, 3)
	coord.kill()
	time.Sleep(300 * time.Millisecond) // the workers go on meanwhile
	coord.restart(t)
	got := coord.episodes(id, 3*time.Minute)
	compareOutcomes(t, outcomes(t, got), outcomes(t, want))
	gs, ws := shapes(got), shapes(want)
	for k, w := range ws {
		if gs[k] != w {
			t.Errorf("episode %s over workers:\n  %s\non one host:\n  %s", k, gs[k], w)
		}
	}
	records, _ := filepath.Glob(filepath.Join(data, "episodes", id+".*.json"))
	if len(records) != len(tasks)*group {
		t.Errorf("%d records of rollout %s, want %d", len(records), id, len(tasks)*group)
	}
}

// TestAGroupNoWorkerCanHoldPinsNoSlots: a prefix group larger than every
// live worker's --slots (though not than their sum) is never taken by a
// worker; the coordinator must then keep it queued rather than count its
// episodes running. Before, it started the group (the sum held it) and its
// episodes held the slots for ever: one API caller's group_size starved
// every other rollout of the cluster. Once a worker that holds the group
// joins, it runs.
func TestAGroupNoWorkerCanHoldPinsNoSlots(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	pre := prefixScript(0, nil)
	defer pre.Close()
	pol := scripted(0)
	defer pol.Close()

	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	startWorker(t, ns.url, "a", "wasm", 2)
	startWorker(t, ns.url, "b", "wasm", 2)
	coord.waitWorkers(2)
	big := coord.submit(rolloutRequest(pre.URL(), prefixTasks(1), 4, nil))
	// The group of 4 fits the sum of the slots (2+2), no one worker.
	time.Sleep(time.Second)
	other := coord.submit(rolloutRequest(pol.URL(), exactTasks(2), 1, nil))
	if got := coord.episodes(other, time.Minute); len(got) != 2 {
		t.Fatalf("the other rollout ended %d episodes, want 2", len(got))
	}
	var st struct {
		State           string `json:"state"`
		EpisodesDone    int    `json:"episodes_done"`
		EpisodesRunning int    `json:"episodes_running"`
	}
	coord.do("GET", "/v1/rollouts/"+big, nil, &st)
	if st.EpisodesDone != 0 || st.EpisodesRunning != 0 {
		t.Errorf("the group no worker holds: %+v, want none done nor running", st)
	}
	startWorker(t, ns.url, "c", "wasm", 4)
	if got := coord.episodes(big, time.Minute); len(got) != 4 {
		t.Fatalf("the group ended %d episodes once a worker of 4 slots joined, want 4", len(got))
	}
}

// TestAGroupItemGoesToTheWaitingWorkerWithRoom: a group item that workers
// too small for it keep naking (with the worker's 2 s delay) goes to the
// waiting worker with room at its next redelivery, whatever the phases of
// the workers' fetch loops (each re-pulls every second, as a worker does).
// Before, JetStream gave the redelivery to the oldest waiting pull
// request: with the worker with room started (and so pulling) 0.9 s after
// the small ones, that was a small one's every time, for ever
// (TestAGroupNoWorkerCanHoldPinsNoSlots flaked so under load). The
// workers here are pullers of the backend's real consumer with the
// worker's fetch options, on a real NATS server.
func TestAGroupItemGoesToTheWaitingWorkerWithRoom(t *testing.T) {
	t.Parallel() // its own NATS server; it mostly waits on it
	ns := startNATS(t, "", 0)
	nc, js, err := cluster.Connect(ns.url, "test-pullers")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cluster.EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cluster.WorkStream, cluster.WorkConsumerConfig("wasm", 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var naked atomic.Int32
	got := make(chan struct{})
	var once atomic.Bool
	var pullers sync.WaitGroup
	defer func() {
		cancel()
		pullers.Wait() // each ends within its fetch's second
	}()
	pull := func(free int, room bool) {
		defer pullers.Done()
		for ctx.Err() == nil {
			batch, err := cons.Fetch(free, append(cluster.WorkFetchOpts(free), jetstream.FetchMaxWait(time.Second))...)
			if err != nil {
				t.Errorf("fetch: %v", err)
				return
			}
			for m := range batch.Messages() {
				if room {
					m.Ack()
					if once.CompareAndSwap(false, true) {
						close(got)
					}
					continue
				}
				naked.Add(1)
				m.NakWithDelay(2 * time.Second)
			}
		}
	}
	pullers.Add(2)
	go pull(2, false)
	go pull(2, false)
	time.Sleep(1200 * time.Millisecond)
	if _, err := js.Publish(ctx, cluster.GroupWorkSubject("wasm", "g"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(900 * time.Millisecond)
	pullers.Add(1)
	go pull(4, true)
	select {
	case <-got:
	case <-time.After(15 * time.Second):
		t.Fatalf("the worker with room did not get the group item in 15 s; the small ones got it %d times", naked.Load())
	}
}

// TestAnAttemptSendsOnlyItsOwnSubagents: a sub-agent record a dead
// predecessor in the worker's --data left of the episode (its earlier
// attempt, killed after that sub-agent ended and before its records were
// sent) is not this attempt's: it must not be sent and kept beside the
// episode's record, where it would stand for a sub-agent this attempt
// never ran.
func TestAnAttemptSendsOnlyItsOwnSubagents(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	orch := mustPolicy(fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "spawn_subagents", Arguments: `{"tasks": [{"prompt": "look at a"}]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}})})
	defer orch.Close()
	sub := mustPolicy(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	defer sub.Close()
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	id := coord.submit(rolloutRequest(orch.URL(), parlTasks(1, sub), 1, nil))
	ep := id + ".t0.0"
	data := t.TempDir()
	stale := ep + ".s7-0"
	if err := os.MkdirAll(filepath.Join(data, agent.SubagentsDir), 0o755); err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf(`{"episode_id":%q,"rollout_id":%q,"termination":{"reason":"finished"}}`, stale, id)
	if err := os.WriteFile(filepath.Join(data, agent.SubagentsDir, stale+".json"), []byte(doc+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	startWorker(t, ns.url, "w", "wasm", 2, "--data", data)
	tr := one(t, coord.episodes(id, time.Minute))
	if tr.Termination == nil || tr.Termination.Reason != trajectory.EndFinished || len(tr.Subagents) != 1 {
		t.Fatalf("episode %s: %+v with %d sub-agents, want finished with 1", tr.EpisodeID, tr.Termination, len(tr.Subagents))
	}
	kept, _ := filepath.Glob(filepath.Join(coord.data, "episodes", agent.SubagentsDir, ep+".s*"))
	for _, k := range kept {
		if filepath.Base(k) != filepath.Base(tr.Subagents[0].File) {
			t.Errorf("kept beside the episode: %s, which its record does not name (it names %s)", k, tr.Subagents[0].File)
		}
	}
	if len(kept) != 1 {
		t.Errorf("%d sub-agent records kept, want 1: %v", len(kept), kept)
	}
}

// TestAGroupNoWorkerCanHoldWaitsWithoutHoldingSlots: a prefix group runs
// whole on one worker, so while no live worker has a slot for each of its
// episodes it waits queued, and the slots it cannot use run the other
// episodes; a worker with room that joins then runs it. Before, the
// coordinator dispatched it whenever the workers' slots added up, counted
// it running, and the workers handed it back and forth for ever.
func TestAGroupNoWorkerCanHoldWaitsWithoutHoldingSlots(t *testing.T) {
	t.Parallel() // its own NATS server, data directory and worker processes: it mostly waits on them
	pol := prefixScript(0, nil)
	defer pol.Close()
	tasks, group := prefixTasks(2), 3 // t0's group of 3 forks from its prefix; t1's 3 episodes run alone

	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	startWorker(t, ns.url, "a", "wasm", 2)
	startWorker(t, ns.url, "b", "wasm", 2)
	coord.waitWorkers(2)
	id := coord.submit(rolloutRequest(pol.URL(), tasks, group, nil))
	coord.waitDoneWithin(id, group, 2*time.Minute, " (t1's episodes)")
	var st runtime.RolloutStatus
	time.Sleep(time.Second) // five heartbeats: nothing changes while no worker can hold the group
	coord.do("GET", "/v1/rollouts/"+id, nil, &st)
	if st.EpisodesDone != group || st.EpisodesRunning != 0 || st.EpisodesQueued != group {
		t.Fatalf("while no worker has %d slots: done %d running %d queued %d, want %d done, none running, the group's %d queued",
			group, st.EpisodesDone, st.EpisodesRunning, st.EpisodesQueued, group, group)
	}
	startWorker(t, ns.url, "big", "wasm", group)
	allFinishedForked(t, coord.episodes(id, 2*time.Minute), 2*group, "t0", ".prefix")
}

// TestAGroupWhoseOnlyBigWorkerLeftHoldsNoSlots: the only worker with a
// slot for each of a group's episodes takes the group item and is
// SIGKILLed before any member asked the policy (the prefix's open is held
// on a FIFO workspace); the one worker left has fewer slots than the group
// has episodes. The group goes back to the queue holding no slot, so its
// rollout's other episodes run on the small worker meanwhile, and it runs
// (again, from a new prefix) once a worker with slots enough joins.
func TestAGroupWhoseOnlyBigWorkerLeftHoldsNoSlots(t *testing.T) {
	t.Parallel() // its own NATS server, data directory and worker processes: it mostly waits on them
	gate, ws, tarball := fifoGateTask(t, `"prefix": {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo prefix >> /work/n"}}]}]}`)
	pol := prefixScript(0, nil)
	defer pol.Close()
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url, func(o *runtime.Options) { o.Catalog = []*agent.Task{gate} })
	const group = 3
	big := startWorker(t, ns.url, "big", "wasm", group)
	coord.waitWorkers(1)
	plain := exactTasks(2)[1] // t1: 3 episodes that run alone, after the group in the queue
	id := coord.submit(map[string]any{"tasks": []any{map[string]any{"id": "gate"}, plain}, "group_size": group,
		"policy": map[string]any{"base_url": pol.URL(), "model": "fake-model"}})
	coord.waitRunning("big", group) // the group's members, held on the workspace; t1's wait for slots
	big.kill()
	startWorker(t, ns.url, "small", "wasm", group-1)

	coord.waitDoneWithin(id, group, time.Minute, " (t1's episodes, on the small worker: the group holds the slots)")
	var st runtime.RolloutStatus
	coord.do("GET", "/v1/rollouts/"+id, nil, &st)
	if st.EpisodesDone != group || st.EpisodesRunning != 0 || st.EpisodesQueued != group {
		t.Fatalf("while no worker has %d slots: done %d running %d queued %d, want t1's %d done, none running, the group's %d queued",
			group, st.EpisodesDone, st.EpisodesRunning, st.EpisodesQueued, group, group)
	}
	os.Remove(ws) // the workspace opens at once from now on
	if err := os.WriteFile(ws, tarball, 0o644); err != nil {
		t.Fatal(err)
	}
	startWorker(t, ns.url, "big2", "wasm", group)
	allFinishedForked(t, coord.episodes(id, time.Minute), 2*group, "gate", ".prefix.2") // the prefix's second run
}

// allFinishedForked: got is n episodes, every one finished, and each of
// task's forked from its group's prefix episode (its id the group's and
// prefix: ".prefix", or ".prefix.2" for the prefix's second run).
func allFinishedForked(t *testing.T, got []*trajectory.Trajectory, n int, task, prefix string) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%d episodes, want %d", len(got), n)
	}
	for _, tr := range got {
		if tr.Termination == nil || tr.Termination.Reason != trajectory.EndFinished {
			t.Errorf("episode %s ended %+v, want finished", tr.EpisodeID, tr.Termination)
		}
		if tr.TaskID == task && (tr.ForkedFrom == nil || tr.ForkedFrom.EpisodeID != tr.GroupID+prefix) {
			t.Errorf("episode %s: forked_from %+v, want its group's prefix %s", tr.EpisodeID, tr.ForkedFrom, tr.GroupID+prefix)
		}
	}
}

// TestAGroupWhoseOnlyBigWorkerWasStoppedHoldsNoSlots is the SIGTERM variant
// of TestAGroupWhoseOnlyBigWorkerLeftHoldsNoSlots: a group item is
// published while the only worker with a slot for each of its episodes is
// full (another rollout's episodes, held at their second policy call), and
// that worker is stopped (SIGTERM: it takes no more work, finishes those and
// leaves) while two smaller workers stay, which leave the item. Once the
// big worker has left, the group holds no slot (running 0, its episodes
// queued) and it runs when a worker with slots enough joins.
func TestAGroupWhoseOnlyBigWorkerWasStoppedHoldsNoSlots(t *testing.T) {
	t.Parallel() // its own NATS server, data directory and worker processes: it mostly waits on them
	const group = 3
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	big := startWorker(t, ns.url, "big", "wasm", group)
	coord.waitWorkers(1)
	polA, blocked, release := gatePolicy()
	defer polA.Close()
	defer release()
	a := coord.submit(rolloutRequest(polA.URL(), exactTasks(1), group, nil))
	for range group {
		select {
		case <-blocked: // big is full
		case <-time.After(time.Minute):
			t.Fatal("rollout A's episodes did not all reach their second policy call on the big worker in a minute")
		}
	}
	startWorker(t, ns.url, "small1", "wasm", group-1)
	startWorker(t, ns.url, "small2", "wasm", group-1)
	coord.waitWorkers(3)
	polB := prefixScript(0, nil)
	defer polB.Close()
	b := coord.submit(rolloutRequest(polB.URL(), prefixTasks(2), group, nil)) // t0: a group item; t1: 3 single episodes
	coord.waitDoneWithin(b, group, time.Minute, " (rollout B's t1, on the small workers)")

	big.term()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(big.logText(), "SIGTERM: stopping"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the big worker did not say it stops in 30 s:\n%s", big.logText())
		}
	}
	release() // A's episodes finish on the big worker, which then leaves
	coord.waitDoneWithin(a, group, time.Minute, " (rollout A's, on the stopped worker)")
	var st runtime.RolloutStatus
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		coord.do("GET", "/v1/rollouts/"+b, nil, &st)
		if st.EpisodesDone == group && st.EpisodesRunning == 0 && st.EpisodesQueued == group {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the big worker was stopped: rollout B done %d running %d queued %d, want t1's %d done, none running, the group's %d queued (holding no slot); workers %+v",
				st.EpisodesDone, st.EpisodesRunning, st.EpisodesQueued, group, group, coord.workers())
		}
	}
	startWorker(t, ns.url, "big2", "wasm", group)
	allFinishedForked(t, coord.episodes(b, time.Minute), 2*group, "t0", ".prefix")
}
