package agent_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/internal/fakejudge"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// BenchmarkJudgeOverhead measures what a judge reward adds to an episode:
// the same WASM coding episode (run the tests, fix, run them, finish)
// with its tests reward alone, then composed with a two-judge,
// three-rubric judge reward through fake judges answering at once or
// after 200 ms, each episode's answer new (no cache hit), and the same
// episode judged again (every answer from the cache). Side by side in one
// run: compare ns/op; judge-ms/op is the judging alone.
//
//	go test ./agent -run '^$' -bench JudgeOverhead -benchtime 20x
func BenchmarkJudgeOverhead(b *testing.B) {
	for _, bc := range []struct {
		name    string
		judged  bool
		latency time.Duration
		same    bool
	}{
		{"tests", false, 0, false},
		{"tests+judge/0ms", true, 0, false},
		{"tests+judge/200ms", true, 200 * time.Millisecond, false},
		{"tests+judge/cached", true, 0, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			task := calcTask
			var pool *judge.Pool
			if bc.judged {
				var urls []string
				for _, m := range []string{"judge-a", "judge-b"} {
					s, err := fakejudge.Start(fakejudge.Config{Model: m, Behavior: fakejudge.Slow(bc.latency, labelJudge(0.8))})
					if err != nil {
						b.Fatal(err)
					}
					defer s.Close()
					urls = append(urls, s.URL())
				}
				task = judgedCalcTask(urls[0], urls[1], "")
				pool = judge.NewPool(judge.Options{})
			}
			tk := loadTask(b, task)
			factory := wasmtest.Factory(b)
			var judgeMS, wall []float64
			b.ResetTimer()
			for i := range b.N {
				answer := fmt.Sprintf("fixed add, run %d", i)
				if bc.same {
					answer = "fixed add"
				}
				turns := append(append([]agent.Turn{}, honestFix[:3]...), calls("finish", fmt.Sprintf(`{"answer": %q}`, answer)))
				start := time.Now()
				tr, err := agent.Run(b.Context(), agent.Config{Task: tk, EpisodeID: fmt.Sprintf("e%d", i), Dir: b.TempDir(), Backend: "wasm",
					NewSandbox: factory, Policy: &turnsPolicy{turns: turns}, Judges: pool})
				if err != nil {
					b.Fatal(err)
				}
				wall = append(wall, float64(time.Since(start))/1e6)
				if tr.Reward == nil || tr.Reward.Total == nil {
					b.Fatalf("unscored: %+v", tr.Reward)
				}
				if j := tr.Reward.Judge; j != nil {
					judgeMS = append(judgeMS, j.DurationMS)
				}
			}
			b.StopTimer()
			if len(judgeMS) > 0 {
				b.ReportMetric(meanOf(judgeMS), "judge-ms/op")
			}
			sort.Float64s(wall)
			b.ReportMetric(wall[len(wall)/2], "p50-ms/op")
		})
	}
}

func meanOf(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
