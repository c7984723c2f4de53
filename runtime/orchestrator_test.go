package runtime_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// orchestratorTask is an inline orchestrator task whose frozen sub-agents
// are served by sub.
func orchestratorTask(id string, sub *fakepolicy.Server) map[string]any {
	t := task(id)
	t["orchestrator"] = map[string]any{"subagent_policy": map[string]any{"base_url": sub.URL(), "model": "frozen"}, "max_parallel": 3}
	t["reward"] = map[string]any{"type": "parl", "perf": map[string]any{"type": "exact", "answer": "done"},
		"lambda_parallel": 0.5, "lambda_finish": 0.5, "parallel_cap": 3, "anneal": map[string]any{"schedule": "cosine", "steps": 100}}
	return t
}

// A service that runs one episode at a time still runs orchestrators with
// three sub-agents each (a waiting orchestrator hands its slot to a sub-agent), two of
// them in one group: the records hold the tree, the reward is annealed at
// the request's train_step, and the sub-agent policy is the frozen one.
func TestTheServiceRunsOrchestratorsWithinOneSlotWithoutDeadlock(t *testing.T) {
	orch := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "spawn_subagents", Arguments: `{"tasks": [{"prompt": "look at a"}, {"prompt": "look at b"}, {"prompt": "look at c"}]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}})})
	sub := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1), Record: true})
	data := t.TempDir()
	s := startService(t, data, func(o *runtime.Options) { o.Limits.MaxRunning = 1 })
	body := rolloutBody(orch, 2, orchestratorTask("o", sub))
	body["train_step"] = 50
	id := s.submit(body)
	st := s.waitState(id, time.Minute, func(st status) bool { return st.State == "done" })
	if st.EpisodesDone != 2 || st.Ends["finished"] != 2 {
		t.Fatalf("status %+v", st)
	}
	eps := s.episodes(id, "")
	if len(eps) != 2 {
		t.Fatalf("%d episodes: sub-episodes are not the rollout's episodes", len(eps))
	}
	for _, e := range eps {
		c := e.Reward.Components
		// cosine at 50 of 100 steps: λ0/2.
		if *e.Reward.Total != 1+0.25+0.25 || c["lambda_parallel"] != 0.25 || c["train_step"] != 50 || c["r_parallel"] != 1 {
			t.Errorf("%s: reward %v %v", e.EpisodeID, *e.Reward.Total, c)
		}
		if len(e.Subagents) != 3 || *e.Stats.CriticalSteps != 2+2 || *e.Stats.TotalSteps != 2+3*2 {
			t.Fatalf("%s: sub-agents %+v stats %+v", e.EpisodeID, e.Subagents, e.Stats)
		}
		for _, sa := range e.Subagents {
			b, err := os.ReadFile(filepath.Join(data, "episodes", sa.File))
			if err != nil {
				t.Fatal(err)
			}
			var tr trajectory.Trajectory
			json.Unmarshal(b, &tr)
			if tr.Parent == nil || tr.Parent.EpisodeID != e.EpisodeID || tr.Policy.Endpoint != sub.URL() || tr.Policy.Model != "frozen" || !sa.Useful {
				t.Errorf("sub-episode %s: parent %+v policy %+v useful %v", sa.EpisodeID, tr.Parent, tr.Policy, sa.Useful)
			}
		}
	}
	if n := len(sub.Requests()); n != 2*3*2 {
		t.Errorf("the sub-agent policy answered %d calls, want 12", n)
	}
}

func TestTheServiceRefusesASubagentPolicyItCannotRun(t *testing.T) {
	orch := startPolicy(t, fakepolicy.Config{})
	notok := startPolicy(t, fakepolicy.Config{NoTokenizer: true})
	s := startService(t, "")
	for _, tt := range []struct {
		policy any
		field  string
	}{
		{"scripted:/etc/passwd", "tasks[0].orchestrator.subagent_policy"},
		{map[string]any{"base_url": "file:///x", "model": "m"}, "tasks[0].orchestrator.subagent_policy.base_url"},
		{map[string]any{"base_url": "http://127.0.0.1:1/v1"}, "tasks[0].orchestrator.subagent_policy.model"},
		{map[string]any{"base_url": "http://127.0.0.1:1/v1", "model": "m", "mode": "binary"}, "tasks[0].orchestrator.subagent_policy.mode"},
		{map[string]any{"base_url": "http://127.0.0.1:1/v1", "model": "m", "tokenize_url": "http://127.0.0.1:1/tokenize"}, "tasks[0].orchestrator.subagent_policy.tokenize_url"},
		{map[string]any{"base_url": notok.URL(), "model": "m", "mode": "tokens"}, "tasks[0].orchestrator.subagent_policy.mode"},
	} {
		tk := task("o")
		tk["orchestrator"] = map[string]any{"subagent_policy": tt.policy}
		var e apiErr
		code, _ := s.do("POST", "/v1/rollouts", rolloutBody(orch, 1, tk), &e)
		if code != http.StatusBadRequest || e.Error.Field != tt.field {
			t.Errorf("%v: %d %+v, want 400 naming %s", tt.policy, code, e, tt.field)
		}
	}
	body := rolloutBody(orch, 1, task("a"))
	body["train_step"] = -1
	var e apiErr
	if code, _ := s.do("POST", "/v1/rollouts", body, &e); code != 400 || e.Error.Field != "train_step" {
		t.Errorf("train_step -1: %d %+v", code, e)
	}
}

// An asynchronous orchestrator keeps its slot while it goes on and gives
// it back while it waits: a service running one episode at a time runs
// it and its three sub-agents without deadlock, and the wait answers all
// three results.
func TestTheServiceRunsAsynchronousOrchestratorsWithinOneSlot(t *testing.T) {
	orch := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "spawn_subagents", Arguments: `{"tasks": [{"prompt": "look at a"}, {"prompt": "look at b"}, {"prompt": "look at c"}]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "wait", Arguments: `{}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}})})
	sub := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	s := startService(t, "", func(o *runtime.Options) { o.Limits.MaxRunning = 1 })
	tk := orchestratorTask("o", sub)
	tk["orchestrator"].(map[string]any)["async"] = true
	id := s.submit(rolloutBody(orch, 1, tk))
	st := s.waitState(id, time.Minute, func(st status) bool { return st.State == "done" })
	if st.Ends["finished"] != 1 {
		t.Fatalf("status %+v", st)
	}
	e := s.episodes(id, "")[0]
	if len(e.Subagents) != 3 || *e.Stats.CriticalSteps != 3+2 || *e.Stats.TotalSteps != 3+3*2 || *e.Reward.Total != 2 {
		t.Fatalf("sub-agents %+v stats %+v reward %v", e.Subagents, e.Stats, *e.Reward.Total)
	}
	for _, sa := range e.Subagents {
		if sa.Handle == "" || sa.CollectedStep == nil || *sa.CollectedStep != 3 || sa.Stage != 0 || !sa.Useful {
			t.Errorf("sub-agent %+v", sa)
		}
	}
}

// A service killed (SIGKILL) while an orchestrator's sub-agents run: on
// restart every sub-episode is accounted for. The one that had finished
// keeps its record, the one in flight is recorded interrupted with the
// steps it had taken, and the orchestrator's record, interrupted, names
// both (its journal named neither: a synchronous call's sub-agents are
// journaled when it returns, an asynchronous one's when collected), with
// its critical steps; no journal is left.
func TestAServiceKilledWhileSubagentsRunAccountsForEverySubEpisode(t *testing.T) {
	release := make(chan struct{})
	sub := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1),
		Fault: func(_ int64, req *fakepolicy.Request) fakepolicy.Fault {
			if strings.Contains(req.Messages[1].Content, "slow") && req.AssistantTurns() > 0 {
				<-release // the slow sub-agent's second turn never comes
			}
			return fakepolicy.Fault{}
		}})
	t.Cleanup(func() { close(release) }) // before the policy server closes
	spawn := fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "spawn_subagents", Arguments: `{"tasks": [{"prompt": "quick"}, {"prompt": "slow"}]}`}}}
	wait := fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "wait", Arguments: `{}`}}}
	for _, tt := range []struct {
		name    string
		async   bool
		replies []fakepolicy.Reply
		// critical: the orchestrator's turns plus its stage's longest
		// sub-agent (2 turns), or none of them when never collected.
		critical int
	}{
		{"synchronous", false, []fakepolicy.Reply{spawn}, 1 + 2},
		{"asynchronous", true, []fakepolicy.Reply{spawn, wait}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			orch := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.Script(tt.replies...)})
			data := t.TempDir()
			child, cmd := startChild(t, data, 4)
			tk := orchestratorTask("o", sub)
			tk["orchestrator"].(map[string]any)["async"] = tt.async
			id := child.submit(rolloutBody(orch, 1, tk))
			subs := filepath.Join(data, "episodes", agent.SubagentsDir)
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				done, _ := filepath.Glob(filepath.Join(subs, "*.s0-0.json"))
				j, _ := filepath.Glob(filepath.Join(subs, "*.s0-1"+trajectory.PartialSuffix))
				if len(done) == 1 && len(j) == 1 {
					if b, _ := os.ReadFile(j[0]); strings.Count(string(b), `"k":"step"`) == 2 {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatal("the sub-agents did not get going")
				}
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()

			s := startService(t, data)
			if len(s.rec.Interrupted) != 1 || len(s.rec.Subagents) != 2 {
				t.Errorf("recovered %+v", s.rec)
			}
			e := s.episodes(id, "")[0]
			if e.Termination.Reason != trajectory.EndInterrupted || len(e.Subagents) != 2 {
				t.Fatalf("the orchestrator: %s, sub-agents %+v", e.Termination.Reason, e.Subagents)
			}
			if *e.Stats.Subagents != 2 || *e.Stats.CriticalSteps != tt.critical || *e.Stats.TotalSteps != len(tt.replies)+2+1 {
				t.Errorf("stats %+v: subagents %d critical %d total %d", e.Stats, *e.Stats.Subagents, *e.Stats.CriticalSteps, *e.Stats.TotalSteps)
			}
			for i, want := range []struct {
				end   string
				steps int
			}{{trajectory.EndFinished, 2}, {trajectory.EndInterrupted, 1}} {
				sa := e.Subagents[i]
				tr, err := trajectory.Read(filepath.Join(data, "episodes", sa.File))
				if err != nil {
					t.Fatalf("sub-agent %d: %v", i, err)
				}
				if sa.End != want.end || sa.Steps != want.steps || sa.Index != i || tr.Termination.Reason != want.end ||
					len(tr.Steps) != 2*want.steps || tr.Parent == nil || tr.Parent.EpisodeID != e.EpisodeID || tr.Parent.Step != sa.Step {
					t.Errorf("sub-agent %d: %+v; its record ended %s with %d steps, parent %+v", i, sa, tr.Termination.Reason, len(tr.Steps), tr.Parent)
				}
				if tt.async && (sa.Handle != fmt.Sprintf("s0-%d", i) || sa.CollectedStep != nil || sa.Critical || e.Steps[sa.Step].Name != "spawn_subagents") {
					t.Errorf("asynchronous sub-agent %d: %+v", i, sa)
				}
				if !tt.async && sa.Critical != (i == 0) {
					t.Errorf("sub-agent %d critical %v", i, sa.Critical)
				}
			}
			for _, dir := range []string{filepath.Join(data, "episodes"), subs} {
				if j, _ := filepath.Glob(filepath.Join(dir, "*"+trajectory.PartialSuffix)); len(j) > 0 {
					t.Errorf("journals left: %v", j)
				}
			}
		})
	}
}

// Sub-agents whose policy is in token mode, as the orchestrator's: their
// records hold the ids sampled, every one with loss mask 0 (a sub-agent's
// turns are the frozen policy's), while the orchestrator's sampled ids are
// trained on.
func TestTokenModeSubagentsRecordTheirIdsWithLossMaskZero(t *testing.T) {
	orch := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "spawn_subagents", Arguments: `{"tasks": [{"prompt": "look at a"}, {"prompt": "look at b"}]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}})})
	sub := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1), Record: true})
	data := t.TempDir()
	s := startService(t, data)
	tk := orchestratorTask("o", sub)
	tk["orchestrator"].(map[string]any)["subagent_policy"].(map[string]any)["mode"] = "tokens"
	id := s.submit(tokenRolloutBody(orch, 1, nil, tk))
	s.waitState(id, time.Minute, func(st status) bool { return st.State == "done" })
	e := s.episodes(id, "")[0]
	if e.Termination.Reason != trajectory.EndFinished || len(e.Subagents) != 2 {
		t.Fatalf("the orchestrator ended %s with sub-agents %+v", e.Termination.Reason, e.Subagents)
	}
	if trained := lossMaskSum(e.Segments); trained == 0 {
		t.Errorf("the orchestrator's segments %+v train on nothing", e.Segments)
	}
	for _, sa := range e.Subagents {
		tr, err := trajectory.Read(filepath.Join(data, "episodes", sa.File))
		if err != nil {
			t.Fatal(err)
		}
		completions := 0
		for _, st := range tr.Steps {
			completions += len(st.CompletionIDs)
		}
		ids := 0
		for _, seg := range tr.Segments {
			ids += len(seg.Ids)
		}
		if tr.Policy.Mode != trajectory.ModeTokens || tr.Policy.Tokenizer == nil || completions == 0 || ids < completions || lossMaskSum(tr.Segments) != 0 || !sa.Useful {
			t.Errorf("sub-episode %s: policy %+v, %d completion ids, segments %+v", sa.EpisodeID, tr.Policy, completions, tr.Segments)
		}
	}
	for _, r := range sub.Requests() {
		if r.Endpoint != "completions" {
			t.Fatalf("the sub-agent policy was called at %s", r.Endpoint)
		}
	}
}

