package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// promptPolicy is a frozen sub-agent policy scripted by sub-task prompt.
type promptPolicy struct {
	mu    sync.Mutex
	turns map[string][]agent.Turn
}

func (p *promptPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	turns := p.turns[req.Messages[1].Content]
	if req.Turn >= len(turns) {
		return agent.Turn{}, fmt.Errorf("%w: no turn %d for %q", agent.ErrPolicy, req.Turn, req.Messages[1].Content)
	}
	return turns[req.Turn], nil
}

// withSubagents gives an episode the sub-agent policy p.
func withSubagents(p agent.Policy) func(*agent.Config) {
	return func(c *agent.Config) {
		c.Subagents = &agent.Subagents{Policy: func(*agent.Task) (agent.Policy, trajectory.Policy, error) {
			return p, trajectory.Policy{Kind: "test-frozen"}, nil
		}}
	}
}

func spawn(prompts ...string) string {
	var ts []string
	for _, p := range prompts {
		ts = append(ts, fmt.Sprintf(`{"prompt": %q}`, p))
	}
	return `{"tasks": [` + strings.Join(ts, ", ") + `]}`
}

func orchestratorTask(orch string) string {
	return `{"id": "orch", "prompt": "Work with sub-agents.", "sandbox": {"backend": "wasm"},
	 "files": {"/work/task.txt": "the task's file\n"},
	 "tools": ["bash", "write_file", "finish"], "orchestrator": ` + orch + `,
	 "reward": {"type": "exact", "answer": "done"}, "limits": {"max_turns": 8}}`
}

