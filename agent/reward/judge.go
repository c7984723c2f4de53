package reward

import (
	"context"
	"fmt"
	"slices"

	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// sees reports whether a judge reward of s (itself or a part) shows view v.
func (s *Spec) sees(v string) bool {
	for _, js := range s.JudgeSpecs() {
		if js.Sees(v) {
			return true
		}
	}
	return false
}

// judged scores an episode with judges: the workspace is read first when
// a rubric sees its diff (once, shared with a tests part). A judge that
// fails after its retries leaves the reward unscored (judge_error); the
// rubrics every judge scored are still recorded as components.
func judged(ctx context.Context, s Spec, in Input) (*trajectory.Reward, error) {
	js := s.JudgeSpec()
	js.Names()
	ep := &judge.Episode{Prompt: in.Prompt, Answer: in.Answer, IDs: in.IDs, End: in.End, Steps: in.Steps}
	r := &trajectory.Reward{Components: map[string]float64{}}
	var wd *trajectory.WorkspaceDiff
	switch {
	case in.Recorded != nil:
		wd = in.Recorded.Workspace
	case len(in.ws.specs) > 0 || in.ws.diff:
		// The workspace is read (and the agent's sandbox closed) before
		// the judges are asked, which may take a while.
		var err error
		if wd, err = in.ws.workspaceDiff(ctx, in); err != nil {
			return nil, err
		}
	case in.CloseSandbox != nil:
		in.CloseSandbox() // nothing else needs it
	}
	if js.Sees(judge.SeesDiff) {
		r.Workspace = wd
		if wd != nil {
			ep.Diff = &wd.Diff
		}
	}
	pool := in.Judges
	if pool == nil {
		pool = judge.NewPool(judge.Options{})
	}
	rec := pool.Judge(ctx, &js, ep)
	r.Judge = rec
	for _, jr := range rec.Rubrics {
		if jr.Score != nil {
			r.Components["judge."+jr.Name] = *jr.Score
		}
	}
	if rec.Score == nil {
		u := trajectory.Unscored(trajectory.RewardJudgeError, r.Components, "the judges could not score the episode: "+rec.Error)
		u.Judge, u.Workspace = rec, r.Workspace
		return u, nil
	}
	r.Components["judge"] = *rec.Score
	r.Total = trajectory.Score(*rec.Score)
	return r, nil
}

// recordedTests is a tests part of a rescore: the score recorded for its
// command, or unscored (unrecorded) when the record has none.
func recordedTests(s Spec, rec *Recorded) *trajectory.Reward {
	v, ok := rec.Tests[s.Command]
	if !ok {
		var have []string
		for c := range rec.Tests {
			have = append(have, fmt.Sprintf("%q", c))
		}
		slices.Sort(have)
		why := fmt.Sprintf("the record holds no tests score for the command %q (recorded: %v): tests are not re-run by a rescore", s.Command, have)
		return trajectory.Unscored(trajectory.RewardUnrecorded, nil, why)
	}
	return &trajectory.Reward{Total: trajectory.Score(v), Components: map[string]float64{"tests": v}, Verifier: rec.Verifier,
		Details: []string{"the tests score recorded by the episode (not re-run)"}, Workspace: rec.Workspace}
}
