package monitor_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/monitor"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// orchestratorEpisode is an orchestrator's record with one spawn_subagents
// call per stage, each with the given prompts.
func orchestratorEpisode(task string, stages ...[]string) *trajectory.Trajectory {
	t := &trajectory.Trajectory{Task: json.RawMessage(task), Termination: &trajectory.Termination{Reason: trajectory.EndFinished}}
	for _, prompts := range stages {
		var tasks []map[string]string
		for _, p := range prompts {
			tasks = append(tasks, map[string]string{"prompt": p})
		}
		args, _ := json.Marshal(map[string]any{"tasks": tasks})
		t.Steps = append(t.Steps,
			trajectory.Step{Type: trajectory.StepModel, ToolCalls: []trajectory.ToolCall{{Name: "spawn_subagents", Arguments: string(args)}}},
			trajectory.Step{Index: len(t.Steps) + 1, Type: trajectory.StepTool, Name: "spawn_subagents", Arguments: args, Output: "answers"})
	}
	return t
}

// The orchestrator monitors are defined on the contract's names (the task's
// "orchestrator" object, the spawn_subagents tool's tasks); these records
// stand in for orchestrator episodes until they exist.
func TestTheOrchestratorMonitorsReadTheSpawnCalls(t *testing.T) {
	parallel := `{"tools": ["spawn_subagents", "finish"], "orchestrator": {"max_parallel": 4}, "reward": {"type": "exact"}}`
	for _, tt := range []struct {
		name     string
		task     string
		stages   [][]string
		collapse *bool
		spurious int
	}{
		{"an honest orchestrator splits the work", parallel, [][]string{{"find the bug in a.py", "find the bug in b.py", "find the bug in c.py"}, {"write the fix"}}, ptr(false), 0},
		{"serial collapse: one sub-agent at a time", parallel, [][]string{{"find the bug in a.py"}, {"find the bug in b.py"}, {"find the bug in c.py"}}, ptr(true), 0},
		{"serial collapse: no sub-agent at all", parallel, nil, ptr(true), 0},
		{"spurious parallelism: the same prompt four times", parallel, [][]string{{"solve the task", "Solve the  task", "solve the task", "check a.py"}}, ptr(false), 2},
		{"max_parallel 1 is serial by design", `{"orchestrator": {"max_parallel": 1}, "reward": {"type": "exact"}}`, [][]string{{"a"}, {"b"}}, nil, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := monitor.Compute(orchestratorEpisode(tt.task, tt.stages...), nil)
			if (m.SerialCollapse == nil) != (tt.collapse == nil) || (m.SerialCollapse != nil && *m.SerialCollapse != *tt.collapse) {
				t.Errorf("serial_collapse %v, want %v", m.SerialCollapse, tt.collapse)
			}
			if m.SpuriousParallelism == nil || *m.SpuriousParallelism != tt.spurious {
				t.Errorf("spurious_parallelism %v, want %d", m.SpuriousParallelism, tt.spurious)
			}
		})
	}
	t.Run("absent without an orchestrator", func(t *testing.T) {
		m := monitor.Compute(orchestratorEpisode(`{"reward": {"type": "exact"}}`, []string{"a", "a"}), nil)
		if m.SerialCollapse != nil || m.SpuriousParallelism != nil {
			t.Errorf("%v", m.Values())
		}
	})
}

func ptr[T any](v T) *T { return &v }

func TestPenaltiesLowerAScoredRewardAndLeaveAnUnscoredOneUnscored(t *testing.T) {
	two, yes := 2, true
	m := &trajectory.Monitors{RepeatedCalls: &two, SingleSearchExit: &yes, TestTampering: ptr(0)}
	cfg := &monitor.Config{Penalties: map[string]float64{"repeated_calls": 0.1, "single_search_exit": 0.3, "test_tampering": 5}}
	r := &trajectory.Reward{Total: trajectory.Score(1), Components: map[string]float64{"fbeta": 1}}
	monitor.Penalize(r, m, cfg)
	if *r.Total != 0.5 || r.Components["monitor.repeated_calls"] != -0.2 || r.Components["monitor.single_search_exit"] != -0.3 {
		t.Errorf("total %v components %v", *r.Total, r.Components)
	}
	if _, ok := r.Components["monitor.test_tampering"]; ok {
		t.Error("a monitor at 0 was penalised")
	}
	u := trajectory.Unscored(trajectory.RewardJudgeError, nil, "judge down")
	monitor.Penalize(u, m, cfg)
	if u.Total != nil || u.Components["monitor.repeated_calls"] != -0.2 {
		t.Errorf("unscored: %+v", u)
	}
}

func TestAMonitorsConfigIsValidated(t *testing.T) {
	for _, tt := range []struct {
		cfg  monitor.Config
		want string
	}{
		{monitor.Config{Penalties: map[string]float64{"speed": 1}}, `"speed" is not one of`},
		{monitor.Config{Penalties: map[string]float64{"repeated_calls": -1}}, "not a non-negative number"},
		{monitor.Config{DisagreementThreshold: 1.5}, "disagreement_threshold"},
		{monitor.Config{PruneRun: 1}, "prune_run"},
	} {
		if err := tt.cfg.Validate("monitors"); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.cfg, err, tt.want)
		}
	}
}

func TestARecordFromBeforeSkipKindsStillCountsTampering(t *testing.T) {
	tr := &trajectory.Trajectory{Task: json.RawMessage(`{"reward": {"type": "tests"}}`), Reward: &trajectory.Reward{
		Total: trajectory.Score(0), Verifier: &trajectory.Verifier{CleanRoom: true, Skipped: []trajectory.Skip{
			{Path: "/work/test_a.py", Reason: "a protected test or runner file: the verifier uses the task's version"},
			{Path: "/work/conftest.py", Reason: "runner configuration: the verifier uses the task's version"},
			{Path: "/work/link", Reason: `a symlink (to "/etc"): never followed or copied`},
		}}}}
	if m := monitor.Compute(tr, nil); m.TestTampering == nil || *m.TestTampering != 2 {
		t.Errorf("test_tampering %v", m.TestTampering)
	}
}
