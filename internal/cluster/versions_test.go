package cluster_test

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// versionsRun runs, on c, a rollout of 2 tasks × 2 under policy version v1
// with max_staleness 1; once every episode has had its first turn it
// announces v2 (none is stale yet) and v3 (all are). It returns the
// episodes and what each announcement cancelled.
// slowPolicy answers bash 50 times then finish, 200 ms a call, and counts
// the episodes whose second turn was asked for (their first recorded).
func slowPolicy() (*fakepolicy.Server, *atomic.Int64) {
	var n atomic.Int64
	pol := mustPolicy(fakepolicy.Config{Latency: 200 * time.Millisecond, Responder: fakepolicy.BashThenFinish(50),
		Fault: func(_ int64, req *fakepolicy.Request) fakepolicy.Fault {
			if req.AssistantTurns() == 1 {
				n.Add(1)
			}
			return fakepolicy.Fault{}
		}})
	return pol, &n
}

func versionsRun(t *testing.T, c *coordinator) (eps []*trajectory.Trajectory, cancelled []int, st runtime.RolloutStatus) {
	t.Helper()
	pol, firsts := slowPolicy() // firsts: episodes whose first turn is recorded (their second asked for)
	defer pol.Close()
	var tasks []map[string]any
	for _, id := range []string{"a", "b"} {
		tasks = append(tasks, map[string]any{"id": id, "prompt": "Task " + id + ".", "sandbox": map[string]any{"backend": "wasm"},
			"tools": []string{"bash", "finish"}, "limits": map[string]any{"max_turns": 60},
			"reward": map[string]any{"type": "exact", "answer": "done"}})
	}
	id := c.submit(rolloutRequest(pol.URL(), tasks, 2, map[string]any{"policy_version": "v1", "max_staleness": 1}))
	deadline := time.Now().Add(time.Minute)
	for firsts.Load() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 4 episodes asked for a second turn", firsts.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, v := range []string{"v2", "v3"} {
		var res runtime.PolicyVersionResult
		if code := c.do("POST", "/v1/rollouts/"+id+"/policy-version", map[string]any{"version": v}, &res); code != 200 || len(res.Rollouts) != 1 {
			t.Fatalf("announcing %s: %d %+v", v, code, res)
		}
		cancelled = append(cancelled, res.Rollouts[0].Cancelled)
	}
	eps = c.episodes(id, 2*time.Minute)
	c.do("GET", "/v1/rollouts/"+id, nil, &st)
	return eps, cancelled, st
}

// TestPolicyVersionsAndMaxStalenessOverWorkers: a rollout with a policy
// version and max_staleness runs over workers as on one host: each turn is
// stamped with the version announced last, and the announcement that makes
// the episodes stale ends them cancelled with the reason (the workers
// count them in the announcement's answer).
func TestPolicyVersionsAndMaxStalenessOverWorkers(t *testing.T) {
	single := startService(t, "", "")
	wantEps, wantCancelled, wantSt := versionsRun(t, single)

	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url)
	startWorker(t, ns.url, "w1", "wasm", 2)
	startWorker(t, ns.url, "w2", "wasm", 2)
	coord.waitWorkers(2)
	gotEps, gotCancelled, gotSt := versionsRun(t, coord)

	if !slices.Equal(wantCancelled, []int{0, 4}) {
		t.Fatalf("one host: announcements cancelled %v, want [0 4]", wantCancelled)
	}
	if !slices.Equal(gotCancelled, wantCancelled) {
		t.Errorf("over workers the announcements cancelled %v, on one host %v", gotCancelled, wantCancelled)
	}
	for name, eps := range map[string][]*trajectory.Trajectory{"one host": wantEps, "over workers": gotEps} {
		if len(eps) != 4 {
			t.Errorf("%s: %d episodes, want 4", name, len(eps))
		}
		for _, e := range eps {
			vs := modelVersions(e)
			if e.Termination == nil || e.Termination.Reason != trajectory.EndCancelled || e.Reward != nil ||
				!strings.Contains(e.Termination.Message, `policy version stale: the episode's first turn was sampled under "v1"`) {
				t.Errorf("%s: episode %s: %+v, want cancelled as stale", name, e.EpisodeID, e.Termination)
			}
			if len(vs) == 0 || vs[0] != "v1" || slices.Contains(vs, "v3") || slices.Contains(vs, "") {
				t.Errorf("%s: episode %s turns under %v, want v1 first, then v1 or v2", name, e.EpisodeID, vs)
			}
		}
	}
	for name, st := range map[string]runtime.RolloutStatus{"one host": wantSt, "over workers": gotSt} {
		if st.PolicyVersion != "v3" || st.MaxStaleness == nil || *st.MaxStaleness != 1 || st.Ends[trajectory.EndCancelled] != 4 ||
			st.PolicyVersions["v1"] < 4 || st.PolicyVersions["v3"] != 0 {
			t.Errorf("%s: status version %q, max_staleness %s, ends %v, turns by version %v", name, st.PolicyVersion,
				maxStr(st.MaxStaleness), st.Ends, st.PolicyVersions)
		}
	}
}

