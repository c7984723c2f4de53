package runtime

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/openai"
	"github.com/rollbox/rollbox/internal/cpugate"
	"github.com/rollbox/rollbox/internal/fakepolicy"
)

// The policy call made on the episode's goroutine ("direct", as before
// a2af1f9) and on a goroutine of its own (callApart, since), side by side:
// one call of the bench's kind (a 19-message conversation, bash then
// finish) to the fake policy, in this process. The call apart costs a
// goroutine, a channel and its stack's growth each time; the bench's
// figures put a whole turn at about 1.2 ms of the service's CPU.
func BenchmarkPolicyCall(b *testing.B) {
	srv, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(9)})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	p, err := openai.New(openai.Config{BaseURL: srv.URL(), Model: "fake-model"})
	if err != nil {
		b.Fatal(err)
	}
	req := agent.Request{EpisodeID: "e", TaskID: "t", Turn: 9,
		Tools: []agent.ToolSchema{{Name: "bash", Description: "Run a command.", Parameters: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}`)},
			{Name: "finish", Description: "Finish.", Parameters: json.RawMessage(`{"type":"object","properties":{"answer":{"type":"string"}}}`)}}}
	req.Messages = append(req.Messages, agent.Message{Role: agent.RoleSystem, Content: "You are an agent."}, agent.Message{Role: agent.RoleUser, Content: "Run true until told to finish."})
	for i := range 9 {
		id := "call_" + string(rune('a'+i))
		req.Messages = append(req.Messages,
			agent.Message{Role: agent.RoleAssistant, ToolCalls: []agent.ToolCall{{ID: id, Name: "bash", Arguments: `{"command":"true"}`}}},
			agent.Message{Role: agent.RoleTool, ToolCallID: id, Name: "bash", Content: "exit code 0"})
	}
	ctx := context.Background()
	for _, c := range []struct {
		name string
		call func(context.Context, agent.Policy, agent.Request) (agent.Turn, error)
	}{
		{"direct", func(ctx context.Context, p agent.Policy, req agent.Request) (agent.Turn, error) {
			return p.Next(ctx, req)
		}},
		{"apart", func(ctx context.Context, p agent.Policy, req agent.Request) (agent.Turn, error) {
			turn, _, err := callApart(ctx, p, req, nil)
			return turn, err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				if _, err := c.call(ctx, p, req); err != nil {
					b.Fatal(err)
				}
			}
			// CPU, not wall time: the host may be loaded.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is this process's user+system CPU time so far, in ns.
func processCPU() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

type nextFunc func(context.Context, agent.Request) (agent.Turn, error)

func (f nextFunc) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	return f(ctx, req)
}

// A policy call that waits for its turn at the CPU gate says how long
// (gatedPolicy takes it out of rollbox_policy_duration_seconds: the wait
// is the service's, not the policy's).
func TestAPolicyCallSaysHowLongItWaitedForACPUTurn(t *testing.T) {
	ctx := context.Background()
	gate := cpugate.New(1)
	other := gate.Hold()
	other.Enter(ctx)
	const held = 200 * time.Millisecond
	go func() { time.Sleep(held); other.Leave() }()
	_, waited, err := callApart(ctx, nextFunc(func(context.Context, agent.Request) (agent.Turn, error) {
		return agent.Turn{}, nil
	}), agent.Request{}, gate)
	if err != nil {
		t.Fatal(err)
	}
	if waited < held*3/4 {
		t.Errorf("the call waited %v for its turn, behind a holder of %v: want about that", waited, held)
	}
	_, waited, _ = callApart(ctx, nextFunc(func(context.Context, agent.Request) (agent.Turn, error) {
		return agent.Turn{}, nil
	}), agent.Request{}, gate)
	if waited != 0 {
		t.Errorf("with the gate free the call waited %v", waited)
	}
}
