package trajectory

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// An episode's record of the bench's kind (10 turns: a model step with the
// policy's raw answer and a bash `true` step each), journaled and ended:
// the CPU the record costs an episode.
func BenchmarkWriterEpisode(b *testing.B) {
	raw := []byte(`{"id":"chatcmpl-1","object":"chat.completion","model":"fake-model","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"true\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":120,"completion_tokens":12,"total_tokens":132}}`)
	dir := b.TempDir()
	exit := 0
	ok := true
	b.ReportAllocs()
	cpu0 := cpuNow()
	for i := 0; b.Loop(); i++ {
		w, err := NewWriter(dir, &Trajectory{EpisodeID: "ep" + strings.Repeat("x", i%2) + string(rune('a'+i%26)), TaskID: "t"})
		if err != nil {
			b.Fatal(err)
		}
		for turn := range 10 {
			w.Step(Step{Type: StepModel, Turn: turn, StartedAt: time.Now(), DurationMS: 200, FinishReason: "tool_calls", Model: "fake-model",
				ToolCalls: []ToolCall{{ID: "call_1", Name: "bash", Arguments: `{"command":"true"}`}}, Usage: &Usage{PromptTokens: 120, CompletionTokens: 12, TotalTokens: 132},
				Raw: raw, Attempts: 1, Tokens: TokensReported})
			w.Step(Step{Type: StepTool, Turn: turn, StartedAt: time.Now(), DurationMS: 0.3, CallID: "call_1", Name: "bash",
				Arguments: []byte(`{"command":"true"}`), OK: &ok, ExitCode: &exit, Output: "exit code 0", Stdout: NewBytes(nil), Stderr: NewBytes(nil)})
		}
		w.Trajectory() // the monitors and the verifier read the record whole
		if err := w.End(&Termination{Reason: EndFinished}, nil, Stats{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuNow()-cpu0)/float64(b.N), "cpu-ns/op") // the host may be loaded: CPU, not wall time
}

func cpuNow() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
