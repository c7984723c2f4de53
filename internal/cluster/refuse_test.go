package cluster_test

import (
	"strings"
	"testing"
)

// TestACoordinatorRefusesWhatOneWorkerCannotHoldWithTheReason: a rollout
// with an orchestrator task is a 400 on a coordinator, naming the field
// and saying why (the tree must run on one host), and pointing to a
// single-host service. (A prefix task runs as a group item:
// TestAPrefixRolloutOverWorkersMatchesOneHost.)
func TestACoordinatorRefusesWhatOneWorkerCannotHoldWithTheReason(t *testing.T) {
	pol := scripted(0)
	defer pol.Close()
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	orch := exactTasks(1)[0]
	orch["orchestrator"] = map[string]any{"subagent_policy": map[string]any{"base_url": pol.URL(), "model": "frozen"}, "max_parallel": 3}
	orch["reward"] = map[string]any{"type": "parl", "perf": map[string]any{"type": "exact", "answer": "a"},
		"lambda_parallel": 0.5, "lambda_finish": 0.5, "parallel_cap": 3, "anneal": map[string]any{"schedule": "cosine", "steps": 100}}
	for _, tc := range []struct {
		task  map[string]any
		field string
		why   string
	}{
		{orch, "tasks[0].orchestrator", "its sub-agents"},
	} {
		var e struct {
			Error struct{ Field, Message string } `json:"error"`
		}
		code := coord.do("POST", "/v1/rollouts", rolloutRequest(pol.URL(), []map[string]any{tc.task}, 2, nil), &e)
		if code != 400 || e.Error.Field != tc.field || !strings.Contains(e.Error.Message, tc.why) ||
			!strings.Contains(e.Error.Message, "single-host rollbox serve") {
			t.Errorf("%s: %d %+v, want a 400 naming the field, why, and where it runs", tc.field, code, e.Error)
		}
	}
}
