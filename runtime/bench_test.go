package runtime_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// BenchmarkRollout runs one rollout of $ROLLBOX_BENCH_EPISODES (default
// 200) WASM episodes × 10 turns (9 bash calls of `true`, then finish)
// against the fake policy with $ROLLBOX_BENCH_LATENCY (default 200ms), in
// this process, over HTTP, and reports turns/s and the runtime's overhead
// per turn. `rollbox bench` runs the same with the service in its own
// process (and measures its peak RSS).
func BenchmarkRollout(b *testing.B) {
	n := envInt("ROLLBOX_BENCH_EPISODES", 200)
	latency, _ := time.ParseDuration(os.Getenv("ROLLBOX_BENCH_LATENCY"))
	if latency == 0 {
		latency = 200 * time.Millisecond
	}
	const turns = 10
	p := startPolicy(b, fakepolicy.Config{Latency: latency, Responder: fakepolicy.BashThenFinish(turns - 1)})
	defer p.Close()
	group := 10
	if n%group != 0 {
		group = 1
	}
	for b.Loop() {
		s := startService(b, "", func(o *runtime.Options) { o.Limits.MaxRunning = n })
		tasks := make([]any, n/group)
		for i := range tasks {
			tk := task(fmt.Sprintf("bench-%d", i))
			tk["limits"] = map[string]any{"max_turns": turns + 1}
			tasks[i] = tk
		}
		start := time.Now()
		id := s.submit(rolloutBody(p, group, tasks...))
		eps := s.episodes(id, "?stream=1")
		wall := time.Since(start)
		if len(eps) != n {
			b.Fatalf("%d of %d episodes", len(eps), n)
		}
		var over []float64
		for _, e := range eps {
			var models []int
			for i, st := range e.Steps {
				if st.Type == "model" {
					models = append(models, i)
				}
			}
			for k, i := range models {
				end := *e.EndedAt
				if k+1 < len(models) {
					end = e.Steps[models[k+1]].StartedAt
				}
				over = append(over, float64(end.Sub(e.Steps[i].StartedAt)-latency)/float64(time.Millisecond))
			}
		}
		pc := percentilesOf(over)
		b.ReportMetric(float64(n*turns)/wall.Seconds(), "turns/s")
		b.ReportMetric(pc[0], "overhead-p50-ms")
		b.ReportMetric(pc[1], "overhead-p99-ms")
		b.ReportMetric(float64(runtime.PeakRSS())/(1<<20), "peak-rss-MiB")
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
