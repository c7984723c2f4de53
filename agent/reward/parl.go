package reward

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// Annealing schedules of a parl reward's auxiliary weights.
const (
	AnnealLinear = "linear"
	AnnealCosine = "cosine"
	AnnealStep   = "step"
)

// DefaultParallelCap is where r_parallel saturates when parallel_cap is
// not set: 4 sub-agents that did real work.
const DefaultParallelCap = 4

// Anneal takes a parl reward's λ from its value at train step 0 to 0 over
// Steps train steps.
type Anneal struct {
	// Schedule is linear (λ0·(1 − t/T)), cosine (λ0·(1 + cos(π·t/T))/2)
	// or step (λ0 until T, then 0); every schedule is 0 from t = T on.
	Schedule string `json:"schedule"`
	Steps    int64  `json:"steps"`
}

// Latency is a parl reward's optional latency term: Weight × min(1,
// critical_steps / Steps) is subtracted.
type Latency struct {
	Weight float64 `json:"weight"`
	Steps  int     `json:"steps"`
}

// Lambda is λ0 annealed to train step t.
func (a *Anneal) Lambda(lambda0 float64, t int64) float64 {
	if a == nil || a.Steps <= 0 {
		return lambda0
	}
	if t < 0 {
		t = 0
	}
	if t >= a.Steps {
		return 0
	}
	x := float64(t) / float64(a.Steps)
	v := lambda0 * (1 - x)
	switch a.Schedule {
	case AnnealCosine:
		v = lambda0 * (1 + math.Cos(math.Pi*x)) / 2
	case AnnealStep:
		v = lambda0
	}
	return round12(v)
}

// round12 rounds to 12 decimals: the float noise of a schedule's
// arithmetic is not part of the reward.
func round12(v float64) float64 { return math.Round(v*1e12) / 1e12 }

func (s *Spec) validateParl(field string) error {
	if s.Perf == nil {
		return fmt.Errorf("%s.perf: required for type parl (the outcome reward: any reward but parl)", field)
	}
	if s.Perf.Type == "parl" {
		return fmt.Errorf("%s.perf.type: parl rewards do not nest", field)
	}
	if err := s.Perf.Validate(field + ".perf"); err != nil {
		return err
	}
	for _, w := range []struct {
		name string
		v    float64
	}{{"lambda_parallel", s.LambdaParallel}, {"lambda_finish", s.LambdaFinish}} {
		if w.v < 0 || math.IsNaN(w.v) || math.IsInf(w.v, 0) {
			return fmt.Errorf("%s.%s: %v is not a non-negative number", field, w.name, w.v)
		}
	}
	if s.ParallelCap < 0 || s.ParallelCap > 256 {
		return fmt.Errorf("%s.parallel_cap: %d is outside 1..256", field, s.ParallelCap)
	}
	if a := s.Anneal; a != nil {
		switch a.Schedule {
		case AnnealLinear, AnnealCosine, AnnealStep:
		default:
			return fmt.Errorf("%s.anneal.schedule %q is not one of linear, cosine, step", field, a.Schedule)
		}
		if a.Steps < 1 {
			return fmt.Errorf("%s.anneal.steps: %d is not a positive number of train steps", field, a.Steps)
		}
	}
	if l := s.Latency; l != nil {
		if l.Weight < 0 || math.IsNaN(l.Weight) || math.IsInf(l.Weight, 0) {
			return fmt.Errorf("%s.latency.weight: %v is not a non-negative number", field, l.Weight)
		}
		if l.Steps < 1 {
			return fmt.Errorf("%s.latency.steps: %d is not a positive number of critical steps", field, l.Steps)
		}
	}
	return nil
}

// parl is the PARL reward: r_perf + λ_parallel·r_parallel +
// λ_finish·r_finish (− latency), the λ annealed at the rollout's train step.
//
//   - r_perf is the perf reward's total (unscored perf: unscored parl);
//   - r_parallel = min(useful, cap) / cap, useful being the sub-agents that
//     finished with a non-empty answer after at least one tool call
//     besides finish that the tool ran (real work), a prompt repeated
//     counting once, cap parallel_cap (default 4);
//   - r_finish = the fraction of the spawned sub-agents that finished with
//     a non-empty answer (0 when none was spawned);
//   - r_latency = min(1, critical_steps / latency.steps), weighted by
//     latency.weight, when latency is set.
//
// Each is a component, with lambda_parallel, lambda_finish and train_step
// as they were applied.
func parl(ctx context.Context, s Spec, in Input) (*trajectory.Reward, error) {
	perf, err := Evaluate(ctx, *s.Perf, in)
	if err != nil {
		return nil, err
	}
	r := &trajectory.Reward{Components: map[string]float64{}, Verifier: perf.Verifier, Judge: perf.Judge, Workspace: perf.Workspace}
	for k, v := range perf.Components {
		if k != s.Perf.Type {
			r.Components["perf."+strings.TrimPrefix(k, s.Perf.Type+".")] = v
		}
	}
	for _, d := range perf.Details {
		r.Details = append(r.Details, "perf: "+d)
	}
	capN := s.ParallelCap
	if capN == 0 {
		capN = DefaultParallelCap
	}
	var useful, finished int
	usefulPrompts := map[string]bool{}
	for _, sa := range in.Subagents {
		// A sub-task repeated counts once: else the same look-up spawned
		// parallel_cap times earns the whole r_parallel.
		if p := strings.TrimSpace(sa.Prompt); sa.Useful && !usefulPrompts[p] {
			usefulPrompts[p] = true
			useful++
		}
		if sa.Finished {
			finished++
		}
	}
	rParallel := float64(min(useful, capN)) / float64(capN)
	rFinish := 0.0
	if n := len(in.Subagents); n > 0 {
		rFinish = float64(finished) / float64(n)
	}
	lp, lf := s.Anneal.Lambda(s.LambdaParallel, in.TrainStep), s.Anneal.Lambda(s.LambdaFinish, in.TrainStep)
	c := r.Components
	c["r_parallel"], c["r_finish"] = rParallel, rFinish
	c["lambda_parallel"], c["lambda_finish"], c["train_step"] = lp, lf, float64(in.TrainStep)
	c["subagents"], c["useful_subagents"], c["critical_steps"] = float64(len(in.Subagents)), float64(useful), float64(in.CriticalSteps)
	var latency float64
	if l := s.Latency; l != nil {
		rl := math.Min(1, float64(in.CriticalSteps)/float64(l.Steps))
		c["r_latency"] = rl
		latency = l.Weight * rl
	}
	v, scored := perf.Value()
	if !scored {
		r.ErrorKind = perf.ErrorKind
		r.Details = append(r.Details, fmt.Sprintf("perf is unscored (%s): the parl reward is unscored", perf.ErrorKind))
		return r, nil
	}
	c[trajectory.PerfComponent] = v
	total := v + lp*rParallel + lf*rFinish - latency
	r.Total = trajectory.Score(round12(total))
	return r, nil
}
