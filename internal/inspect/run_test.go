package inspect_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/scripted"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakejudge"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm"
	"github.com/rollbox/rollbox/tools"
)

// The viewer is tested on a real run: the coding examples and a few tasks
// that meet every kind of trouble (truncated output, a timeout, bad and
// unknown tool calls, a policy that gives out), run on the WASM backend.
const troubleTasks = `{"id": "noisy-logs", "prompt": "Find the error in the logs.", "sandbox": {"backend": "wasm", "limits": {"exec_timeout_s": 1}}, "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "disk full"}, "limits": {"max_tool_output_bytes": 400}}
{"id": "gives-up", "prompt": "Count the lines of /work/data.txt.", "sandbox": {"backend": "wasm"}, "files": {"/work/data.txt": "a\nb\nc\n"}, "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "3"}}`

// searchCorpus and searchTask make a small retrieval task.
const searchCorpus = `{"id": "compress/gzip", "title": "compress/gzip", "text": "Package gzip implements reading and writing of gzip format compressed files, as specified in RFC 1952."}
{"id": "compress/zlib", "title": "compress/zlib", "text": "Package zlib implements reading and writing of zlib format compressed data, as specified in RFC 1950."}
{"id": "compress/flate", "title": "compress/flate", "text": "Package flate implements the DEFLATE compressed data format, described in RFC 1951."}
{"id": "archive/zip", "title": "archive/zip", "text": "Package zip provides support for reading and writing ZIP archives, whose entries may be compressed."}
{"id": "net/http", "title": "net/http", "text": "Package http provides HTTP client and server implementations."}`

const searchTask = `{"id": "compressors", "prompt": "Which Go packages implement a compressed data format? Finish with their ids.", "retriever": {"index": "index", "context_tokens": 400}, "reward": {"type": "fbeta", "beta": 4, "relevant": ["compress/gzip", "compress/zlib", "compress/flate"], "trajectory_recall_weight": 0.2, "prune_penalty": 0.05}}`

// judgedTasks are judged by two fake judges that disagree (judged) and
// by one that is down (judge-down: unscored).
const judgedTasks = `{"id": "judged", "prompt": "What is 2 + 2? Answer politely.", "sandbox": {"backend": "wasm"}, "tools": ["bash", "finish"], "reward": {"type": "judge", "rubrics": [{"name": "correct", "instructions": "Is the answer right?", "scale": [0, 10], "weight": 2, "sees": ["answer"]}, {"name": "tone", "instructions": "Is it polite?", "scale": [{"label": "rude", "value": 0}, {"label": "polite", "value": 1}], "sees": ["answer", "transcript"]}], "judges": [{"name": "a", "base_url": "JUDGE_A", "model": "judge-a"}, {"name": "b", "base_url": "JUDGE_B", "model": "judge-b"}]}}
{"id": "judge-down", "prompt": "What is 2 + 2?", "sandbox": {"backend": "wasm"}, "tools": ["bash", "finish"], "reward": {"type": "judge", "rubrics": [{"name": "correct", "instructions": "Is the answer right?", "scale": [0, 10], "sees": ["answer"]}], "judges": [{"name": "a", "base_url": "JUDGE_A", "model": "judge-a"}, {"name": "down", "base_url": "JUDGE_DOWN", "model": "judge-down", "retries": 0}]}}`

type scriptedTurns map[string][]agent.Turn

func call(name, args string) agent.Turn {
	return agent.Turn{ToolCalls: []agent.ToolCall{{ID: "c-" + name, Name: name, Arguments: args}}}
}

var troubleTurns = scriptedTurns{
	"noisy-logs": {
		{Content: "Let me look at the logs.", ToolCalls: []agent.ToolCall{{ID: "c1", Name: "bash", Arguments: `{"command": "seq 1 3000 | sed 's/^/INFO request /'; echo 'ERROR disk full'"}`}}},
		call("bash", `{"command": "sleep 5"}`),
		call("bash", `{"cmd": "ls"}`),
		call("grep", `{"pattern": "ERROR"}`),
		call("finish", `{"answer": "disk full"}`),
	},
	"gives-up":   {call("bash", `{"command": "wc -l < /work/data.txt"}`)},
	"judged":     {call("finish", `{"answer": "It is 4, thank you for asking."}`)},
	"judge-down": {call("finish", `{"answer": "4"}`)},
	"compressors": {
		{Content: "Search the package docs.", ToolCalls: []agent.ToolCall{{ID: "s1", Name: "search", Arguments: `{"query": "compressed data format", "k": 4}`}}},
		{ToolCalls: []agent.ToolCall{{ID: "r1", Name: "read", Arguments: `{"id": "compress/gzip"}`}, {ID: "r2", Name: "read", Arguments: `{"id": "archive/zip"}`}}},
		{Content: "zip is an archive, not a format; drop it.", ToolCalls: []agent.ToolCall{{ID: "p1", Name: "prune", Arguments: `{"ids": ["archive/zip"]}`}}},
		call("finish", `{"ids": ["compress/gzip", "compress/zlib"]}`),
	},
}

type mixedPolicy struct {
	script *scripted.Policy
	turns  scriptedTurns
}

func (p mixedPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	if ts, ok := p.turns[req.TaskID]; ok {
		if req.Turn >= len(ts) {
			return agent.Turn{}, fmt.Errorf("the model server went away: %w", agent.ErrPolicy)
		}
		return ts[req.Turn], nil
	}
	return p.script.Next(ctx, req)
}

var (
	runOnce sync.Once
	runDir  string
	runErr  error
)

