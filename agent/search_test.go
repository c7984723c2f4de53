package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/retriever/retrievertest"
	"github.com/rollbox/rollbox/tools"
)

// turnsPolicy plays fixed turns and keeps every request it was sent.
type turnsPolicy struct {
	mu    sync.Mutex
	turns []agent.Turn
	reqs  []agent.Request
}

func (p *turnsPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqs = append(p.reqs, req)
	if req.Turn >= len(p.turns) {
		return agent.Turn{}, fmt.Errorf("no turn %d", req.Turn)
	}
	return p.turns[req.Turn], nil
}

func calls(cs ...string) agent.Turn {
	var t agent.Turn
	for i := 0; i+1 < len(cs); i += 2 {
		t.ToolCalls = append(t.ToolCalls, agent.ToolCall{ID: fmt.Sprintf("c%d", i/2), Name: cs[i], Arguments: cs[i+1]})
	}
	return t
}

const (
	textA = "Package gzip implements reading and writing of gzip format compressed files."
	textB = "Package zlib implements reading and writing of zlib format compressed data."
	textC = "Package http provides HTTP client and server implementations."
)

func searchEpisode(t *testing.T, taskJSON string, turns ...agent.Turn) (*trajectory.Trajectory, *turnsPolicy) {
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
	if task.IndexPath() != filepath.Join(dir, "index") {
		t.Fatalf("index path = %s", task.IndexPath())
	}
	p := &turnsPolicy{turns: turns}
	tr, err := agent.Run(context.Background(), agent.Config{
		Task: task, EpisodeID: "e1", RolloutID: "r1", GroupID: "g1", Dir: t.TempDir(), Backend: "wasm",
		NewSandbox: wasmFactory(t), // the real backend: search episodes still get a sandbox
		Policy:     p,
		ExtraTools: tools.SearchTools(ix, tools.SearchOptions{MaxDocBytes: task.Limits.MaxToolOutputBytes}),
		ToolEnv: func(env *tools.Env) error {
			tools.WithLedger(env, retriever.NewLedger(task.ContextTokens()))
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr, p
}

func eventsOf(tr *trajectory.Trajectory, kind string) []trajectory.ContextEvent {
	var out []trajectory.ContextEvent
	for _, e := range tr.ContextEvents {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

func TestPrunedDocumentsAreGoneFromTheMessagesThePolicyGetsNext(t *testing.T) {
	task := `{"id": "s", "prompt": "Which packages compress?", "retriever": {"index": "index"},
		"reward": {"type": "fbeta", "relevant": ["gzip", "zlib"], "trajectory_recall_weight": 0.5, "prune_penalty": 0.1}}`
	tr, p := searchEpisode(t, task,
		calls("search", `{"query": "compressed"}`),
		calls("read", `{"id": "gzip"}`, "read", `{"id": "http"}`),
		calls("prune", `{"ids": ["http"]}`),
		calls("finish", `{"ids": ["gzip"]}`),
	)
	if tr.Termination.Reason != trajectory.EndFinished || tr.Sandbox.Backend != "wasm" {
		t.Fatalf("ended %s on %s: %s", tr.Termination.Reason, tr.Sandbox.Backend, tr.Termination.Message)
	}
	if got := strings.Join(tr.Termination.IDs, ","); got != "gzip" {
		t.Errorf("finish ids = %s", got)
	}
	joined := func(ms []agent.Message) string {
		var b strings.Builder
		for _, m := range ms {
			b.WriteString(m.Content + "\n")
		}
		return b.String()
	}
	before, after := joined(p.reqs[2].Messages), joined(p.reqs[3].Messages)
	if !strings.Contains(before, textC) || !strings.Contains(before, "<<doc http>>") {
		t.Fatalf("the read document never reached the policy:\n%s", before)
	}
	if strings.Contains(after, textC) || strings.Contains(after, "<<doc http>>") {
		t.Errorf("the pruned document's text is still in the next messages:\n%s", after)
	}
	if !strings.Contains(after, tools.Pruned("http")) || !strings.Contains(after, textA) {
		t.Errorf("want the placeholder for http and gzip's text kept:\n%s", after)
	}
	// The trajectory keeps what the model saw at the time.
	var readOut string
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepTool && s.Name == "read" && strings.Contains(string(s.Arguments), "http") {
			readOut = s.Output
		}
	}
	if !strings.Contains(readOut, textC) {
		t.Errorf("the trajectory lost the read output: %q", readOut)
	}
	if e := eventsOf(tr, "pruned"); len(e) != 1 || strings.Join(e[0].IDs, ",") != "http" || e[0].Tokens == 0 {
		t.Errorf("pruned events = %+v", e)
	}
	if e := eventsOf(tr, "seen"); len(e) != 3 {
		t.Errorf("seen events = %+v", e)
	}
	// fbeta components: gzip of {gzip, zlib} given (precision 1, recall 1/2),
	// both relevant ids seen in search results, one single-id prune.
	c := tr.Reward.Components
	wantF := 17 * 1 * 0.5 / (16*1 + 0.5)
	if math.Abs(c["fbeta"]-wantF) > 1e-9 || c["precision"] != 1 || c["recall"] != 0.5 || c["trajectory_recall"] != 1 || math.Abs(c["prune_penalty"]+0.1) > 1e-9 {
		t.Errorf("components = %v", c)
	}
	if want := wantF + 0.5 - 0.1; math.Abs(*tr.Reward.Total-want) > 1e-6 {
		t.Errorf("total = %v, want %v", *tr.Reward.Total, want)
	}
	doc, _ := json.Marshal(tr)
	if err := trajectory.Validate(doc); err != nil {
		t.Errorf("the trajectory does not validate: %v", err)
	}
}

func TestAReadOverTheDocumentBudgetIsRefusedAndRecorded(t *testing.T) {
	task := `{"id": "s", "prompt": "Find compression packages.", "retriever": {"index": "index", "context_tokens": 40},
		"reward": {"type": "fbeta", "relevant": ["gzip"]}}`
	tr, p := searchEpisode(t, task,
		calls("read", `{"id": "gzip"}`),
		calls("read", `{"id": "zlib"}`),
		calls("prune", `{"ids": ["gzip"]}`, "read", `{"id": "zlib"}`),
		calls("finish", `{"ids": ["gzip"]}`),
	)
	refused := eventsOf(tr, "read_refused")
	if len(refused) != 1 || refused[0].IDs[0] != "zlib" {
		t.Fatalf("read_refused events = %+v", tr.ContextEvents)
	}
	var refusal trajectory.Step
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepTool && s.Index == refused[0].Step {
			refusal = s
		}
	}
	if refusal.ErrorKind == nil || *refusal.ErrorKind != string(tools.KindBadArguments) || !strings.Contains(refusal.Output, "Prune documents") {
		t.Errorf("refusal step = %+v", refusal)
	}
	last := p.reqs[3].Messages
	if m := last[len(last)-1]; !strings.Contains(m.Content, "<<doc zlib>>") {
		t.Errorf("after pruning, zlib was not read: %q", m.Content)
	}
	if tr.Reward == nil || *tr.Reward.Total != 1 {
		t.Errorf("reward = %+v", tr.Reward)
	}
}

func TestSearchToolsNeedARetrieverAndAreTheDefaultsOfOne(t *testing.T) {
	known := func(string) bool { return true }
	if _, err := agent.ParseTask([]byte(`{"id": "x", "prompt": "p", "tools": ["bash", "search"], "reward": {"type": "exact", "answer": "a"}}`), "", known); err == nil || !strings.Contains(err.Error(), "tools[1]: search needs a retriever") {
		t.Errorf("err = %v", err)
	}
	tk, err := agent.ParseTask([]byte(`{"id": "x", "prompt": "p", "retriever": {"index": "ix"}, "reward": {"type": "fbeta", "relevant": ["a"]}, "limits": {"max_context_tokens": 1000}}`), "/tasks", known)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(tk.Tools, ",") != "search,read,prune,finish" || tk.ContextTokens() != 500 || tk.IndexPath() != "/tasks/ix" {
		t.Errorf("tools %v, budget %d, index %s", tk.Tools, tk.ContextTokens(), tk.IndexPath())
	}
}
