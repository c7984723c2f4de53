package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/openai"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/retriever/retrievertest"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
	"github.com/rollbox/rollbox/tools"
)

func tokenRolloutBody(p *fakepolicy.Server, group int, extra map[string]any, tasks ...any) map[string]any {
	b := map[string]any{"tasks": tasks, "group_size": group,
		"policy": map[string]any{"base_url": p.URL(), "model": "fake-model", "mode": "tokens"}}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func versionsOf(tr *trajectory.Trajectory) []string {
	var out []string
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepModel {
			out = append(out, s.PolicyVersion)
		}
	}
	return out
}

func waitCalls(t *testing.T, p *fakepolicy.Server, n int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for p.Calls() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the policy had %d calls, want %d", p.Calls(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestAVersionAnnouncedMidRolloutShowsInTheTurnsSummaryAndStatus(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{Latency: 150 * time.Millisecond, Responder: fakepolicy.BashThenFinish(3)})
	s := startService(t, "")
	id := s.submit(tokenRolloutBody(p, 2, map[string]any{"policy_version": "step-10"}, task("a")))
	waitCalls(t, p, 2) // both episodes' first turns were sent under step-10
	var res runtime.PolicyVersionResult
	if code, _ := s.do("POST", "/v1/policy-version", map[string]any{"version": "step-11"}, &res); code != 200 || len(res.Rollouts) != 1 || res.Rollouts[0].ID != id {
		t.Fatalf("announce: %d %+v", code, res)
	}
	eps := s.episodes(id, "?stream=1")
	if len(eps) != 2 {
		t.Fatalf("%d episodes", len(eps))
	}
	total := map[string]int{}
	for _, e := range eps {
		vs := versionsOf(e)
		if e.Termination.Reason != trajectory.EndFinished || len(vs) != 4 || vs[0] != "step-10" || vs[3] != "step-11" {
			t.Fatalf("episode %s ended %s with versions %v", e.EpisodeID, e.Termination.Reason, vs)
		}
		for i := 1; i < len(vs); i++ {
			if vs[i] == "step-10" && vs[i-1] == "step-11" {
				t.Fatalf("versions went back: %v", vs)
			}
		}
		for v, n := range e.Stats.PolicyVersions {
			total[v] += n
		}
		if e.Policy.Mode != "tokens" || len(e.Segments) != 1 {
			t.Fatalf("policy %+v segments %d", e.Policy, len(e.Segments))
		}
	}
	var st runtime.RolloutStatus
	s.do("GET", "/v1/rollouts/"+id, nil, &st)
	var sum runtime.Summary
	s.do("GET", "/v1/rollouts/"+id+"/summary", nil, &sum)
	if st.PolicyVersion != "step-11" || fmt.Sprint(st.PolicyVersions) != fmt.Sprint(total) || fmt.Sprint(sum.PolicyVersions) != fmt.Sprint(total) ||
		total["step-10"] < 2 || total["step-11"] < 2 {
		t.Fatalf("status %v %v, summary %v, turns %v", st.PolicyVersion, st.PolicyVersions, sum.PolicyVersions, total)
	}
	// A rollout submitted later without a version takes the last announced.
	id2 := s.submit(tokenRolloutBody(p, 1, nil, task("b")))
	if eps := s.episodes(id2, "?stream=1"); versionsOf(eps[0])[0] != "step-11" {
		t.Fatalf("later rollout versions %v", versionsOf(eps[0]))
	}
}

func TestEpisodesStalerThanMaxStalenessEndCancelledWithTheReason(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{Latency: 200 * time.Millisecond, Responder: fakepolicy.BashThenFinish(50)})
	s := startService(t, "")
	tk := task("a")
	tk["limits"] = map[string]any{"max_turns": 60}
	id := s.submit(tokenRolloutBody(p, 2, map[string]any{"policy_version": "v1", "max_staleness": 1}, tk))
	waitCalls(t, p, 4) // both episodes are past their first turn
	var res runtime.PolicyVersionResult
	if code, _ := s.do("POST", "/v1/rollouts/"+id+"/policy-version", map[string]any{"version": "v2"}, &res); code != 200 || res.Rollouts[0].Cancelled != 0 {
		t.Fatalf("v2: %d %+v", code, res)
	}
	if code, _ := s.do("POST", "/v1/rollouts/"+id+"/policy-version", map[string]any{"version": "v3"}, &res); code != 200 || res.Rollouts[0].Cancelled != 2 {
		t.Fatalf("v3: %d %+v", code, res)
	}
	eps := s.episodes(id, "?stream=1")
	for _, e := range eps {
		if e.Termination.Reason != trajectory.EndCancelled || e.Reward != nil ||
			!strings.Contains(e.Termination.Message, `policy version stale: the episode's first turn was sampled under "v1"`) {
			t.Fatalf("episode %s: %+v", e.EpisodeID, e.Termination)
		}
		if vs := versionsOf(e); len(vs) == 0 || vs[0] != "v1" || slices.Contains(vs, "v3") {
			t.Fatalf("versions %v", vs)
		}
	}
	if code, _ := s.do("POST", "/v1/rollouts/"+id+"/policy-version", map[string]any{"version": "v4"}, nil); code != http.StatusConflict {
		t.Fatalf("announcing to an ended rollout: %d", code)
	}
}

