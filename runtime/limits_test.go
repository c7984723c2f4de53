package runtime_test

import (
	"fmt"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

func TestAnOversizedRolloutIsRefusedBeforeAnythingIsAllocated(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{})
	s := startService(t, "")
	tasks := make([]any, 1000)
	for i := range tasks {
		tasks[i] = map[string]any{"id": fmt.Sprintf("task-%d", i), "prompt": "p", "reward": map[string]any{"type": "exact", "answer": "x"}}
	}
	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	start := time.Now()
	var e apiErr
	code, _ := s.do("POST", "/v1/rollouts", rolloutBody(p, 4096, tasks...), &e)
	took := time.Since(start)
	goruntime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("1,000 tasks × 4,096: %d %s in %s, %.1f MiB allocated", code, e.Error.Code, took, float64(alloc)/(1<<20))
	if code != 413 || e.Error.Field != "tasks" {
		t.Errorf("answer %d %+v", code, e)
	}
	if took > time.Second || alloc > 64<<20 {
		t.Errorf("refusing it took %s and %d bytes", took, alloc)
	}
}

func TestNumbersOutsideTheirRangesAreRefusedNamingTheField(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{})
	s := startService(t, "", func(o *runtime.Options) {
		o.Maxima = runtime.Maxima{MaxTurns: 50, Tasks: 3}
		o.Catalog = loadCatalog(t, `{"id": "known", "prompt": "p", "limits": {"max_turns": 200}, "reward": {"type": "exact", "answer": "x"}}`)
	})
	with := func(path string, v any) map[string]any {
		tk := task("t")
		cur := tk
		parts := strings.Split(path, ".")
		for _, k := range parts[:len(parts)-1] {
			next, ok := cur[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				cur[k] = next
			}
			cur = next
		}
		cur[parts[len(parts)-1]] = v
		return tk
	}
	for _, tt := range []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"an episode timeout that overflows", rolloutBody(p, 1, with("limits.episode_timeout_s", 1e300)), "tasks[0].limits.episode_timeout_s"},
		{"a terabyte of memory", rolloutBody(p, 1, with("sandbox.limits.memory_mb", 1048576)), "tasks[0].sandbox.limits.memory_mb"},
		{"95 TiB of disk", rolloutBody(p, 1, with("sandbox.limits.disk_mb", 1e8)), "tasks[0].sandbox.limits.disk_mb"},
		{"a hundred million processes", rolloutBody(p, 1, with("sandbox.limits.pids", 1e8)), "tasks[0].sandbox.limits.pids"},
		{"processes past the service's maximum", rolloutBody(p, 1, with("sandbox.limits.pids", 100000)), "tasks[0].sandbox.limits.pids"},
		{"a command timeout that overflows", rolloutBody(p, 1, with("sandbox.limits.exec_timeout_s", 1e300)), "tasks[0].sandbox.limits.exec_timeout_s"},
		{"a verifier timeout that overflows", rolloutBody(p, 1, with("reward.timeout_s", 1e300)), "tasks[0].reward.timeout_s"},
		{"more CPUs than the host", rolloutBody(p, 1, with("sandbox.limits.cpus", 200)), "tasks[0].sandbox.limits.cpus"},
		{"turns past --max-limits", rolloutBody(p, 1, with("limits.max_turns", 51)), "tasks[0].limits.max_turns"},
		{"an override past --max-limits", func() map[string]any {
			b := rolloutBody(p, 1, map[string]any{"id": "known"})
			b["overrides"] = map[string]any{"limits": map[string]any{"max_turns": 60}}
			return b
		}(), "overrides.limits.max_turns"},
		{"an override that overflows", func() map[string]any {
			b := rolloutBody(p, 1, task("t"))
			b["overrides"] = map[string]any{"limits": map[string]any{"episode_timeout_s": 1e300}}
			return b
		}(), "overrides.limits.episode_timeout_s"},
		{"a policy timeout that overflows", func() map[string]any {
			b := rolloutBody(p, 1, task("t"))
			b["policy"].(map[string]any)["timeout_s"] = 1e300
			return b
		}(), "policy.timeout_s"},
		{"more tasks than --max-limits", rolloutBody(p, 1, task("a"), task("b"), task("c"), task("d")), "tasks"},
		{"an environment episode with a terabyte of memory", map[string]any{"task": with("sandbox.limits.memory_mb", 1048576)}, "task.sandbox.limits.memory_mb"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := "/v1/rollouts"
			if _, ok := tt.body["task"]; ok {
				path = "/v1/episodes"
			}
			var e apiErr
			if code, _ := s.do("POST", path, tt.body, &e); code != 400 || e.Error.Field != tt.field {
				t.Errorf("%d %+v, want 400 naming %s", code, e.Error, tt.field)
			}
		})
	}
	// The operator's own task, named by id, is not bound by the maxima.
	if code, _ := s.do("POST", "/v1/rollouts", rolloutBody(p, 1, map[string]any{"id": "known"}), nil); code != 201 {
		t.Errorf("a catalog task past the maxima: %d", code)
	}
}

func loadCatalog(t *testing.T, lines string) []*agent.Task {
	t.Helper()
	tasks, err := agent.ReadTasks(strings.NewReader(lines), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return tasks
}
