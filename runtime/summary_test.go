package runtime_test

import (
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
)

// A pass is the task's outcome reaching 1, not the total: a parl episode's
// total holds annealed shaping terms, which can lift a wrong answer to 1
// early in training (λ large) or pull a right one under 1 (latency).
func TestPassRateCountsTheTaskOutcomeNotTheShapedTotal(t *testing.T) {
	ep := func(task string, total float64, components map[string]float64) *trajectory.Trajectory {
		return &trajectory.Trajectory{TaskID: task, GroupID: task,
			Reward: &trajectory.Reward{Total: trajectory.Score(total), Components: components}}
	}
	ts := []*trajectory.Trajectory{
		// Wrong answers, every sub-agent useful, λ_parallel = λ_finish = 0.5.
		ep("parl", 1.0, map[string]float64{"r_perf": 0, "r_parallel": 1, "r_finish": 1, "lambda_parallel": 0.5, "lambda_finish": 0.5}),
		ep("parl", 1.0, map[string]float64{"r_perf": 0, "r_parallel": 1, "r_finish": 1, "lambda_parallel": 0.5, "lambda_finish": 0.5}),
		// Right answer, a latency term under 1.
		ep("parl", 0.8, map[string]float64{"r_perf": 1, "r_parallel": 0, "r_finish": 0, "r_latency": 1}),
		ep("exact", 1, map[string]float64{"exact": 1}),
		ep("exact", 0, map[string]float64{"exact": 0}),
		ep("tests", 0.5, map[string]float64{"tests": 0.5}),
		// Unscored: in neither count.
		{TaskID: "tests", GroupID: "tests", Reward: trajectory.Unscored(trajectory.RewardJudgeError, nil, "judge down")},
	}
	s := runtime.Summarize("r", ts)
	if s.Scored != 6 || s.PassRate == nil || *s.PassRate != 2.0/6 {
		t.Fatalf("scored %d, pass_rate %v: want 6 scored, pass_rate 1/3 (the right parl answer and the exact 1)", s.Scored, deref(s.PassRate))
	}
	if p := s.Tasks["parl"].PassRate; p == nil || *p != 1.0/3 {
		t.Errorf("parl pass_rate %v, want 1/3", deref(p))
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