func subRecord(t *testing.T, dir string, sa trajectory.Subagent) *trajectory.Trajectory {
	t.Helper()
	tr, err := trajectory.Read(filepath.Join(dir, sa.File))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// With share_workspace a sub-agent starts from a copy of the orchestrator's
// workspace as it is at the spawn, and what it changes never comes back;
// without it, a sub-agent has the task's files only.
func TestSubagentsStartFromACopyOfTheWorkspaceAndTheirChangesStayTheirs(t *testing.T) {
	for _, share := range []bool{true, false} {
		t.Run(fmt.Sprintf("share_workspace %v", share), func(t *testing.T) {
			task := loadTask(t, orchestratorTask(fmt.Sprintf(`{"subagent_policy": "frozen", "share_workspace": %v}`, share)))
			sub := &promptPolicy{turns: map[string][]agent.Turn{"look": {
				calls("bash", `{"command": "cat /work/task.txt /work/note.txt; echo sub > /work/note.txt"}`),
				calls("finish", `{"answer": "looked"}`)}}}
			orch := &turnsPolicy{turns: []agent.Turn{
				calls("write_file", `{"path": "/work/note.txt", "content": "from the orchestrator\n"}`),
				calls("spawn_subagents", spawn("look")),
				calls("bash", `{"command": "cat /work/note.txt"}`),
				calls("finish", `{"answer": "done"}`)}}
			var dir string
			tr := runEpisode(t, task, orch, withSubagents(sub), func(c *agent.Config) { dir = c.Dir })
			if tr.Termination.Reason != trajectory.EndFinished || len(tr.Subagents) != 1 {
				t.Fatalf("end %+v, sub-agents %+v", tr.Termination, tr.Subagents)
			}
			seen := toolSteps(subRecord(t, dir, tr.Subagents[0]))[0].Output
			if !strings.Contains(seen, "the task's file") || strings.Contains(seen, "from the orchestrator") != share {
				t.Errorf("the sub-agent saw %q", seen)
			}
			if after := toolSteps(tr)[2].Output; after != "from the orchestrator\n" {
				t.Errorf("the sub-agent's change came back: %q", after)
			}
		})
	}
}

// A sub-agent whose policy fails, whose sandbox cannot be made or that runs
// out of turns is an observation of the orchestrator, which goes on and is
// scored; the answer it sees is cut to max_answer_bytes, and says so.
func TestSubagentFailuresAreObservationsOfTheOrchestrator(t *testing.T) {
	task := loadTask(t, orchestratorTask(`{"subagent_policy": "frozen", "max_answer_bytes": 100, "subagent_limits": {"max_turns": 1}}`))
	long := strings.Repeat("fact ", 100)
	sub := &promptPolicy{turns: map[string][]agent.Turn{
		"no sandbox":   {calls("finish", `{"answer": "never"}`)},
		"out of turns": {calls("bash", `{"command": "true"}`)},
		"long":         {calls("finish", fmt.Sprintf(`{"answer": %q}`, long))},
	}}
	orch := &turnsPolicy{turns: []agent.Turn{
		calls("spawn_subagents", spawn("no script", "no sandbox", "out of turns", "long")),
		calls("finish", `{"answer": "done"}`)}}
	failing := func(next agent.SandboxFactory) agent.SandboxFactory {
		return func(ctx context.Context, b string, spec sandbox.Spec) (sandbox.Sandbox, error) {
			if strings.HasSuffix(spec.Labels[sandbox.LabelEpisode], ".s0-1") {
				return nil, fmt.Errorf("engine gone: %w", sandbox.ErrSandboxFailed)
			}
			return next(ctx, b, spec)
		}
	}
	tr := runEpisode(t, task, orch, withSubagents(sub), func(c *agent.Config) { c.NewSandbox = failing(c.NewSandbox) })
	if tr.Termination.Reason != trajectory.EndFinished || tr.Reward == nil || *tr.Reward.Total != 1 {
		t.Fatalf("the orchestrator: %+v %+v", tr.Termination, tr.Reward)
	}
	ends := []string{trajectory.EndPolicyError, trajectory.EndSandboxError, trajectory.EndMaxTurns, trajectory.EndFinished}
	for i, sa := range tr.Subagents {
		if sa.End != ends[i] || sa.Finished != (i == 3) {
			t.Errorf("sub-agent %d: %+v, want end %s", i, sa, ends[i])
		}
	}
	l := tr.Subagents[3]
	if !l.Truncated || l.AnswerBytes != len(long) || len(l.Answer) > 100 || !strings.Contains(l.Answer, "truncated") {
		t.Errorf("the long answer: truncated %v, %d bytes, shown %q", l.Truncated, l.AnswerBytes, l.Answer)
	}
	out := toolSteps(tr)[0].Output
	if !strings.Contains(out, `"truncated":true`) || !strings.Contains(out, `"end":"sandbox_error"`) || !strings.Contains(out, `"end":"policy_error"`) {
		t.Errorf("the orchestrator saw %s", out)
	}
	if *tr.Stats.CriticalSteps != 2+1 || *tr.Stats.TotalSteps != 2+0+0+1+1 {
		t.Errorf("critical %d total %d", *tr.Stats.CriticalSteps, *tr.Stats.TotalSteps)
	}
}

// A call that asks for more sub-agents than the task allows, or for a tool
// a sub-agent may not have, is refused whole: nothing is spawned.
func TestSpawnRefusesWhatTheOrchestratorDoesNotAllow(t *testing.T) {
	task := loadTask(t, orchestratorTask(`{"subagent_policy": "frozen", "max_subagents": 2, "subagent_tools": ["bash", "finish"]}`))
	sub := &promptPolicy{turns: map[string][]agent.Turn{"a": {calls("finish", `{"answer": "A"}`)}, "b": {calls("finish", `{"answer": "B"}`)}}}
	orch := &turnsPolicy{turns: []agent.Turn{
		calls("spawn_subagents", spawn("a", "b", "c")),
		calls("spawn_subagents", `{"tasks": [{"prompt": "a", "tools": ["write_file"]}]}`),
		calls("spawn_subagents", spawn("a", "b")),
		calls("spawn_subagents", spawn("a")),
		calls("finish", `{"answer": "done"}`)}}
	var dir string
	tr := runEpisode(t, task, orch, withSubagents(sub), func(c *agent.Config) { dir = c.Dir })
	steps := toolSteps(tr)
	for i, want := range []string{"3 sub-tasks asked for, but only 2 more", `"write_file" is not a tool a sub-agent may have`, "", "only 0 more"} {
		if got := kindOf(steps[i]); (got == "bad_arguments") != (want != "") || !strings.Contains(steps[i].Output, want) {
			t.Errorf("call %d: %s %q", i, got, steps[i].Output)
		}
	}
	if len(tr.Subagents) != 2 || tr.Subagents[0].Stage != 0 || tr.Subagents[0].Answer != "A" || tr.Subagents[1].Answer != "B" {
		t.Errorf("sub-agents %+v", tr.Subagents)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, agent.SubagentsDir, "*.json")); len(files) != 2 {
		t.Errorf("sub-episode records %v", files)
	}
}