func TestATokenRolloutAgainstAServerWithoutATokenizerIsRefusedAtAdmission(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{NoTokenizer: true})
	s := startService(t, "")
	var e apiErr
	code, _ := s.do("POST", "/v1/rollouts", tokenRolloutBody(p, 1, nil, task("a")), &e)
	if code != 400 || e.Error.Field != "policy.mode" || !strings.Contains(e.Error.Message, "no tokenizer endpoint") || !strings.Contains(e.Error.Message, "/tokenize") {
		t.Fatalf("%d %+v", code, e)
	}
	if p.Calls() != 0 {
		t.Fatalf("%d completions were asked for", p.Calls())
	}
	for body, field := range map[string]string{
		`{"tasks": [{"id": "x"}], "policy": {"base_url": "http://127.0.0.1:1/v1", "model": "m", "mode": "tokenz"}}`:                    "policy.mode",
		`{"tasks": [{"id": "x"}], "policy": {"base_url": "http://127.0.0.1:1/v1", "model": "m", "tokenize_url": "http://x/tokenize"}}`: "policy.tokenize_url",
		`{"tasks": [{"id": "x"}], "policy": {"base_url": "http://127.0.0.1:1/v1", "model": "m"}, "max_staleness": -1}`:                 "max_staleness",
	} {
		var e apiErr
		if code, _ := s.do("POST", "/v1/rollouts", body, &e); code != 400 || e.Error.Field != field {
			t.Errorf("%s: %d %+v", body, code, e)
		}
	}
	if code, _ := s.do("POST", "/v1/policy-version", `{"version": ""}`, &e); code != 400 || e.Error.Field != "version" {
		t.Errorf("empty version: %d %+v", code, e)
	}
}

// The documented columns of the segments layout, read back with
// parquet-go's generic reader (not runtime.SegmentRow).
var segmentColumns = []string{"episode_id", "rollout_id", "group_id", "group_index", "task_id", "segment", "segments", "start_turn", "end_turn",
	"reason", "input_ids", "loss_mask", "logprobs", "logprobs_complete", "prompt_length", "scored", "reward", "advantage", "termination",
	"policy_version", "policy_versions", "tokenizer_model", "tokenizer_revision", "tokenizer_fingerprint", "trajectory_schema", "source"}