func lossMaskSum(segs []trajectory.Segment) int {
	n := 0
	for _, seg := range segs {
		for _, m := range seg.LossMask {
			n += int(m)
		}
	}
	return n
}

// An environment-mode orchestrator holds no slot of the scheduler, so its
// sub-agents each take one like a rollout's episodes do: with the one slot
// of the service held by a rollout's episode, they wait (nothing of them
// runs), and they run, and the step answers, once it ends.
func TestEnvironmentModeSubagentsCountAgainstTheSchedulersLimits(t *testing.T) {
	p, free := blockingPolicy(t)
	sub := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	s := startService(t, "", func(o *runtime.Options) { o.Limits.MaxRunning = 1 })
	rid := s.submit(rolloutBody(p, 1, task("a")))
	s.waitRunning(1, 20*time.Second)

	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": orchestratorTask("o", sub)}, &opened); code != http.StatusCreated {
		t.Fatalf("open: %d", code)
	}
	type answer struct {
		code int
		res  runtime.StepResult
	}
	stepped := make(chan answer, 1)
	go func() {
		var a answer
		a.code, _ = s.do("POST", "/v1/episodes/"+opened.ID+"/step", map[string]any{"tool_calls": []any{map[string]any{"id": "c1", "name": "spawn_subagents",
			"arguments": map[string]any{"tasks": []any{map[string]any{"prompt": "look at a"}, map[string]any{"prompt": "look at b"}}}}}}, &a.res)
		stepped <- a
	}()
	select {
	case a := <-stepped:
		t.Fatalf("the step answered %d while the only slot was held: %+v", a.code, a.res)
	case <-time.After(500 * time.Millisecond):
	}
	if n := sub.Calls(); n != 0 {
		t.Fatalf("the sub-agents called their policy %d times while the only slot was held", n)
	}
	free()
	s.waitState(rid, 20*time.Second, func(st status) bool { return st.State == "done" })
	var a answer
	select {
	case a = <-stepped:
	case <-time.After(30 * time.Second):
		t.Fatal("the step never answered: its sub-agents never ran")
	}
	if a.code != 200 || len(a.res.Results) != 1 || strings.Count(a.res.Results[0].Output, `"end":"finished"`) != 2 {
		t.Fatalf("step: %d %+v", a.code, a.res)
	}
	var h health
	s.do("GET", "/healthz", nil, &h)
	if h.EpisodesRunning != 0 {
		t.Errorf("%d episodes counted running after the sub-agents ended", h.EpisodesRunning)
	}
}

