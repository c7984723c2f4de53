package containerd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
)

type policyFunc func(context.Context, agent.Request) (agent.Turn, error)

func (f policyFunc) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	return f(ctx, req)
}

// groupTask sets a workspace of 100 MB in 2,000 files up (forkFiles), as
// its prefix when prefixed; each episode then counts the files and
// finishes with the count (reward 1 when all 2,000 are there).
func groupTask(b *testing.B, prefixed bool) *agent.Task {
	setup, _ := jsonString(forkFiles)
	prefix := ""
	if prefixed {
		prefix = `, "prefix": {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": ` + setup + `}}]}]}`
	}
	line := `{"id": "grp", "prompt": "count the files", "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "2000"},
	 "sandbox": {"image": "base", "limits": {"disk_mb": 200, "memory_mb": 1024, "exec_timeout_s": 600}}, "limits": {"max_turns": 5}` + prefix + `}`
	tasks, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(line), " ")), "", nil)
	if err != nil {
		b.Fatal(err)
	}
	return tasks[0]
}

func jsonString(s string) (string, error) {
	b, err := json.Marshal(s)
	return string(b), err
}

// groupPolicy: in a fresh episode (no prefix) the setup first; then count
// the files, then finish with the count.
func groupPolicy(fresh bool) agent.Policy {
	return policyFunc(func(_ context.Context, req agent.Request) (agent.Turn, error) {
		last := req.Messages[len(req.Messages)-1]
		switch {
		case last.Role == agent.RoleTool && strings.Contains(last.Content, "files="):
			_, n, _ := strings.Cut(last.Content, "files=")
			return agent.Turn{ToolCalls: []agent.ToolCall{{ID: "f", Name: "finish", Arguments: fmt.Sprintf(`{"answer": %q}`, strings.TrimSpace(n))}}}, nil
		case fresh && req.Turn == 0:
			setup, _ := jsonString(forkFiles)
			return agent.Turn{ToolCalls: []agent.ToolCall{{ID: "s", Name: "bash", Arguments: `{"command": ` + setup + `}`}}}, nil
		}
		return agent.Turn{ToolCalls: []agent.ToolCall{{ID: "c", Name: "bash", Arguments: `{"command": "echo files=$(find /work -type f | wc -l)"}`}}}, nil
	})
}

// BenchmarkGroupOf8: a GRPO group of 8 episodes whose expensive setup
// (100 MB in 2,000 files written in the workspace) is the task's prefix,
// run once and forked 8 ways, beside the same group as 8 fresh episodes
// that each run the setup themselves; on containerd and on Docker, the
// episodes 8 at once (rollbox run --group 8 --concurrency 8). Reports the
// group's wall time; every episode must score 1.
//
//	go test ./sandbox/containerd -run '^$' -bench GroupOf8 -benchtime 2x
func BenchmarkGroupOf8(b *testing.B) {
	for _, name := range []string{"containerd", "docker"} {
		for _, mode := range []string{"prefix-fork", "fresh"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				var be sandbox.Backend
				if name == "containerd" {
					be = need(b)
				} else {
					be = dockerBackend(b)
				}
				task := groupTask(b, mode == "prefix-fork")
				var total time.Duration
				for b.Loop() {
					start := time.Now()
					sum, err := runtime.RunBatch(context.Background(), runtime.BatchConfig{
						Tasks: []*agent.Task{task}, OutDir: b.TempDir(), Backend: name, Group: 8, Concurrency: 8,
						NewSandbox: func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
							return be.Create(ctx, spec)
						},
						Policy: groupPolicy(mode == "fresh"), PolicyInfo: trajectory.Policy{Kind: "bench"}})
					if err != nil {
						b.Fatal(err)
					}
					if sum.Scored != 8 || sum.RewardMean == nil || *sum.RewardMean != 1 {
						b.Fatalf("the group: %d scored, mean %v, ends %v", sum.Scored, sum.RewardMean, sum.Ends)
					}
					total += time.Since(start)
				}
				b.ReportMetric(total.Seconds()/float64(b.N), "group-s")
			})
		}
	}
}
