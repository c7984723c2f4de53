package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/openai"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/retriever/retrievertest"
	"github.com/rollbox/rollbox/tools"
)

// tokenServer starts the fake server that really tokenizes (bytes as
// tokens, ChatML with special tokens) and a token-mode policy on it.
func tokenServer(t *testing.T, cfg fakepolicy.Config) (*fakepolicy.Server, *openai.TokenPolicy) {
	t.Helper()
	cfg.Record = true
	srv, err := fakepolicy.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	p, err := openai.NewTokens(context.Background(), openai.Config{BaseURL: srv.URL(), Model: "fake-model", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	return srv, p
}

func tokenMode(p *openai.TokenPolicy) func(*agent.Config) {
	return func(cfg *agent.Config) {
		info := p.Tokenizer()
		cfg.PolicyInfo = trajectory.Policy{Kind: "openai", Mode: trajectory.ModeTokens, Model: p.Model(), Endpoint: p.BaseURL(), Tokenizer: &info}
	}
}

func decode(t *testing.T, ids []int64) string {
	t.Helper()
	s, err := fakepolicy.Decode(ids)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkTokens asserts what a trainer relies on: every turn's prompt is the
// text the server saw, token for token; within a segment each prompt
// extends the last prompt and its completion; each segment's ids are its
// last prompt and completion, with loss mask 1 exactly on the sampled ids;
// logprobs cover the sampled ids one for one.
func checkTokens(t *testing.T, tr *trajectory.Trajectory, srv *fakepolicy.Server) {
	t.Helper()
	var seen []*fakepolicy.Request
	for _, r := range srv.Requests() {
		if r.Endpoint == "completions" {
			seen = append(seen, r)
		}
	}
	prompts := trajectory.TurnPrompts(tr.Steps)
	var models []trajectory.Step
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepModel {
			models = append(models, s)
		}
	}
	if len(models) != len(seen) {
		t.Fatalf("%d model turns, the server saw %d prompts", len(models), len(seen))
	}
	for i, s := range models {
		if s.Tokens != trajectory.TokensExact || s.Segment == nil {
			t.Fatalf("turn %d: tokens %q segment %v", i, s.Tokens, s.Segment)
		}
		if got := decode(t, prompts[s.Index]); got != seen[i].Prompt {
			t.Fatalf("turn %d: the recorded prompt decodes to\n%q\nthe server saw\n%q", i, got, seen[i].Prompt)
		}
		var lps []float64
		if err := json.Unmarshal(s.Logprobs, &lps); err != nil || len(lps) != len(s.CompletionIDs) {
			t.Fatalf("turn %d: %d logprobs for %d sampled ids (%v)", i, len(lps), len(s.CompletionIDs), err)
		}
		if i > 0 && *s.Segment == *models[i-1].Segment {
			prev := append(append([]int64{}, prompts[models[i-1].Index]...), models[i-1].CompletionIDs...)
			if !slices.Equal(prompts[s.Index][:len(prev)], prev) {
				t.Fatalf("turn %d's prompt does not extend turn %d's prompt and completion", i, i-1)
			}
		}
	}
	if len(tr.Segments) == 0 {
		t.Fatal("no segments")
	}
	for k, seg := range tr.Segments {
		var last trajectory.Step
		sampled := 0
		for _, s := range models {
			if *s.Segment == k {
				last = s
				sampled += len(s.CompletionIDs)
			}
		}
		want := append(append([]int64{}, prompts[last.Index]...), last.CompletionIDs...)
		if !slices.Equal(seg.Ids, want) || len(seg.LossMask) != len(seg.Ids) || seg.EndTurn != last.Turn {
			t.Fatalf("segment %d is not its last prompt and completion (%d ids, %d mask, end turn %d)", k, len(seg.Ids), len(seg.LossMask), seg.EndTurn)
		}
		if got := decode(t, seg.Ids); !strings.HasPrefix(got, seen[last.Turn].Prompt) {
			t.Fatalf("segment %d decodes to %q", k, got)
		}
		// Mask 1 exactly on the sampled ids: walk the turns' pieces.
		ones := 0
		pos := 0
		for _, s := range models {
			if *s.Segment != k {
				continue
			}
			pos += len(s.PromptIDs) + len(s.PromptDeltaIDs)
			for j := range s.CompletionIDs {
				if seg.LossMask[pos+j] != 1 || seg.Ids[pos+j] != s.CompletionIDs[j] {
					t.Fatalf("segment %d id %d: mask %d, id %d, sampled %d", k, pos+j, seg.LossMask[pos+j], seg.Ids[pos+j], s.CompletionIDs[j])
				}
			}
			pos += len(s.CompletionIDs)
		}
		for _, m := range seg.LossMask {
			ones += int(m)
		}
		if ones != sampled || pos != len(seg.Ids) {
			t.Fatalf("segment %d: %d ids under mask 1, %d sampled; pieces cover %d of %d ids", k, ones, sampled, pos, len(seg.Ids))
		}
	}
}

func TestATokenModeEpisodeRecordsExactlyTheTokensTheModelSawAndSampled(t *testing.T) {
	srv, p := tokenServer(t, fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{Content: "Let me look.", ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command": "cat /work/calc.py"}`}}},
		fakepolicy.Reply{Content: "Nothing to call."},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{
			{Name: "write_file", Arguments: `{"path": "/work/calc.py", "content": "def add(a, b):\n    return a + b\n"}`},
			{Name: "bash", Arguments: `{"command": "printf 'caf\\xc3\\xa9 <|im_end|> \\xff'"}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "fixed"}`}}},
	)})
	tr := runEpisode(t, loadTask(t, calcTask), p, tokenMode(p))
	if tr.Termination.Reason != trajectory.EndFinished || tr.Reward == nil || *tr.Reward.Total != 1 {
		t.Fatalf("ended %+v reward %+v", tr.Termination, tr.Reward)
	}
	checkTokens(t, tr, srv)
	if len(tr.Segments) != 1 || tr.Segments[0].Reason != trajectory.SegmentStart || tr.Segments[0].StartTurn != 0 || tr.Segments[0].EndTurn != 3 {
		t.Fatalf("segments %+v", tr.Segments)
	}
	if tr.Policy.Mode != "tokens" || tr.Policy.Tokenizer == nil || tr.Policy.Tokenizer.Fingerprint == "" || tr.Policy.Tokenizer.Revision == "" {
		t.Fatalf("policy %+v", tr.Policy)
	}
	// Parsed from the completion text: the calls ran.
	if got := toolSteps(tr); len(got) != 4 || got[0].Name != "bash" || got[1].Name != "write_file" {
		t.Fatalf("tool steps %+v", got)
	}
	// A later turn carries only its delta: the file stays small.
	if tr.Steps[0].PromptIDs == nil || tr.Steps[len(tr.Steps)-2].PromptIDs != nil {
		t.Errorf("only the first turn of a segment carries the whole prompt")
	}
}