// modelVersions are the policy versions of an episode's model turns.
func modelVersions(tr *trajectory.Trajectory) []string {
	var out []string
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepModel {
			out = append(out, s.PolicyVersion)
		}
	}
	return out
}

func maxStr(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

// TestACoordinatorKilledKeepsItsRolloutsPolicyVersions: the coordinator is
// SIGKILLed while a rollout under policy version v1 with max_staleness 0
// runs; started again, it goes on with the versions announced (status
// v1), and announcing v2 ends every running episode as stale, as it would
// have without the restart.
func TestACoordinatorKilledKeepsItsRolloutsPolicyVersions(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them

	pol, seconds := slowPolicy() // seconds: episodes whose first turn is recorded
	defer pol.Close()
	task := map[string]any{"id": "a", "prompt": "Task a.", "sandbox": map[string]any{"backend": "wasm"}, "tools": []string{"bash", "finish"},
		"limits": map[string]any{"max_turns": 60}, "reward": map[string]any{"type": "exact", "answer": "done"}}
	ns := startNATS(t, "", 0)
	data, port := t.TempDir(), freePort(t)
	coord := startServe(t, ns.url, data, port)
	startWorker(t, ns.url, "w1", "wasm", 2)
	coord.waitWorkers(1)
	id := coord.submit(rolloutRequest(pol.URL(), []map[string]any{task}, 2, map[string]any{"policy_version": "v1", "max_staleness": 0}))
	deadline := time.Now().Add(time.Minute)
	for seconds.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 episodes had a first turn", seconds.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	coord.kill()
	coord.restart(t)

	var st runtime.RolloutStatus
	coord.do("GET", "/v1/rollouts/"+id, nil, &st)
	if st.PolicyVersion != "v1" || st.State != "running" {
		t.Fatalf("after the restart: state %s, policy_version %q, want running under v1", st.State, st.PolicyVersion)
	}
	var res runtime.PolicyVersionResult
	if code := coord.do("POST", "/v1/rollouts/"+id+"/policy-version", map[string]any{"version": "v2"}, &res); code != 200 || res.Rollouts[0].Cancelled != 2 {
		t.Errorf("announcing v2 after the restart: %d %+v, want both episodes cancelled", code, res)
	}
	for _, e := range coord.episodes(id, time.Minute) {
		if e.Termination.Reason != trajectory.EndCancelled || !strings.Contains(e.Termination.Message, `policy version stale: the episode's first turn was sampled under "v1"`) {
			t.Errorf("episode %s: %+v, want cancelled as stale", e.EpisodeID, e.Termination)
		}
		if vs := modelVersions(e); len(vs) == 0 || slices.ContainsFunc(vs, func(v string) bool { return v != "v1" }) {
			t.Errorf("episode %s turns under %v, want v1 only", e.EpisodeID, vs)
		}
	}
}
