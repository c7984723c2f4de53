package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/openai"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// timedPolicy measures each policy call.
type timedPolicy struct {
	agent.Policy
	mu    sync.Mutex
	calls []time.Duration
}

func (p *timedPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	start := time.Now()
	t, err := p.Policy.Next(ctx, req)
	p.mu.Lock()
	p.calls = append(p.calls, time.Since(start))
	p.mu.Unlock()
	return t, err
}

// BenchmarkTokenMode compares the token mode with the chat mode on the same
// fake server in the same run: the size of an episode's record and the
// wall time of one policy call (the token mode adds a /tokenize call a turn
// and the session's checks; the server answers at once, so this is the
// whole of the difference). Each episode is 20 turns of a bash command
// printing ~1 KB, then finish. chat+ids asks the chat endpoint for
// logprobs and token ids too (what a trainer had to do before).
func BenchmarkTokenMode(b *testing.B) {
	factory := wasmtest.Factory(b)
	task := loadTask(b, `{"id": "bench", "prompt": "print the file", "sandbox": {"backend": "wasm"}, "tools": ["bash", "finish"],
		"files": {"/work/f.txt": "`+string(make64(1000))+`"},
		"reward": {"type": "exact", "answer": "done"}, "limits": {"max_turns": 40, "max_context_tokens": 200000}}`)
	srv, err := fakepolicy.Start(fakepolicy.Config{Responder: func(r *fakepolicy.Request) fakepolicy.Reply {
		if r.AssistantTurns() < 20 {
			return fakepolicy.Reply{Content: "Reading it again.", ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command": "cat /work/f.txt"}`}}}
		}
		return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}}
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	chat, err := openai.New(openai.Config{BaseURL: srv.URL(), Model: "fake-model"})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := openai.NewTokens(context.Background(), openai.Config{BaseURL: srv.URL(), Model: "fake-model"})
	if err != nil {
		b.Fatal(err)
	}
	info := tok.Tokenizer()
	for _, mode := range []struct {
		name     string
		p        agent.Policy
		info     trajectory.Policy
		sampling agent.Sampling
	}{
		{"chat", chat, trajectory.Policy{Kind: "openai"}, agent.Sampling{}},
		{"chat+ids", chat, trajectory.Policy{Kind: "openai"}, agent.Sampling{Logprobs: true, Extra: map[string]any{"return_tokens_as_token_ids": true, "return_token_ids": true}}},
		{"tokens", tok, trajectory.Policy{Kind: "openai", Mode: trajectory.ModeTokens, Tokenizer: &info}, agent.Sampling{}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			dir := b.TempDir()
			var calls []time.Duration
			var size int64
			n := 0
			for i := 0; b.Loop(); i++ {
				p := &timedPolicy{Policy: mode.p}
				id := "e" + strconv.Itoa(i)
				tr, err := agent.Run(context.Background(), agent.Config{Task: task, EpisodeID: id, Dir: dir, Backend: "wasm", Policy: p,
					PolicyInfo: mode.info, Sampling: mode.sampling, NewSandbox: factory})
				if err != nil || tr.Termination.Reason != trajectory.EndFinished {
					b.Fatalf("%v %+v", err, tr.Termination)
				}
				st, err := os.Stat(filepath.Join(dir, id+".json"))
				if err != nil {
					b.Fatal(err)
				}
				size += st.Size()
				n++
				calls = append(calls, p.calls...)
			}
			b.ReportMetric(float64(size)/float64(n)/1024, "record-KiB/episode")
			b.ReportMetric(float64(pct(calls, 0.5).Microseconds()), "policy-call-p50-µs")
			b.ReportMetric(float64(pct(calls, 0.99).Microseconds()), "policy-call-p99-µs")
		})
	}
}

func make64(n int) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 "
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[(i*7+i/13)%len(alphabet)]
	}
	return b
}