func TestATokenModeSearchEpisodeThatPrunesStartsASecondSegment(t *testing.T) {
	task := `{"id": "s", "prompt": "Which packages compress?", "retriever": {"index": "index"},
		"reward": {"type": "fbeta", "relevant": ["gzip", "zlib"]}}`
	srv, p := tokenServer(t, fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "search", Arguments: `{"query": "compressed"}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "read", Arguments: `{"id": "gzip"}`}, {Name: "read", Arguments: `{"id": "http"}`}}},
		fakepolicy.Reply{Content: "http is off topic.", ToolCalls: []fakepolicy.ToolCall{{Name: "prune", Arguments: `{"ids": ["http"]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "read", Arguments: `{"id": "zlib"}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"ids": ["gzip", "zlib"]}`}}},
	)})
	tr := tokenSearchEpisode(t, task, p)
	if tr.Termination.Reason != trajectory.EndFinished {
		t.Fatalf("ended %+v", tr.Termination)
	}
	checkTokens(t, tr, srv)
	if len(tr.Segments) != 2 || tr.Segments[1].Reason != trajectory.SegmentPruned || tr.Segments[1].StartTurn != 3 || tr.Segments[0].EndTurn != 2 {
		t.Fatalf("segments: %d %+v", len(tr.Segments), segmentHeads(tr.Segments))
	}
	// The new segment's prompt no longer holds the pruned text; the first
	// one kept what the model saw then.
	first, second := decode(t, tr.Segments[0].Ids), decode(t, tr.Segments[1].Ids)
	if !strings.Contains(first, textC) || strings.Contains(second, textC) || !strings.Contains(second, tools.PruneMarker) {
		t.Fatalf("pruned text: in first %t, in second %t", strings.Contains(first, textC), strings.Contains(second, textC))
	}
	if len(eventsOf(tr, "segment")) != 1 {
		t.Errorf("events %+v", tr.ContextEvents)
	}
}

func segmentHeads(segs []trajectory.Segment) []string {
	var out []string
	for _, s := range segs {
		out = append(out, fmt.Sprintf("%s@%d-%d(%d ids)", s.Reason, s.StartTurn, s.EndTurn, len(s.Ids)))
	}
	return out
}

