package agent_test

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// timedSandbox measures the time spent inside the sandbox.
type timedSandbox struct {
	sandbox.Sandbox
	mu    sync.Mutex
	spent time.Duration
}

func (s *timedSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Result, error) {
	start := time.Now()
	res, err := s.Sandbox.Exec(ctx, req)
	s.mu.Lock()
	s.spent += time.Since(start)
	s.mu.Unlock()
	return res, err
}

func (s *timedSandbox) take() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.spent
	s.spent = 0
	return d
}

// clockPolicy answers at once with bash `true` for n turns, then finish, and
// measures each turn's runtime overhead: the wall time between two policy
// calls, less the time spent in the sandbox.
type clockPolicy struct {
	n         int
	sb        *timedSandbox
	last      time.Time
	overheads []time.Duration
}

func (p *clockPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	now := time.Now()
	if req.Turn > 0 {
		p.overheads = append(p.overheads, now.Sub(p.last)-p.sb.take())
	}
	defer func() { p.last = time.Now() }()
	if req.Turn < p.n {
		return calls("bash", `{"command": "true"}`), nil
	}
	return calls("finish", `{"answer": "done"}`), nil
}

func pct(ds []time.Duration, q float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// BenchmarkTurnOverhead measures what Rollbox adds to each turn of a WASM
// episode (recording the steps, validating arguments, building messages,
// truncation, context accounting), with a zero-latency policy and the
// sandbox's own time subtracted; the baseline is the same `true` called on
// the sandbox directly, the tool's own work.
func BenchmarkTurnOverhead(b *testing.B) {
	factory := wasmtest.Factory(b)
	task := loadTask(b, `{"id": "overhead", "prompt": "run true", "sandbox": {"backend": "wasm"}, "tools": ["bash", "finish"],
		"reward": {"type": "exact", "answer": "done"}, "limits": {"max_turns": 200}}`)
	b.Run("episode-turn", func(b *testing.B) {
		var all []time.Duration
		dir := b.TempDir()
		for i := 0; b.Loop(); i++ {
			p := &clockPolicy{n: 50}
			_, err := agent.Run(context.Background(), agent.Config{Task: task, EpisodeID: "e" + strconv.Itoa(i), Dir: dir, Backend: "wasm", Policy: p,
				NewSandbox: func(ctx context.Context, be string, spec sandbox.Spec) (sandbox.Sandbox, error) {
					sb, err := factory(ctx, be, spec)
					p.sb = &timedSandbox{Sandbox: sb}
					return p.sb, err
				}})
			if err != nil {
				b.Fatal(err)
			}
			all = append(all, p.overheads...)
		}
		b.ReportMetric(float64(pct(all, 0.5).Microseconds()), "overhead-p50-µs/turn")
		b.ReportMetric(float64(pct(all, 0.99).Microseconds()), "overhead-p99-µs/turn")
	})
	b.Run("baseline-exec-true", func(b *testing.B) {
		sb, err := factory(context.Background(), "wasm", sandbox.Spec{})
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Close()
		var all []time.Duration
		for b.Loop() {
			start := time.Now()
			if _, err := sb.Exec(context.Background(), sandbox.ExecRequest{Shell: "true"}); err != nil {
				b.Fatal(err)
			}
			all = append(all, time.Since(start))
		}
		b.ReportMetric(float64(pct(all, 0.5).Microseconds()), "exec-p50-µs")
		b.ReportMetric(float64(pct(all, 0.99).Microseconds()), "exec-p99-µs")
	})
}
