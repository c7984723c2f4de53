package runtime_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
	"github.com/rollbox/rollbox/tools"
)

// infraRetries reads rollbox_infra_retries_total{backend="wasm"}.
func (s *service) infraRetries() int {
	m := regexp.MustCompile(`rollbox_infra_retries_total\{backend="wasm"\} (\d+)`).FindStringSubmatch(s.metrics())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestAnEnvironmentEpisodeWaitingToRetryItsOpenStopsWhenTheServiceCloses(t *testing.T) {
	flaky := &flakyBackends{inner: wasmBackends(t)}
	flaky.fail.Store(1000) // every create fails: the open is retried until the attempts run out
	s := startService(t, "", func(o *runtime.Options) { o.Backends = flaky; o.Limits.InfraAttempts = 20 })
	answered := make(chan time.Time, 1)
	go func() {
		s.do("POST", "/v1/episodes", map[string]any{"task": task("env")}, nil)
		answered <- time.Now()
	}()
	// The third retry has just been counted: its pause (3 × 200 ms) begins.
	deadline := time.Now().Add(20 * time.Second)
	for s.infraRetries() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the open was not retried three times")
		}
		time.Sleep(5 * time.Millisecond)
	}
	closed := time.Now()
	s.srv.Close()
	select {
	case at := <-answered:
		if waited := at.Sub(closed); waited > 300*time.Millisecond {
			t.Errorf("the request answered %v after the service closed: the retry's pause ignored the cancellation", waited)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not answer after the service closed")
	}
}

func TestAStreamReportsAnEpisodeWhoseRecordCannotBeReadInsteadOfSkippingIt(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	s := startService(t, "")
	id := s.submit(rolloutBody(p, 2, task("a"), task("b")))
	s.waitState(id, 30*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	lost := id + ".a.1"
	if err := os.WriteFile(filepath.Join(s.data, "episodes", lost+".json"), []byte("{torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"", "?stream=1"} {
		t.Run("episodes"+q, func(t *testing.T) {
			resp, err := http.Get(s.url + "/v1/rollouts/" + id + "/episodes" + q)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var ids []string
			found := false
			for _, line := range readNDJSON(t, resp.Body) { // each line a valid trajectory
				ids = append(ids, line.EpisodeID)
				if line.EpisodeID == lost {
					found = true
					if line.Termination == nil || line.Termination.Reason != trajectory.EndRecordError || line.Reward != nil {
						t.Errorf("the unreadable episode's line: termination %+v reward %+v, want record_error, unscored", line.Termination, line.Reward)
					}
				}
			}
			if len(ids) != 4 || !found {
				t.Errorf("lines for %v, want all 4 episodes with %s reported", ids, lost)
			}
		})
	}
}

// boom is a tool whose code has a bug: it panics.
type boom struct{}

func (boom) Schema() tools.Schema {
	return tools.Schema{Name: "boom", Description: "panics", Parameters: json.RawMessage(`{"type": "object", "properties": {}}`)}
}
func (boom) Run(context.Context, *tools.Env, map[string]any) (tools.Result, error) {
	panic("a bug in a tool")
}

// A bug that panics inside one episode fails that episode, not the whole
// run: the others are recorded, the summary written, and the run says so.
func TestABatchSurvivesAnEpisodeThatPanics(t *testing.T) {
	tasks, err := agent.ReadTasks(strings.NewReader(`{"id": "bug", "prompt": "p", "tools": ["boom", "finish"], "reward": {"type": "exact", "answer": "x"}}
{"id": "fine", "prompt": "p", "tools": ["finish"], "reward": {"type": "exact", "answer": "x"}}`), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	be := wasmtest.Backend(t)
	pol := policyFunc(func(_ context.Context, req agent.Request) (agent.Turn, error) {
		if req.TaskID == "bug" && req.Turn == 0 {
			return agent.Turn{ToolCalls: []agent.ToolCall{{ID: "c0", Name: "boom", Arguments: "{}"}}}, nil
		}
		return agent.Turn{ToolCalls: []agent.ToolCall{{ID: "c1", Name: "finish", Arguments: `{"answer": "x"}`}}}, nil
	})
	sum, err := runtime.RunBatch(context.Background(), runtime.BatchConfig{Tasks: tasks, OutDir: out, Backend: "wasm",
		NewSandbox: func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
			return be.Create(ctx, spec)
		},
		Policy: pol, PolicyInfo: trajectory.Policy{Kind: "test"},
		ConfigureEpisode: func(cfg *agent.Config) error {
			cfg.ExtraTools = map[string]tools.Tool{"boom": boom{}}
			return nil
		}})
	if err == nil || !strings.Contains(err.Error(), "a bug in a tool") {
		t.Fatalf("RunBatch: %v, want the panic as an error", err)
	}
	if sum == nil || sum.Episodes != 2 || sum.Ends["finished"] != 1 || sum.Ends["sandbox_error"] != 1 || sum.Scored != 1 {
		t.Fatalf("summary %+v, want the finished episode and the failed one, unscored", sum)
	}
	if _, err := os.Stat(filepath.Join(out, "summary.json")); err != nil {
		t.Error(err)
	}
	bug, err := trajectory.Read(filepath.Join(out, "episodes", sum.RolloutID+".bug.0.json"))
	if err != nil || bug.Termination.Reason != trajectory.EndSandboxError || !strings.Contains(bug.Termination.Message, "a bug in a tool") {
		t.Errorf("the failed episode's record: %+v %v", bug, err)
	}
}

type policyFunc func(context.Context, agent.Request) (agent.Turn, error)

func (f policyFunc) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	return f(ctx, req)
}