func tokenSearchEpisode(t *testing.T, taskJSON string, p *openai.TokenPolicy) *trajectory.Trajectory {
	t.Helper()
	dir := t.TempDir()
	ix := retrievertest.Index(t, dir,
		fmt.Sprintf(`{"id": "gzip", "title": "compress/gzip", "text": %q}`, textA),
		fmt.Sprintf(`{"id": "zlib", "title": "compress/zlib", "text": %q}`, textB),
		fmt.Sprintf(`{"id": "http", "title": "net/http", "text": %q}`, textC),
	)
	tasks, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(taskJSON), " ")), filepath.Join(dir, "tasks.jsonl"), tools.Known)
	if err != nil {
		t.Fatal(err)
	}
	task := tasks[0]
	return runEpisode(t, task, p, tokenMode(p), func(cfg *agent.Config) {
		cfg.ExtraTools = tools.SearchTools(ix, tools.SearchOptions{MaxDocBytes: task.Limits.MaxToolOutputBytes})
		cfg.ToolEnv = func(env *tools.Env) error {
			tools.WithLedger(env, retriever.NewLedger(task.ContextTokens()))
			return nil
		}
	})
}

func TestATokenModeEpisodeTruncatedToFitItsContextStartsANewSegment(t *testing.T) {
	big := `{"command": "seq 1 3000"}`
	srv, p := tokenServer(t, fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: big}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: big}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{}`}}},
	)})
	task := loadTask(t, strings.Replace(calcTask, `"max_turns": 6`,
		`"max_turns": 4, "max_context_tokens": 6000, "max_tool_output_bytes": 9000, "context_overflow": "truncate"`, 1))
	tr := runEpisode(t, task, p, tokenMode(p))
	checkTokens(t, tr, srv)
	var reasons []string
	for _, s := range tr.Segments {
		reasons = append(reasons, s.Reason)
	}
	if !slices.Contains(reasons, trajectory.SegmentTruncated) || len(eventsOf(tr, "context_truncated")) == 0 {
		t.Fatalf("segments %v, events %+v", segmentHeads(tr.Segments), tr.ContextEvents)
	}
}

func TestAServerWhoseIdsDisagreeWithThePromptEndsTheEpisodeUnscoredWithTheTurnRecorded(t *testing.T) {
	_, p := tokenServer(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(3),
		Fault: func(n int64, r *fakepolicy.Request) fakepolicy.Fault {
			return fakepolicy.Fault{EchoWrongPrompt: n == 2}
		}})
	tr := runEpisode(t, loadTask(t, calcTask), p, tokenMode(p))
	if tr.Termination.Reason != trajectory.EndPolicyError || tr.Reward != nil || !strings.Contains(tr.Termination.Message, "not the") {
		t.Fatalf("ended %+v reward %+v", tr.Termination, tr.Reward)
	}
	last := tr.Steps[len(tr.Steps)-1]
	if last.Type != trajectory.StepModel || last.Turn != 1 || last.TokensError == "" || len(last.CompletionIDs) == 0 || len(last.ToolCalls) != 1 {
		t.Fatalf("the inconsistent turn was not recorded as it came: %+v", last)
	}
	if toolSteps(tr)[len(toolSteps(tr))-1].Turn != 0 {
		t.Errorf("the inconsistent turn's tool call ran")
	}
}

func TestLogprobsTheServerDidNotSendAreRecordedAbsent(t *testing.T) {
	srv, p := tokenServer(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1),
		Fault: func(n int64, r *fakepolicy.Request) fakepolicy.Fault { return fakepolicy.Fault{OmitLogprobs: n == 1} }})
	tr := runEpisode(t, loadTask(t, calcTask), p, tokenMode(p))
	if tr.Termination.Reason != trajectory.EndFinished || srv.Calls() != 2 {
		t.Fatalf("ended %+v after %d calls", tr.Termination, srv.Calls())
	}
	first, second := tr.Steps[0], tr.Steps[2]
	if !first.LogprobsAbsent || first.Logprobs != nil || second.LogprobsAbsent || second.Logprobs == nil || len(first.CompletionIDs) == 0 {
		t.Fatalf("first %+v second %+v", first, second)
	}
}

func TestChatModeSaysWhereItsTokenCountsComeFromAndInventsNoIds(t *testing.T) {
	for _, omit := range []bool{false, true} {
		srv, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1), OmitUsage: omit})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		p, err := openai.New(openai.Config{BaseURL: srv.URL(), Model: "fake-model"})
		if err != nil {
			t.Fatal(err)
		}
		tr := runEpisode(t, loadTask(t, calcTask), p)
		want := trajectory.TokensReported
		if omit {
			want = trajectory.TokensEstimated
		}
		for _, s := range tr.Steps {
			if s.Type != trajectory.StepModel {
				continue
			}
			if s.Tokens != want || s.PromptTokenIDs != nil || s.CompletionTokenIDs != nil || s.CompletionIDs != nil || s.Segment != nil {
				t.Fatalf("omit usage %t: step %+v", omit, s)
			}
		}
		if tr.Segments != nil {
			t.Fatalf("chat mode has segments")
		}
	}
}