// testRun is a run's out dir (episodes/ and summary.json), made once.
func testRun(t *testing.T) string {
	t.Helper()
	runOnce.Do(func() { runDir, runErr = makeRun() })
	if runErr != nil {
		t.Fatal(runErr)
	}
	return runDir
}

func makeRun() (string, error) {
	dir, err := os.MkdirTemp("", "rollbox-inspect-test-")
	if err != nil {
		return "", err
	}
	examples, err := agent.LoadTasks("../../examples/coding/tasks.jsonl", nil)
	if err != nil {
		return "", err
	}
	extra, err := agent.ReadTasks(strings.NewReader(troubleTasks), "", nil)
	if err != nil {
		return "", err
	}
	// The judges: a answers JSON (10, "polite"), b prose (2/10, "rude"),
	// down answers 500.
	ja, err := fakejudge.Start(fakejudge.Config{Model: "judge-a", Behavior: func(r fakejudge.Request) fakejudge.Reply {
		if len(r.Labels) > 0 {
			return fakejudge.Reply{Text: `{"label": "polite", "reason": "it thanks the user"}`}
		}
		return fakejudge.Reply{Text: `{"score": 10, "reason": "4 is right"}`}
	}})
	if err != nil {
		return "", err
	}
	defer ja.Close()
	jb, err := fakejudge.Start(fakejudge.Config{Model: "judge-b", Behavior: func(r fakejudge.Request) fakejudge.Reply {
		if len(r.Labels) > 0 {
			return fakejudge.Reply{Text: "Too chatty.\nVerdict: polite"}
		}
		return fakejudge.Reply{Text: "The answer hedges.\nScore: 2/10"}
	}})
	if err != nil {
		return "", err
	}
	defer jb.Close()
	down, err := fakejudge.Start(fakejudge.Config{Model: "judge-down", Behavior: fakejudge.Status(500)})
	if err != nil {
		return "", err
	}
	defer down.Close()
	judged, err := agent.ReadTasks(strings.NewReader(strings.NewReplacer("JUDGE_A", ja.URL(), "JUDGE_B", jb.URL(), "JUDGE_DOWN", down.URL()).Replace(judgedTasks)), "", nil)
	if err != nil {
		return "", err
	}
	extra = append(extra, judged...)
	script, err := scripted.Load("../../examples/coding/policy.jsonl")
	if err != nil {
		return "", err
	}
	// Two search episodes: rewards with several components, context events.
	ctxb := context.Background()
	if _, err := retriever.Build(ctxb, filepath.Join(dir, "index"), strings.NewReader(searchCorpus), retriever.BuildOptions{}); err != nil {
		return "", err
	}
	ix, err := retriever.Open(filepath.Join(dir, "index"), retriever.OpenOptions{})
	if err != nil {
		return "", err
	}
	defer ix.Close()
	search, err := agent.ReadTasks(strings.NewReader(searchTask), filepath.Join(dir, "tasks.jsonl"), nil)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	be, err := wasm.New(ctx, wasm.Options{})
	if err != nil {
		return "", err
	}
	defer be.Close()
	const rollout = "r20260101T000000-viewer"
	policy := mixedPolicy{script: script, turns: troubleTurns}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var trs []*trajectory.Trajectory
	var firstErr error
	for _, task := range append(append(examples, extra...), search...) {
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cfg := agent.Config{
					Task: task, EpisodeID: fmt.Sprintf("%s.%s.%d", rollout, task.ID, i), RolloutID: rollout,
					GroupID: rollout + "." + task.ID, GroupIndex: i, Seed: int64(i), Dir: filepath.Join(dir, "episodes"),
					Backend: "wasm", Policy: policy, PolicyInfo: trajectory.Policy{Kind: "scripted", Endpoint: "examples/coding/policy.jsonl"},
					NewSandbox: func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
						return be.Create(ctx, spec)
					},
				}
				if !script.Has(task.ID) {
					cfg.PolicyInfo.Endpoint = "internal/inspect test turns"
				}
				if task.Retriever != nil {
					cfg.ExtraTools = tools.SearchTools(ix, tools.SearchOptions{MaxDocBytes: task.Limits.MaxToolOutputBytes})
					cfg.ToolEnv = func(env *tools.Env) error {
						tools.WithLedger(env, retriever.NewLedger(task.ContextTokens()))
						return nil
					}
				}
				tr, err := agent.Run(ctx, cfg)
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				trs = append(trs, tr)
			}()
		}
	}
	wg.Wait()
	if firstErr != nil {
		return "", firstErr
	}
	sum := map[string]any{"schema": "rollbox.summary/v1", "rollout_id": rollout, "episodes": len(trs)}
	var total float64
	scored, passed := 0, 0
	for _, tr := range trs {
		if v, ok := tr.Value(); ok {
			scored++
			total += v
			if v >= 1 {
				passed++
			}
		}
	}
	sum["reward_mean"], sum["pass_rate"] = total/float64(scored), float64(passed)/float64(scored)
	b, _ := json.Marshal(sum)
	return dir, os.WriteFile(filepath.Join(dir, "summary.json"), b, 0o644)
}

// readRun reads the run's trajectories by episode id.
func readRun(t *testing.T, dir string) map[string]*trajectory.Trajectory {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "episodes", "*.json"))
	out := map[string]*trajectory.Trajectory{}
	for _, f := range files {
		tr, err := trajectory.Read(f)
		if err != nil {
			t.Fatal(err)
		}
		out[tr.EpisodeID] = tr
	}
	return out
}

func TestMain(m *testing.M) {
	code := m.Run()
	stopBrowser()
	if runDir != "" {
		os.RemoveAll(runDir)
	}
	os.Exit(code)
}
