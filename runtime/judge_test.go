package runtime_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakejudge"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

func startJudge(t testing.TB, model string, b fakejudge.Behavior) *fakejudge.Server {
	t.Helper()
	s, err := fakejudge.Start(fakejudge.Config{Model: model, Behavior: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// judgedTask is task(id) whose reward is a composite of its exact answer
// and a judge of two rubrics by judges a and b.
func judgedTask(id, a, b string) map[string]any {
	t := task(id)
	t["reward"] = map[string]any{"type": "composite", "parts": []any{
		map[string]any{"name": "exact", "weight": 1, "reward": map[string]any{"type": "exact", "answer": "done"}},
		map[string]any{"name": "judge", "weight": 1, "reward": map[string]any{"type": "judge",
			"rubrics": []any{
				map[string]any{"name": "answer", "instructions": "Is the answer right?", "scale": []int{0, 10}, "sees": []string{"answer"}},
				map[string]any{"name": "process", "instructions": "Did it look first?", "scale": []int{0, 10}, "sees": []string{"transcript"}},
			},
			"judges": []any{map[string]any{"name": "a", "base_url": a, "model": "a"}, map[string]any{"name": "b", "base_url": b, "model": "b", "retries": 0}}}},
	}}
	return t
}

// A rollout whose episodes are judged: a judge that breaks on some
// episodes leaves them unscored (out of the group statistics, never 0);
// the monitors reach the stream's group statistics, the summary and the
// metrics.
func TestARolloutsJudgedEpisodesAndMonitorsReachTheStreamSummaryAndMetrics(t *testing.T) {
	var n atomic.Int64
	p := startPolicy(t, fakepolicy.Config{Responder: func(req *fakepolicy.Request) fakepolicy.Reply {
		switch req.AssistantTurns() {
		case 0, 1: // the same call twice: repeated_calls fires
			return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command":"cat hello.txt"}`}}}
		}
		answer := "done"
		if n.Add(1) == 2 {
			answer = "break the judge" // judge b answers garbage to this one
		}
		a, _ := json.Marshal(map[string]string{"answer": answer})
		return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: string(a)}}}
	}})
	a := startJudge(t, "a", fakejudge.JSON(fakejudge.Fixed(8)))
	b := startJudge(t, "b", func(r fakejudge.Request) fakejudge.Reply {
		if strings.Contains(r.Prompt, "break the judge") {
			return fakejudge.Garbage()(r)
		}
		return fakejudge.JSON(fakejudge.Fixed(2))(r) // 0.2 vs a's 0.8: they disagree
	})
	s := startService(t, "", func(o *runtime.Options) { o.Judge = judge.Options{Concurrency: 2} })
	id := s.submit(rolloutBody(p, 4, judgedTask("j", a.URL(), b.URL())))
	eps := s.episodes(id, "?stream=1")
	if len(eps) != 4 {
		t.Fatalf("%d episodes", len(eps))
	}
	unscored := 0
	for _, e := range eps {
		if e.Reward == nil {
			t.Fatalf("episode %s has no reward", e.EpisodeID)
		}
		if e.Reward.Total == nil {
			unscored++
			if e.Reward.ErrorKind != trajectory.RewardJudgeError || e.Group.Advantage != 0 {
				t.Errorf("unscored episode: %+v group %+v", e.Reward, e.Group)
			}
			continue
		}
		// exact 1, judge (0.5 + 0.5)/2: total 0.75
		if *e.Reward.Total != 0.75 {
			t.Errorf("episode %s total %v components %v", e.EpisodeID, *e.Reward.Total, e.Reward.Components)
		}
		if g := e.Group; g.RewardMean != 0.75 || !g.ZeroVariance || g.Monitors["repeated_calls"] != 4 || g.Monitors["judge_disagreement"] != 3 {
			t.Errorf("group %+v", g)
		}
	}
	if unscored != 1 {
		t.Errorf("%d unscored episodes, want 1", unscored)
	}
	var sum runtime.Summary
	s.do("GET", "/v1/rollouts/"+id+"/summary", nil, &sum)
	if sum.Scored != 3 || sum.RewardMean == nil || *sum.RewardMean != 0.75 || sum.Monitors["repeated_calls"] != 4 || sum.Monitors["judge_disagreement"] != 3 ||
		sum.Judge == nil || sum.Judge.Episodes != 4 || sum.Judge.Unscored != 1 || sum.Tasks["j"].Monitors["repeated_calls"] != 4 {
		t.Errorf("summary %+v judge %+v", sum, sum.Judge)
	}
	var st struct {
		RewardMean *float64       `json:"reward_mean"`
		Monitors   map[string]int `json:"monitors"`
	}
	s.do("GET", "/v1/rollouts/"+id, nil, &st)
	if st.RewardMean == nil || *st.RewardMean != 0.75 || st.Monitors["repeated_calls"] != 4 || st.Monitors["judge_disagreement"] != 3 {
		t.Errorf("status reward mean %v monitors %v", st.RewardMean, st.Monitors)
	}
	m := s.metrics()
	for _, want := range []string{
		`rollbox_monitor_episodes_total{monitor="repeated_calls"} 4`,
		`rollbox_monitor_episodes_total{monitor="judge_disagreement"} 3`,
		`rollbox_rewards_unscored_total{kind="judge_error"} 1`,
		fmt.Sprintf(`rollbox_judge_requests_total{endpoint=%q,outcome="error"} 2`, b.URL()), // both rubrics see the answer
		fmt.Sprintf(`rollbox_judge_request_duration_seconds_count{endpoint=%q}`, a.URL()),
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if a.PeakInflight() > 2 || b.PeakInflight() > 2 {
		t.Errorf("the judge bound of 2 was passed: %d %d", a.PeakInflight(), b.PeakInflight())
	}
}

func TestARolloutWhoseJudgeIsItsOwnPolicyIsRefused(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{})
	s := startService(t, "")
	tk := judgedTask("j", p.URL(), "http://127.0.0.1:1/v1")
	tk["reward"].(map[string]any)["parts"].([]any)[1].(map[string]any)["reward"].(map[string]any)["judges"].([]any)[0].(map[string]any)["model"] = "fake-model"
	var e apiErr
	code, _ := s.do("POST", "/v1/rollouts", rolloutBody(p, 1, tk), &e)
	if code != 400 || e.Error.Field != "tasks[0].reward.parts[1].reward.judges[0]" || !strings.Contains(e.Error.Message, "policy's own") {
		t.Errorf("%d %+v", code, e)
	}
}

func TestAnInlineTaskCannotAskForAJudgeKeyFromTheServicesEnvironment(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{})
	s := startService(t, "")
	tk := judgedTask("j", "http://attacker.example/v1", "http://127.0.0.1:1/v1")
	tk["reward"].(map[string]any)["parts"].([]any)[1].(map[string]any)["reward"].(map[string]any)["judges"].([]any)[0].(map[string]any)["api_key_env"] = "AWS_SECRET_ACCESS_KEY"
	for _, path := range []string{"/v1/rollouts", "/v1/episodes"} {
		var body any = rolloutBody(p, 1, tk)
		want := "tasks[0].reward.parts[1].reward.judges[0].api_key_env"
		if path == "/v1/episodes" {
			body, want = map[string]any{"task": tk}, "task.reward.parts[1].reward.judges[0].api_key_env"
		}
		var e apiErr
		if code, _ := s.do("POST", path, body, &e); code != 400 || e.Error.Field != want {
			t.Errorf("%s: %d %+v", path, code, e)
		}
	}
}