func TestASearchEpisodeThatPrunesExportsOneParquetRowPerSegment(t *testing.T) {
	dir := t.TempDir()
	ix := retrievertest.Index(t, dir,
		`{"id": "gzip", "title": "compress/gzip", "text": "Package gzip implements reading and writing of gzip format compressed files."}`,
		`{"id": "zlib", "title": "compress/zlib", "text": "Package zlib implements reading and writing of zlib format compressed data."}`,
		`{"id": "http", "title": "net/http", "text": "Package http provides HTTP client and server implementations."}`,
	)
	tasks, err := agent.ReadTasks(strings.NewReader(`{"id": "compress", "prompt": "Which packages compress?", "retriever": {"index": "index"}, "reward": {"type": "fbeta", "relevant": ["gzip", "zlib"]}}`),
		filepath.Join(dir, "tasks.jsonl"), tools.Known)
	if err != nil {
		t.Fatal(err)
	}
	p := startPolicy(t, fakepolicy.Config{Record: true, Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "search", Arguments: `{"query": "compressed"}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "read", Arguments: `{"id": "gzip"}`}, {Name: "read", Arguments: `{"id": "http"}`}}},
		fakepolicy.Reply{Content: "http is off topic.", ToolCalls: []fakepolicy.ToolCall{{Name: "prune", Arguments: `{"ids": ["http"]}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "read", Arguments: `{"id": "zlib"}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"ids": ["gzip", "zlib"]}`}}},
	)})
	tp, err := openai.NewTokens(context.Background(), openai.Config{BaseURL: p.URL(), Model: "fake-model"})
	if err != nil {
		t.Fatal(err)
	}
	tok := tp.Tokenizer()
	out := t.TempDir()
	_, err = runtime.RunBatch(context.Background(), runtime.BatchConfig{Tasks: tasks, Group: 2, OutDir: out, Backend: "wasm",
		NewSandbox: wasmtest.Factory(t), Policy: tp, RolloutID: "r-search",
		PolicyInfo: trajectory.Policy{Kind: "openai", Endpoint: p.URL(), Model: "fake-model", Mode: trajectory.ModeTokens, Tokenizer: &tok},
		ConfigureEpisode: func(cfg *agent.Config) error {
			cfg.ExtraTools = tools.SearchTools(ix, tools.SearchOptions{MaxDocBytes: cfg.Task.Limits.MaxToolOutputBytes})
			cfg.ToolEnv = func(env *tools.Env) error {
				tools.WithLedger(env, retriever.NewLedger(cfg.Task.ContextTokens()))
				return nil
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ts, _, err := runtime.LoadEpisodes(filepath.Join(out, "episodes"), "")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := runtime.WriteExport(&buf, ts, "parquet", runtime.LayoutSegments); err != nil {
		t.Fatal(err)
	}
	f, err := parquet.OpenFile(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, fd := range f.Schema().Fields() {
		cols = append(cols, fd.Name())
	}
	if !slices.Equal(cols, segmentColumns) {
		t.Fatalf("columns\n%v\nwant\n%v", cols, segmentColumns)
	}
	rd := parquet.NewGenericReader[map[string]any](bytes.NewReader(buf.Bytes()), f.Schema())
	rows := make([]map[string]any, f.NumRows())
	for i := range rows {
		rows[i] = map[string]any{}
	}
	if n, err := rd.Read(rows); n != len(rows) || (err != nil && err != io.EOF) {
		t.Fatalf("read %d of %d rows: %v", n, len(rows), err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 2 episodes × 2 segments", len(rows))
	}
	sort.Slice(rows, func(i, j int) bool {
		return fmt.Sprint(rows[i]["episode_id"], rows[i]["segment"]) < fmt.Sprint(rows[j]["episode_id"], rows[j]["segment"])
	})
	for i, row := range rows {
		ids, mask, lps := ints(row["input_ids"]), ints(row["loss_mask"]), floats(row["logprobs"])
		if len(ids) == 0 || len(mask) != len(ids) || len(lps) != len(ids) {
			t.Fatalf("row %d: %d ids, %d mask, %d logprobs", i, len(ids), len(mask), len(lps))
		}
		text, err := fakepolicy.Decode(ids)
		if err != nil {
			t.Fatal(err)
		}
		// The segment decodes to the text the server saw, and its sampled
		// part to the completions.
		pl := int(row["prompt_length"].(int32))
		if mask[pl] != 1 || slices.Contains(mask[:pl], 1) || !strings.HasPrefix(text, "<|im_start|>system\n") {
			t.Fatalf("row %d: prompt_length %d", i, pl)
		}
		for j, m := range mask {
			if (m == 1) != (lps[j] != 0) {
				t.Fatalf("row %d id %d: mask %d logprob %v", i, j, m, lps[j])
			}
		}
		seg := int(row["segment"].(int32))
		wantReason := []string{"start", "pruned"}[seg]
		if row["reason"] != wantReason || row["reward"] == nil || row["advantage"] == nil || row["tokenizer_fingerprint"] != tok.Fingerprint {
			t.Fatalf("row %d: %v %v %v", i, row["reason"], row["reward"], row["tokenizer_fingerprint"])
		}
		if i < 2 {
			t.Logf("episode %v segment %v (%s, turns %v-%v): %d ids, %d sampled, prompt_length %d, reward %v\n%s",
				row["episode_id"], seg, row["reason"], row["start_turn"], row["end_turn"], len(ids), count1(mask), pl, row["reward"], showMasked(ids, mask))
		}
	}
}

func count1(mask []int64) int {
	n := 0
	for _, m := range mask {
		n += int(m)
	}
	return n
}

// showMasked renders a segment with the sampled spans in [[...]].
func showMasked(ids, mask []int64) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j < len(ids) && mask[j] == mask[i] {
			j++
		}
		text, _ := fakepolicy.Decode(ids[i:j])
		if mask[i] == 1 {
			text = "[[" + text + "]]"
		}
		b.WriteString(text)
		i = j
	}
	return b.String()
}

func ints(v any) []int64 {
	var out []int64
	list, _ := v.([]any)
	for _, x := range list {
		switch n := x.(type) {
		case int64:
			out = append(out, n)
		case int32:
			out = append(out, int64(n))
		}
	}
	return out
}

func floats(v any) []float64 {
	var out []float64
	list, _ := v.([]any)
	for _, x := range list {
		if f, ok := x.(float64); ok {
			out = append(out, f)
		}
	}
	return out
}