// Rescoring parl episodes recomputes r_perf, r_parallel and r_finish from
// the record, with the λ annealed at the train step each episode ran at:
// an orchestrator whose reward was parl (its perf a composite with a tests
// part, whose recorded score is taken), and one whose reward was not parl
// at all (its train step read from the record's train_step).
func TestRescoringParlEpisodesAnnealsAtTheirRecordedTrainStep(t *testing.T) {
	orch := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "spawn_subagents", Arguments: `{"tasks": [{"prompt": "look at a"}, {"prompt": "look at b"}, {"prompt": "look at c"}]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}})})
	sub := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	data := t.TempDir()
	s := startService(t, data)
	perf := map[string]any{"type": "composite", "parts": []any{
		map[string]any{"name": "answer", "weight": 1, "reward": map[string]any{"type": "exact", "answer": "done"}},
		map[string]any{"name": "check", "weight": 1, "reward": map[string]any{"type": "tests", "command": "cat /work/hello.txt"}}}}
	parl := orchestratorTask("parl", sub)
	parl["reward"] = map[string]any{"type": "parl", "perf": perf, "lambda_parallel": 0.5, "lambda_finish": 0.5, "parallel_cap": 3,
		"anneal": map[string]any{"schedule": "cosine", "steps": 100}}
	plain := orchestratorTask("plain", sub)
	plain["reward"] = perf
	body := rolloutBody(orch, 1, parl, plain)
	body["train_step"] = 50
	id := s.submit(body)
	s.waitState(id, time.Minute, func(st status) bool { return st.State == "done" })
	before := map[string]*trajectory.Trajectory{}
	for _, e := range s.episodes(id, "") {
		before[e.TaskID] = e
		if e.TrainStep != 50 || e.Reward.Total == nil {
			t.Fatalf("%s: train_step %d reward %+v", e.TaskID, e.TrainStep, e.Reward)
		}
	}
	if v := *before["parl"].Reward.Total; v != 1+0.25+0.25 {
		t.Fatalf("parl recorded %v", v)
	}

	spec, err := runtime.ParseRescoreSpec([]byte(`{"type": "parl", "lambda_parallel": 1, "lambda_finish": 0.4, "parallel_cap": 6,
		"anneal": {"schedule": "linear", "steps": 200}, "perf": {"type": "composite", "parts": [
		{"name": "answer", "weight": 1, "reward": {"type": "exact", "answer": "done"}},
		{"name": "check", "weight": 3, "reward": {"type": "tests", "command": "cat /work/hello.txt"}}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := runtime.Rescore(t.Context(), runtime.RescoreConfig{RunDir: data, Spec: spec})
	if err != nil || res.Episodes != 2 {
		t.Fatalf("rescore: %d episodes, %v", res.Episodes, err)
	}
	// linear at 50 of 200 steps: λ0·3/4; r_parallel 3 of cap 6.
	want := map[string]float64{"r_perf": 1, "r_parallel": 0.5, "r_finish": 1, "lambda_parallel": 0.75, "lambda_finish": 0.3,
		"train_step": 50, "subagents": 3, "useful_subagents": 3, "critical_steps": 2 + 2, "perf.answer": 1, "perf.check": 1}
	for task, e := range before {
		tr, err := trajectory.Read(filepath.Join(res.Dir, "episodes", e.EpisodeID+".json"))
		if err != nil {
			t.Fatal(err)
		}
		r := tr.Reward
		if r.Total == nil || *r.Total != 1+0.75*0.5+0.3*1 {
			t.Errorf("%s: rescored %+v", task, r)
			continue
		}
		for k, v := range want {
			if r.Components[k] != v {
				t.Errorf("%s: %s = %v, want %v", task, k, r.Components[k], v)
			}
		}
	}
}

// An environment-mode episode anneals its parl reward at the train_step
// its reset was given (and its forks at the same), and at 0 without one; a
// negative train_step is refused naming the field.
func TestEnvironmentModeParlRewardsAnnealAtTheResetsTrainStep(t *testing.T) {
	sub := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	s := startService(t, "")
	var e apiErr
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": orchestratorTask("o", sub), "train_step": -1}, &e); code != http.StatusBadRequest || e.Error.Field != "train_step" {
		t.Fatalf("train_step -1: %d %+v", code, e)
	}
	spawn := map[string]any{"tool_calls": []any{map[string]any{"id": "c1", "name": "spawn_subagents", "arguments": map[string]any{"tasks": []any{
		map[string]any{"prompt": "look at a"}, map[string]any{"prompt": "look at b"}, map[string]any{"prompt": "look at c"}}}}}}
	open := func(body map[string]any) string {
		t.Helper()
		var opened struct{ ID string }
		if code, _ := s.do("POST", "/v1/episodes", body, &opened); code != http.StatusCreated {
			t.Fatalf("open %v: %d", body["train_step"], code)
		}
		if code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/step", spawn, nil); code != 200 {
			t.Fatalf("spawn: %d", code)
		}
		return opened.ID
	}
	finish := func(id string) *trajectory.Trajectory {
		t.Helper()
		if code, _ := s.do("POST", "/v1/episodes/"+id+"/finish", map[string]any{"answer": "done"}, nil); code != 200 {
			t.Fatalf("finish %s: %d", id, code)
		}
		var tr trajectory.Trajectory
		if code, _ := s.do("GET", "/v1/episodes/"+id, nil, &tr); code != 200 {
			t.Fatalf("GET %s: %d", id, code)
		}
		return &tr
	}
	at50 := open(map[string]any{"task": orchestratorTask("o", sub), "train_step": 50})
	at0 := open(map[string]any{"task": orchestratorTask("o", sub)})
	// An orchestrator cannot be forked (its sub-agents' state is outside
	// the sandbox): a plain episode's forks keep its train_step.
	var plain struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": task("a"), "train_step": 7}, &plain); code != http.StatusCreated {
		t.Fatalf("open plain: %d", code)
	}
	var forked runtime.ForkResult
	if code, _ := s.do("POST", "/v1/episodes/"+plain.ID+"/fork", map[string]any{"n": 1}, &forked); code != http.StatusCreated || len(forked.IDs) != 1 {
		t.Fatalf("fork: %d %+v", code, forked)
	}
	if tr := finish(forked.IDs[0]); tr.TrainStep != 7 {
		t.Errorf("the fork of an episode at train_step 7 recorded %d", tr.TrainStep)
	}
	// cosine over 100 steps from λ0 = 0.5: 0.25 at step 50, 0.5 at 0;
	// three useful sub-agents of a cap of 3: r_parallel = r_finish = 1.
	for _, c := range []struct {
		id    string
		step  int64
		total float64
	}{{at50, 50, 1.5}, {at0, 0, 2}} {
		tr := finish(c.id)
		if tr.TrainStep != c.step || tr.Reward == nil || tr.Reward.Total == nil || *tr.Reward.Total != c.total ||
			tr.Reward.Components["train_step"] != float64(c.step) {
			t.Errorf("%s: train_step %d reward %+v, want step %d total %v", c.id, tr.TrainStep, tr.Reward, c.step, c.total)
		}
	}
}
