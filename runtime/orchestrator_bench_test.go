package runtime_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
)

// BenchmarkOrchestrators runs one rollout of $ROLLBOX_BENCH_ORCHESTRATORS
// (default 100) orchestrator episodes on WASM, each spawning 8 sub-agents
// in one call (max_parallel 8) that run a bash command and finish, against
// fake policies answering at once, in this process over HTTP. Side by side
// in the same run, the baseline: the same 8 × N sub-tasks as plain
// episodes of one rollout. It reports that every episode completed, the
// scheduler's overhead per sub-agent spawn (from the spawn_subagents call's
// start to the sub-episode's start, as both records say: the goroutine,
// the slot, the task and its config; the sub-episode's clock starts
// before its sandbox is made), and the process's peak RSS (VmHWM).
func BenchmarkOrchestrators(b *testing.B) {
	n := envInt("ROLLBOX_BENCH_ORCHESTRATORS", 100)
	const width = 8
	prompts := make([]string, width)
	var tasks []string
	for i := range prompts {
		prompts[i] = fmt.Sprintf("sub-task %d: run true, then answer done", i)
		tasks = append(tasks, fmt.Sprintf(`{"prompt": %q}`, prompts[i]))
	}
	orch := startPolicy(b, fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "spawn_subagents", Arguments: `{"tasks": [` + strings.Join(tasks, ", ") + `]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}})})
	sub := startPolicy(b, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	// All at once (one rollout: every tree runs at once, 800 sandboxes on
	// 2 cores, so a sub-agent's start waits for the CPU), and one tree at
	// a time (N rollouts of one orchestrator, one after the other), where
	// the spawn path's own cost shows.
	for _, one := range []bool{false, true} {
		name := "all-at-once"
		if one {
			name = "one-tree-at-a-time"
		}
		b.Run(name, func(b *testing.B) { benchOrchestrators(b, n, one, prompts, tasks, orch, sub) })
	}
}

func benchOrchestrators(b *testing.B, n int, oneAtATime bool, prompts, tasks []string, orch, sub *fakepolicy.Server) {
	const width = 8
	for range b.N {
		data := b.TempDir()
		s := startService(b, data)
		var peak atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // VmHWM is the process's peak since it started; sample RSS too
			defer wg.Done()
			for {
				peak.Store(max(peak.Load(), rssKB()))
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		var ts []any
		for i := range n {
			t := task(fmt.Sprintf("o%d", i))
			t["orchestrator"] = map[string]any{"subagent_policy": map[string]any{"base_url": sub.URL(), "model": "frozen"},
				"max_subagents": width, "max_parallel": width}
			ts = append(ts, t)
		}
		start := time.Now()
		var eps []*trajectory.Trajectory
		batches := [][]any{ts}
		if oneAtATime {
			batches = nil
			for _, t := range ts {
				batches = append(batches, []any{t})
			}
		}
		for _, batch := range batches {
			id := s.submit(rolloutBody(orch, 1, batch...))
			st := s.waitState(id, 10*time.Minute, func(st status) bool { return st.State == "done" })
			if st.EpisodesDone != len(batch) || st.Ends["finished"] != len(batch) {
				b.Fatalf("status %+v", st)
			}
			eps = append(eps, s.episodes(id, "")...)
		}
		orchWall := time.Since(start)
		close(stop)
		wg.Wait()
		if len(eps) != n {
			b.Fatalf("%d orchestrator episodes", len(eps))
		}
		var overhead []float64
		subs, subEnds := 0, map[string]int{}
		for _, e := range eps {
			spawned := map[int]time.Time{}
			for _, st := range e.Steps {
				if st.Name == "spawn_subagents" {
					spawned[st.Index] = st.StartedAt
				}
			}
			for _, sa := range e.Subagents {
				subs++
				subEnds[sa.End]++
				raw, err := os.ReadFile(filepath.Join(data, "episodes", sa.File))
				if err != nil {
					b.Fatal(err)
				}
				var tr trajectory.Trajectory
				json.Unmarshal(raw, &tr)
				// From the spawn call to the sub-episode's start: the
				// scheduler's part (goroutine, slot, task, config).
				overhead = append(overhead, float64(tr.StartedAt.Sub(spawned[sa.Step]))/float64(time.Millisecond))
			}
		}
		if subs != n*width || subEnds["finished"] != n*width {
			b.Fatalf("%d sub-agents, ends %v", subs, subEnds)
		}
		slices.Sort(overhead)
		q := func(p float64) float64 { return overhead[int(p*float64(len(overhead)-1))] }

		// The baseline: the same sub-tasks as plain episodes.
		var flat []any
		for i := range n {
			for j, p := range prompts {
				t := task(fmt.Sprintf("f%d-%d", i, j))
				t["prompt"] = p
				flat = append(flat, t)
			}
		}
		start = time.Now()
		fid := s.submit(rolloutBody(sub, 1, flat...))
		fst := s.waitState(fid, 10*time.Minute, func(st status) bool { return st.State == "done" })
		flatWall := time.Since(start)
		if fst.EpisodesDone != n*width {
			b.Fatalf("baseline %+v", fst)
		}
		b.ReportMetric(float64(n), "orchestrators")
		b.ReportMetric(float64(subs), "subagents")
		b.ReportMetric(q(0.5), "overhead-p50-ms")
		b.ReportMetric(q(0.99), "overhead-p99-ms")
		b.ReportMetric(orchWall.Seconds(), "orchestrators-wall-s")
		b.ReportMetric(flatWall.Seconds(), "baseline-flat-wall-s")
		b.ReportMetric(float64(peak.Load())/1024, "peak-rss-MiB")
		b.ReportMetric(float64(hwmKB())/1024, "vmhwm-MiB")
	}
}

// rssKB and hwmKB read this process's VmRSS and VmHWM (kB).
func rssKB() int64 { return procStatus("VmRSS:") }
func hwmKB() int64 { return procStatus("VmHWM:") }

func procStatus(field string) int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, field); ok {
			v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return v
		}
	}
	return 0
}