func TestOrchestratorTasksAreCheckedFieldByField(t *testing.T) {
	for _, tt := range []struct{ task, want string }{
		{`{"id": "x", "prompt": "p", "tools": ["spawn_subagents"], "reward": {"type": "exact", "answer": "a"}}`, "spawn_subagents needs an orchestrator"},
		{`{"id": "x", "prompt": "p", "reward": {"type": "parl", "perf": {"type": "exact", "answer": "a"}}}`, "parl: needs an orchestrator"},
		{`{"id": "x", "prompt": "p", "orchestrator": {}, "reward": {"type": "exact", "answer": "a"}}`, "orchestrator.subagent_policy: required"},
		{`{"id": "x", "prompt": "p", "orchestrator": {"subagent_policy": 3}, "reward": {"type": "exact", "answer": "a"}}`, "want a policy string or object"},
		{`{"id": "x", "prompt": "p", "orchestrator": {"subagent_policy": "s", "max_subagents": 2, "max_parallel": 3}, "reward": {"type": "exact", "answer": "a"}}`, "orchestrator.max_parallel: 3 is outside 1..2"},
		{`{"id": "x", "prompt": "p", "orchestrator": {"subagent_policy": "s", "subagent_tools": ["spawn_subagents"]}, "reward": {"type": "exact", "answer": "a"}}`, "sub-agents do not spawn sub-agents"},
		{`{"id": "x", "prompt": "p", "orchestrator": {"subagent_policy": "s", "subagent_limits": {"max_turns": -1}}, "reward": {"type": "exact", "answer": "a"}}`, "orchestrator.subagent_limits.max_turns"},
	} {
		_, err := agent.ReadTasks(strings.NewReader(tt.task), "tasks.jsonl", nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.task, err, tt.want)
		}
	}
	task := loadTask(t, orchestratorTask(`{"subagent_policy": "frozen"}`))
	if strings.Join(task.Tools, ",") != "bash,write_file,spawn_subagents,finish" {
		t.Errorf("tools %v", task.Tools)
	}
}

// Nothing that can run its sub-agents: the orchestrator episode does not
// open (attach), before the policy is asked anything.
func TestAnOrchestratorEpisodeWithoutASubagentPolicyDoesNotOpen(t *testing.T) {
	task := loadTask(t, orchestratorTask(`{"subagent_policy": "frozen"}`))
	cfg := agent.Config{Task: task, EpisodeID: "ep", Dir: t.TempDir(), Backend: "wasm", NewSandbox: wasmFactory(t), Policy: &turnsPolicy{}}
	_, err := agent.Open(context.Background(), cfg)
	var oe *agent.OpenError
	if !errors.As(err, &oe) || oe.Stage != agent.StageAttach || !strings.Contains(err.Error(), "sub-agent policy") {
		t.Fatalf("%v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, "ep.json")); err != nil {
		t.Fatal(err)
	}
}
