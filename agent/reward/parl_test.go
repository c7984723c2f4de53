package reward

import (
	"context"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
)

func TestTheAnnealingSchedulesGoFromLambda0To0(t *testing.T) {
	for _, tt := range []struct {
		schedule string
		at       map[int64]float64
	}{
		{AnnealLinear, map[int64]float64{-5: 0.4, 0: 0.4, 250: 0.3, 500: 0.2, 750: 0.1, 999: 0.0004, 1000: 0, 5000: 0}},
		{AnnealCosine, map[int64]float64{0: 0.4, 250: 0.341421356237, 500: 0.2, 750: 0.058578643763, 1000: 0, 1001: 0}},
		{AnnealStep, map[int64]float64{0: 0.4, 500: 0.4, 999: 0.4, 1000: 0, 2000: 0}},
	} {
		a := &Anneal{Schedule: tt.schedule, Steps: 1000}
		for step, want := range tt.at {
			if got := a.Lambda(0.4, step); got != want {
				t.Errorf("%s at train step %d: λ %v, want %v", tt.schedule, step, got, want)
			}
		}
	}
	var none *Anneal
	if got := none.Lambda(0.4, 1e9); got != 0.4 {
		t.Errorf("without anneal λ is constant: %v", got)
	}
}

func TestTheParlRewardRecordsEachComponent(t *testing.T) {
	ans := "42"
	spec := Spec{Type: "parl", Perf: &Spec{Type: "exact", Answer: "42"}, LambdaParallel: 0.5, LambdaFinish: 0.25, ParallelCap: 2,
		Anneal: &Anneal{Schedule: AnnealStep, Steps: 10}, Latency: &Latency{Weight: 0.1, Steps: 20}}
	if err := spec.Validate("reward"); err != nil {
		t.Fatal(err)
	}
	subs := []trajectory.Subagent{
		{Prompt: "a", Finished: true, Useful: true}, {Prompt: "b", Finished: true, Useful: true}, {Prompt: "c", Finished: true, Useful: true}, // capped at 2
		{Finished: true}, // answered without working: finished, not useful
		{End: "timeout"}, // neither
	}
	r, err := Evaluate(context.Background(), spec, Input{Answer: &ans, Subagents: subs, CriticalSteps: 5, TrainStep: 3})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"r_perf": 1, "r_parallel": 1, "r_finish": 0.8, "lambda_parallel": 0.5, "lambda_finish": 0.25,
		"r_latency": 0.25, "train_step": 3, "subagents": 5, "useful_subagents": 3, "critical_steps": 5}
	for k, v := range want {
		if r.Components[k] != v {
			t.Errorf("%s = %v, want %v", k, r.Components[k], v)
		}
	}
	if *r.Total != 1+0.5+0.25*0.8-0.1*0.25 {
		t.Errorf("total %v", *r.Total)
	}
	// Past the anneal the auxiliary terms weigh nothing.
	r, _ = Evaluate(context.Background(), spec, Input{Answer: &ans, Subagents: subs, CriticalSteps: 5, TrainStep: 10})
	if *r.Total != 1-0.1*0.25 {
		t.Errorf("total after the anneal %v", *r.Total)
	}
	// No sub-agent: r_parallel and r_finish are 0; a wrong answer is r_perf 0.
	wrong := "41"
	r, _ = Evaluate(context.Background(), spec, Input{Answer: &wrong})
	if *r.Total != 0 || r.Components["r_finish"] != 0 || r.Components["r_parallel"] != 0 {
		t.Errorf("no sub-agents: %v %v", *r.Total, r.Components)
	}
}

func TestAParlSpecIsCheckedFieldByField(t *testing.T) {
	for _, tt := range []struct {
		spec Spec
		want string
	}{
		{Spec{Type: "parl"}, "reward.perf: required"},
		{Spec{Type: "parl", Perf: &Spec{Type: "parl"}}, "reward.perf.type: parl rewards do not nest"},
		{Spec{Type: "parl", Perf: &Spec{Type: "exact"}}, "reward.perf.answer: required"},
		{Spec{Type: "parl", Perf: &Spec{Type: "exact", Answer: "a"}, LambdaParallel: -1}, "reward.lambda_parallel"},
		{Spec{Type: "parl", Perf: &Spec{Type: "exact", Answer: "a"}, Anneal: &Anneal{Schedule: "exp", Steps: 5}}, "reward.anneal.schedule \"exp\" is not one of linear, cosine, step"},
		{Spec{Type: "parl", Perf: &Spec{Type: "exact", Answer: "a"}, Anneal: &Anneal{Schedule: "linear"}}, "reward.anneal.steps"},
		{Spec{Type: "composite", Parts: []Part{{Weight: 1, Reward: Spec{Type: "parl"}}}}, "parl is a whole reward"},
	} {
		err := tt.spec.Validate("reward")
		if err == nil || !contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.spec, err, tt.want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
