package cluster_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cluster"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/retriever/retrievertest"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/tools"
)

// searchSetup builds a search index beside a task file naming it by a
// relative path, as `rollbox serve --tasks` reads it; it returns the tasks
// and the index opened.
func searchSetup(t *testing.T) ([]*agent.Task, *retriever.Index) {
	t.Helper()
	dir := t.TempDir()
	ix := retrievertest.Index(t, dir,
		`{"id": "gzip", "title": "compress/gzip", "text": "Package gzip implements reading and writing of gzip format compressed files."}`,
		`{"id": "zlib", "title": "compress/zlib", "text": "Package zlib implements reading and writing of zlib format compressed data."}`,
		`{"id": "http", "title": "net/http", "text": "Package http provides HTTP client and server implementations."}`,
	)
	lines := ""
	for _, id := range []string{"compress", "elsewhere"} {
		lines += `{"id": "` + id + `", "prompt": "Which packages compress?", "sandbox": {"backend": "wasm"}, "retriever": {"index": "index"}, "reward": {"type": "fbeta", "relevant": ["gzip", "zlib"]}}` + "\n"
	}
	file := filepath.Join(dir, "tasks.jsonl")
	if err := os.WriteFile(file, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(file)
	defer f.Close()
	tasks, err := agent.ReadTasks(f, file, tools.Known)
	if err != nil {
		t.Fatal(err)
	}
	return tasks, ix
}

// searchPolicy searches, reads one document, and finishes with two.
func searchPolicy() *fakepolicy.Server {
	return mustPolicy(fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "search", Arguments: `{"query": "compressed"}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "read", Arguments: `{"id": "gzip"}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"ids": ["gzip", "zlib"]}`}}},
	)})
}

// TestSearchTasksOverWorkers: a search task of the coordinator's catalog
// (its index named relative to its task file) runs on workers, which open
// the index at the path the coordinator's host resolved, to the same
// records (tool outputs, rewards, group statistics) as on one host; a
// worker whose index there is not the coordinator's (another identity)
// runs no episode on it: the attempts fail as infrastructure failures and
// the episode ends sandbox_error naming both.
func TestSearchTasksOverWorkers(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	tasks, ix := searchSetup(t)
	pol := searchPolicy()
	defer pol.Close()
	req := func(task string) map[string]any {
		return map[string]any{"tasks": []any{map[string]any{"id": task}}, "group_size": 3,
			"policy": map[string]any{"base_url": pol.URL(), "model": "fake-model"}}
	}

	single := startService(t, "", "", func(o *runtime.Options) {
		o.Catalog = tasks
		o.ConfigureEpisode = func(cfg *agent.Config) error {
			cfg.ExtraTools = tools.SearchTools(ix, tools.SearchOptions{MaxDocBytes: cfg.Task.Limits.MaxToolOutputBytes})
			cfg.ToolEnv = func(env *tools.Env) error {
				tools.WithLedger(env, retriever.NewLedger(cfg.Task.ContextTokens()))
				return nil
			}
			return nil
		}
	})
	wantEps := single.episodes(single.submit(req("compress")), time.Minute)

	ns := startNATS(t, "", 0)
	in := ix.Info()
	coord := startService(t, "", ns.url, func(o *runtime.Options) {
		o.Catalog = tasks
		o.SearchIndex = func(t *agent.Task) (string, error) {
			if t.ID == "elsewhere" { // as if this host's index held another corpus
				return cluster.IndexIdentity(strings.Repeat("0", 64), in.Units, in.ChunkTokens, in.Scoring), nil
			}
			return cluster.IndexIdentity(in.CorpusSHA256, in.Units, in.ChunkTokens, in.Scoring), nil
		}
	})
	startWorker(t, ns.url, "w1", "wasm", 2)
	startWorker(t, ns.url, "w2", "wasm", 2)
	coord.waitWorkers(2)
	gotEps := coord.episodes(coord.submit(req("compress")), 2*time.Minute)

	compareOutcomes(t, outcomes(t, gotEps), outcomes(t, wantEps))
	for _, e := range append(wantEps, gotEps...) {
		if e.Termination.Reason != trajectory.EndFinished || e.Reward == nil || e.Reward.Total == nil || *e.Reward.Total != 1 {
			t.Errorf("episode %s: %+v reward %+v, want finished with reward 1", e.EpisodeID, e.Termination, e.Reward)
		}
	}
	if len(wantEps) > 0 && len(gotEps) > 0 {
		w, g := wantEps[0], gotEps[0]
		if w.TaskDir == "" || g.TaskDir != w.TaskDir || g.TaskHash != w.TaskHash {
			t.Errorf("task dir %q hash %s over workers, %q %s on one host", g.TaskDir, g.TaskHash, w.TaskDir, w.TaskHash)
		}
		if len(g.Steps) != len(w.Steps) {
			t.Fatalf("%d steps over workers, %d on one host", len(g.Steps), len(w.Steps))
		}
		for i := range w.Steps {
			if w.Steps[i].Type == trajectory.StepTool && w.Steps[i].Output != g.Steps[i].Output {
				t.Errorf("step %d (%s): over workers %q, on one host %q", i, w.Steps[i].Name, g.Steps[i].Output, w.Steps[i].Output)
			}
		}
	}

	// Another index than the coordinator's.
	calls := pol.Calls()
	other := coord.episodes(coord.submit(req("elsewhere")), 2*time.Minute)
	if len(other) != 3 {
		t.Errorf("%d episodes on another index, want 3", len(other))
	}
	for _, e := range other {
		if e.Termination.Reason != trajectory.EndSandboxError || !strings.Contains(e.Termination.Message, "is not the coordinator's") ||
			!strings.Contains(e.Termination.Message, strings.Repeat("0", 64)) {
			t.Errorf("episode %s on another index: %+v, want sandbox_error naming the coordinator's index", e.EpisodeID, e.Termination)
		}
	}
	if pol.Calls() != calls {
		t.Errorf("the policy was asked %d times for episodes whose index was not the coordinator's", pol.Calls()-calls)
	}
}
