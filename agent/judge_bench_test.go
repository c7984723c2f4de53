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
// with its tests reward alone, and composed with a two-judge,
// three-rubric judge reward through fake judges answering at once
// (0ms) or after 200 ms (200ms), each episode's answer new (no cache
// hit), and the same episode judged again (cached: every answer from the
// cache). Each iteration runs the four variants one after the other, so
// they share the machine's load as it changes (the machine is shared):
// one op is four episodes. Reported per variant: the median wall time of
// an episode (<variant>-p50-ms), the mean time of the judging alone
// (<variant>-judge-ms), and the ratio of the medians to tests alone
// (<variant>-x).
//
//	go test ./agent -run '^$' -bench JudgeOverhead -benchtime 20x
func BenchmarkJudgeOverhead(b *testing.B) {
	type variant struct {
		name    string
		latency time.Duration // judges' answer delay; -1: no judge
		same    bool
		task    *agent.Task
		pool    *judge.Pool
		wall    []float64
		judgeMS []float64
	}
	vs := []*variant{{name: "tests", latency: -1}, {name: "0ms"}, {name: "200ms", latency: 200 * time.Millisecond}, {name: "cached", same: true}}
	for _, v := range vs {
		if v.latency < 0 {
			v.task = loadTask(b, calcTask)
			continue
		}
		var urls []string
		for _, m := range []string{"judge-a", "judge-b"} {
			s, err := fakejudge.Start(fakejudge.Config{Model: m, Behavior: fakejudge.Slow(v.latency, labelJudge(0.8))})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			urls = append(urls, s.URL())
		}
		v.task = loadTask(b, judgedCalcTask(urls[0], urls[1], ""))
		v.pool = judge.NewPool(judge.Options{})
	}
	factory := wasmtest.Factory(b)
	b.ResetTimer()
	for i := range b.N {
		for _, v := range vs {
			answer := fmt.Sprintf("fixed add, run %d", i)
			if v.same {
				answer = "fixed add"
			}
			turns := append(append([]agent.Turn{}, honestFix[:3]...), calls("finish", fmt.Sprintf(`{"answer": %q}`, answer)))
			start := time.Now()
			tr, err := agent.Run(b.Context(), agent.Config{Task: v.task, EpisodeID: fmt.Sprintf("%s-%d", v.name, i), Dir: b.TempDir(), Backend: "wasm",
				NewSandbox: factory, Policy: &turnsPolicy{turns: turns}, Judges: v.pool})
			if err != nil {
				b.Fatal(err)
			}
			v.wall = append(v.wall, float64(time.Since(start))/1e6)
			if tr.Reward == nil || tr.Reward.Total == nil {
				b.Fatalf("%s: unscored: %+v", v.name, tr.Reward)
			}
			if j := tr.Reward.Judge; j != nil {
				v.judgeMS = append(v.judgeMS, j.DurationMS)
			}
		}
	}
	b.StopTimer()
	base := median(vs[0].wall)
	for _, v := range vs {
		p50 := median(v.wall)
		b.ReportMetric(p50, v.name+"-p50-ms")
		if len(v.judgeMS) > 0 {
			b.ReportMetric(meanOf(v.judgeMS), v.name+"-judge-ms")
			b.ReportMetric(p50/base, v.name+"-x")
		}
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func meanOf(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
