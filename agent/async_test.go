package agent_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// gatedPolicy is a frozen sub-agent policy scripted by prompt whose turn
// at[prompt] closes reached[prompt] and waits until the test closes
// gates[prompt] (or the sub-agent is cancelled).
type gatedPolicy struct {
	promptPolicy
	gates, reached map[string]chan struct{}
	at             map[string]int
}

func (p *gatedPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	prompt := req.Messages[1].Content
	if g, ok := p.gates[prompt]; ok && req.Turn == p.at[prompt] {
		close(p.reached[prompt])
		select {
		case <-g:
		case <-ctx.Done():
			return agent.Turn{}, ctx.Err()
		}
	}
	return p.promptPolicy.Next(ctx, req)
}

// An asynchronous orchestrator gets handles at once and goes on; wait
// (any, all, a timeout) and collect answer each result exactly once; a
// stage ends at a call that answers results; a sub-agent never collected
// is cancelled as the orchestrator ends, recorded last and on no critical
// path. A replay fed by the recording answers every call the same.
func TestAsynchronousSubagentsAreWaitedForAndCollectedEachOnce(t *testing.T) {
	task := loadTask(t, strings.Replace(orchestratorTask(`{"subagent_policy": "frozen", "async": true, "max_parallel": 3}`),
		`"max_turns": 8`, `"max_turns": 12`, 1))
	if strings.Join(task.Tools, ",") != "bash,write_file,spawn_subagents,wait,collect,finish" {
		t.Fatalf("tools %v", task.Tools)
	}
	gate := map[string]chan struct{}{"slow": make(chan struct{}), "never": make(chan struct{})}
	reached := map[string]chan struct{}{"slow": make(chan struct{}), "never": make(chan struct{})}
	sub := &gatedPolicy{gates: gate, reached: reached, at: map[string]int{"slow": 1, "never": 1}, promptPolicy: promptPolicy{turns: map[string][]agent.Turn{
		"fast":  {calls("bash", `{"command": "echo fast"}`), calls("finish", `{"answer": "F"}`)},
		"slow":  {calls("bash", `{"command": "true"}`), calls("bash", `{"command": "true"}`), calls("finish", `{"answer": "S"}`)},
		"never": {calls("bash", `{"command": "true"}`), calls("finish", `{"answer": "N"}`)},
	}}}
	orchTurns := []agent.Turn{
		calls("spawn_subagents", spawn("fast", "slow")),
		calls("wait", `{"mode": "any"}`),
		calls("collect", `{}`),
		calls("wait", `{"handles": ["s0-1"], "timeout_s": 0.05}`),
		calls("wait", `{}`), // the policy opens the slow one's gate before this turn
		calls("spawn_subagents", spawn("never")),
		calls("wait", `{"handles": ["s0-0"]}`),
		calls("wait", `{"handles": ["s9-9"]}`),
		calls("finish", `{"answer": "done"}`),
	}
	var once sync.Once
	orch := policyFunc(func(req agent.Request) (agent.Turn, error) {
		switch req.Turn {
		case 4:
			once.Do(func() { close(gate["slow"]) })
		case 8:
			<-reached["never"] // it has taken a turn: cancelled with 1 step
		}
		if req.Turn >= len(orchTurns) {
			return agent.Turn{}, fmt.Errorf("no turn %d", req.Turn)
		}
		return orchTurns[req.Turn], nil
	})
	var dir string
	tr := runEpisode(t, task, orch, withSubagents(sub), func(c *agent.Config) { dir = c.Dir })
	if tr.Termination.Reason != trajectory.EndFinished || *tr.Reward.Total != 1 {
		t.Fatalf("end %+v reward %+v", tr.Termination, tr.Reward)
	}
	steps := toolSteps(tr)
	want := []string{
		`{"handles":["s0-0","s0-1"]}`,
		`{"handle":"s0-0","index":0,"end":"finished","answer":"F","steps":2}` + "\n" + `], "pending": ["s0-1"], "timed_out": false}`,
		`{"results": [` + "\n" + `], "pending": ["s0-1"], "timed_out": false}`,
		`{"results": [` + "\n" + `], "pending": ["s0-1"], "timed_out": true}`,
		`{"handle":"s0-1","index":1,"end":"finished","answer":"S","steps":3}` + "\n" + `], "pending": [], "timed_out": false}`,
		`{"handles":["s1-0"]}`,
		`the result of s0-0 was already returned`,
		`no sub-agent "s9-9" was spawned`,
	}
	for i, w := range want {
		if !strings.Contains(steps[i].Output, w) {
			t.Errorf("call %d (%s): %q, want it to hold %q", i, steps[i].Name, steps[i].Output, w)
		}
	}
	if len(tr.Subagents) != 3 {
		t.Fatalf("sub-agents %+v", tr.Subagents)
	}
	fast, slow, never := tr.Subagents[0], tr.Subagents[1], tr.Subagents[2]
	type row struct {
		handle      string
		stage, step int
		collected   int // -1: never
		end         string
		critical    bool
		steps       int
	}
	for i, w := range []row{{"s0-0", 0, 0, 1, "finished", true, 2}, {"s0-1", 1, 0, 4, "finished", true, 3}, {"s1-0", 2, 5, -1, "cancelled", false, 1}} {
		sa := tr.Subagents[i]
		got := -1
		if sa.CollectedStep != nil {
			got = *sa.CollectedStep
		}
		// Step and collected step are the tool steps' indexes among all steps.
		if sa.Handle != w.handle || sa.Stage != w.stage || sa.Step != stepIndex(tr, w.step) || (w.collected >= 0) != (got >= 0) ||
			(w.collected >= 0 && got != stepIndex(tr, w.collected)) || sa.End != w.end || sa.Critical != w.critical || sa.Steps != w.steps {
			t.Errorf("sub-agent %d: %+v, want %+v", i, sa, w)
		}
	}
	if never.Finished || !strings.Contains(never.Message, "the orchestrator ended before collecting") {
		t.Errorf("the uncollected sub-agent: %+v", never)
	}
	if p := subRecord(t, dir, slow).Parent; p == nil || p.EpisodeID != "ep" || p.Step != slow.Step {
		t.Errorf("slow's parent %+v", p)
	}
	_ = fast
	// 9 orchestrator turns + 2 (stage 0) + 3 (stage 1); the never-collected
	// sub-agent's turn counts in the total only.
	if *tr.Stats.CriticalSteps != 9+2+3 || *tr.Stats.TotalSteps != 9+2+3+1 || agent.CriticalSteps(tr) != 14 {
		t.Errorf("critical %d (from the tree %d) total %d", *tr.Stats.CriticalSteps, agent.CriticalSteps(tr), *tr.Stats.TotalSteps)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, agent.SubagentsDir, "*")); len(files) != 3 {
		t.Errorf("sub-episode files %v", files)
	}

	// Replayed from the recording: nothing runs, every answer the same.
	re := runEpisode(t, task, orch, func(c *agent.Config) {
		c.Subagents = &agent.Subagents{Recorded: append([]trajectory.Subagent{}, tr.Subagents...)}
	})
	for i, st := range toolSteps(re) {
		if st.Output != steps[i].Output {
			t.Errorf("replayed call %d: %q, recorded %q", i, st.Output, steps[i].Output)
		}
	}
	if *re.Stats.CriticalSteps != 14 || len(re.Subagents) != 3 || re.Subagents[2].CollectedStep != nil {
		t.Errorf("replayed: critical %d, sub-agents %+v", *re.Stats.CriticalSteps, re.Subagents)
	}
}

// stepIndex is the index among all steps of the n-th tool step.
func stepIndex(tr *trajectory.Trajectory, n int) int {
	for i, st := range tr.Steps {
		if st.Type == trajectory.StepTool {
			if n == 0 {
				return i
			}
			n--
		}
	}
	return -1
}

type policyFunc func(agent.Request) (agent.Turn, error)

func (f policyFunc) Next(_ context.Context, req agent.Request) (agent.Turn, error) { return f(req) }
