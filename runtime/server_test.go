package runtime_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
	"github.com/rollbox/rollbox/tools"
)

// The service tests run a real HTTP server over real WASM sandboxes and the
// fake OpenAI-compatible policy server.

func wasmBackends(t testing.TB) runtime.BackendSource {
	t.Helper()
	wasmBackend := wasmtest.Backend(t)
	return runtime.BackendFunc(func(_ context.Context, name string) (sandbox.Backend, error) {
		if name != "wasm" {
			return nil, fmt.Errorf("backend %q is not available in this test: %w", name, sandbox.ErrEngineUnavailable)
		}
		return wasmBackend, nil
	})
}

// ownWasm is a WASM backend of the test's own, so that counting its live
// sandboxes sees nobody else's.
func ownWasm(t testing.TB) (*wasm.Backend, func(*runtime.Options)) {
	t.Helper()
	be, err := wasm.New(context.Background(), wasm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be, func(o *runtime.Options) {
		o.Backends = runtime.BackendFunc(func(context.Context, string) (sandbox.Backend, error) { return be, nil })
	}
}

type service struct {
	t     testing.TB
	token string // sent as a bearer token when set
	srv   *runtime.Server
	http  *httptest.Server
	url   string
	rec   *runtime.Recovery
	data  string
}

func startService(t testing.TB, dataDir string, mutate ...func(*runtime.Options)) *service {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	opts := runtime.Options{DataDir: dataDir, Backends: wasmBackends(t), Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if testing.Verbose() {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	for _, m := range mutate {
		m(&opts)
	}
	srv, err := runtime.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := srv.Recovered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	s := &service{t: t, srv: srv, http: hs, url: hs.URL, rec: rec, data: dataDir}
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// do sends a request and decodes a JSON answer into out (when non-nil).
func (s *service) do(method, path string, body any, out any) (int, http.Header) {
	s.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		js, _ := json.Marshal(b)
		rd = bytes.NewReader(js)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	if method == "POST" {
		req.Header.Set("Content-Type", "application/json")
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			s.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, raw, err)
		}
	}
	return resp.StatusCode, resp.Header
}

type apiErr struct {
	Error struct {
		Code, Message, Field string
	}
}

func startPolicy(t testing.TB, cfg fakepolicy.Config) *fakepolicy.Server {
	t.Helper()
	p, err := fakepolicy.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// task returns an inline WASM task: bash, then finish; reward exact "done".
func task(id string) map[string]any {
	return map[string]any{"id": id, "prompt": "task " + id + ": answer done", "tools": []string{"bash", "finish"},
		"files":  map[string]string{"/work/hello.txt": "hi\n"},
		"reward": map[string]any{"type": "exact", "answer": "done"}, "limits": map[string]any{"max_turns": 6}}
}

// answering is a policy: one bash call, then finish with the answer that
// answer returns for the prompt.
func answering(answer func(prompt string) string) fakepolicy.Responder {
	return func(req *fakepolicy.Request) fakepolicy.Reply {
		if req.AssistantTurns() == 0 {
			return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command":"cat hello.txt"}`}}}
		}
		a, _ := json.Marshal(map[string]string{"answer": answer(req.Messages[1].Content)})
		return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: string(a)}}}
	}
}

func rolloutBody(p *fakepolicy.Server, group int, tasks ...any) map[string]any {
	return map[string]any{"tasks": tasks, "group_size": group,
		"policy": map[string]any{"base_url": p.URL(), "model": "fake-model", "sampling": map[string]any{"temperature": 1.0}}}
}

func (s *service) submit(body any) string {
	s.t.Helper()
	var out struct{ ID string }
	if code, _ := s.do("POST", "/v1/rollouts", body, &out); code != http.StatusCreated {
		s.t.Fatalf("POST /v1/rollouts: %d", code)
	}
	return out.ID
}

type status struct {
	ID            string
	State         string
	EpisodesTotal int `json:"episodes_total"`
	EpisodesDone  int `json:"episodes_done"`
	Running       int `json:"episodes_running"`
	Queued        int `json:"episodes_queued"`
	InfraRetries  int `json:"infra_retries"`
	Ends          map[string]int
	RewardMean    *float64 `json:"reward_mean"`
	Interrupted   bool
}

func (s *service) status(id string) status {
	s.t.Helper()
	var st status
	if code, _ := s.do("GET", "/v1/rollouts/"+id, nil, &st); code != 200 {
		s.t.Fatalf("GET rollout %s: %d", id, code)
	}
	return st
}

func (s *service) waitState(id string, within time.Duration, ok func(status) bool) status {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		st := s.status(id)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("rollout %s: still %+v after %s", id, st, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// episodes reads the NDJSON episode list (stream or not).
func (s *service) episodes(id, query string) []*trajectory.Trajectory {
	s.t.Helper()
	resp, err := http.Get(s.url + "/v1/rollouts/" + id + "/episodes" + query)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		s.t.Fatalf("episodes: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return readNDJSON(s.t, resp.Body)
}

func readNDJSON(t testing.TB, r io.Reader) []*trajectory.Trajectory {
	t.Helper()
	var out []*trajectory.Trajectory
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if err := trajectory.Validate(sc.Bytes()); err != nil {
			t.Fatalf("a streamed line is not a valid trajectory: %v", err)
		}
		tr, err := trajectory.Decode(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tr)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (s *service) metrics() string {
	s.t.Helper()
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestARolloutStreamsEveryEpisodeWithItsGroupStatistics(t *testing.T) {
	var aCount atomic.Int64
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(prompt string) string {
		if strings.HasPrefix(prompt, "task a:") { // half the group right, half wrong
			if aCount.Add(1)%2 == 0 {
				return "done"
			}
			return "wrong"
		}
		return "done" // task b: all right, a zero-variance group
	})})
	s := startService(t, "")
	id := s.submit(rolloutBody(p, 4, task("a"), task("b")))
	eps := s.episodes(id, "?stream=1") // follows until the rollout ends
	if len(eps) != 8 {
		t.Fatalf("streamed %d episodes, want 8", len(eps))
	}
	adv := map[string]float64{}
	seen := map[string]bool{}
	for _, e := range eps {
		if seen[e.EpisodeID] {
			t.Errorf("episode %s streamed twice", e.EpisodeID)
		}
		seen[e.EpisodeID] = true
		if e.Group == nil {
			t.Fatalf("episode %s has no group statistics", e.EpisodeID)
		}
		if e.Termination.Reason != trajectory.EndFinished || e.Reward == nil || e.Stats.Turns != 2 {
			t.Errorf("episode %s: %+v reward %+v turns %d", e.EpisodeID, e.Termination, e.Reward, e.Stats.Turns)
		}
		if e.RolloutID != id || e.Sandbox.Backend != "wasm" || e.Policy.Model != "fake-model" {
			t.Errorf("episode %s: identity %q %q %q", e.EpisodeID, e.RolloutID, e.Sandbox.Backend, e.Policy.Model)
		}
		adv[e.TaskID] += e.Group.Advantage
		switch e.TaskID {
		case "a":
			if e.Group.ZeroVariance || e.Group.RewardMean != 0.5 || math.Abs(math.Abs(e.Group.Advantage)-0.5) > 1e-9 {
				t.Errorf("group a: %+v", e.Group)
			}
		case "b":
			if !e.Group.ZeroVariance || e.Group.RewardMean != 1 || e.Group.Advantage != 0 {
				t.Errorf("group b: %+v", e.Group)
			}
		}
	}
	for task, sum := range adv {
		if math.Abs(sum) > 1e-9 {
			t.Errorf("advantages of group %s sum to %v, want 0", task, sum)
		}
	}
	st := s.status(id)
	if st.State != runtime.RolloutDone || st.EpisodesDone != 8 || st.EpisodesTotal != 8 || st.Ends["finished"] != 8 || *st.RewardMean != 0.75 {
		t.Errorf("status %+v", st)
	}
	m := s.metrics()
	for _, want := range []string{
		`rollbox_turns_total 16`,
		`rollbox_episodes_ended_total{mode="rollout",reason="finished"} 8`,
		`rollbox_tool_duration_seconds_count{backend="wasm",tool="bash"} 8`,
		`rollbox_policy_request_duration_seconds_count{endpoint="` + p.URL() + `"} 16`,
		`rollbox_sandbox_acquire_seconds_count{backend="wasm",source="create"} 8`,
		`rollbox_episodes{state="running"} 0`,
		`rollbox_rollouts_total{state="done"} 1`,
		`rollbox_process_peak_rss_bytes`,
		`rollbox_cpu_gate_wait_seconds_total`,
		`rollbox_cpu_gate_waiting 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	var list struct{ Rollouts []status }
	s.do("GET", "/v1/rollouts", nil, &list)
	if len(list.Rollouts) != 1 || list.Rollouts[0].ID != id {
		t.Errorf("GET /v1/rollouts: %+v", list)
	}
	var sum runtime.Summary
	if code, _ := s.do("GET", "/v1/rollouts/"+id+"/summary", nil, &sum); code != 200 || sum.Episodes != 8 || sum.RewardMean == nil || *sum.RewardMean != 0.75 ||
		len(sum.Groups) != 2 || !sum.Groups[1].ZeroVariance || sum.Groups[0].ZeroVariance {
		t.Errorf("summary: %d %+v", code, sum)
	}
}

func TestAStreamReaderThatDisconnectsLosesNothing(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{Latency: 50 * time.Millisecond, Responder: answering(func(string) string { return "done" })})
	s := startService(t, "", func(o *runtime.Options) { o.Limits.MaxRunning = 2 })
	id := s.submit(rolloutBody(p, 1, task("a"), task("b"), task("c"), task("d")))
	// Read one line, then hang up.
	resp, err := http.Get(s.url + "/v1/rollouts/" + id + "/episodes?stream=1")
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadBytes('\n')
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	first, err := trajectory.Decode(line)
	if err != nil {
		t.Fatal(err)
	}
	// Read again from the start: everything, the first line included.
	all := s.episodes(id, "?stream=1")
	if len(all) != 4 || all[0].EpisodeID != first.EpisodeID {
		t.Fatalf("re-read %d episodes (first %v), want 4 starting with %s", len(all), all[0].EpisodeID, first.EpisodeID)
	}
	// Resume after what was read.
	rest := s.episodes(id, "?stream=1&from=1")
	if len(rest) != 3 || rest[0].EpisodeID != all[1].EpisodeID {
		t.Errorf("from=1 gave %d episodes", len(rest))
	}
	// Without stream: every finished episode, at once.
	if snap := s.episodes(id, ""); len(snap) != 4 {
		t.Errorf("non-stream listing has %d episodes", len(snap))
	}
}

// blockingPolicy answers the first turn at once and holds every later call
// until release is closed (or the caller gives up).
func blockingPolicy(t testing.TB) (*fakepolicy.Server, func()) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	p := startPolicy(t, fakepolicy.Config{
		Responder: answering(func(string) string { return "done" }),
		Fault: func(_ int64, req *fakepolicy.Request) fakepolicy.Fault {
			if req.AssistantTurns() > 0 {
				<-release
			}
			return fakepolicy.Fault{}
		},
	})
	t.Cleanup(free)
	return p, free
}

func TestCancellingARolloutStopsItsSandboxesPromptly(t *testing.T) {
	p, _ := blockingPolicy(t)
	be, own := ownWasm(t)
	s := startService(t, "", own, func(o *runtime.Options) { o.Limits.MaxRunning = 2 })
	before := len(be.Live())
	id := s.submit(rolloutBody(p, 5, task("a")))
	// Two running (each with its sandbox, waiting on the policy), three queued.
	s.waitState(id, 10*time.Second, func(st status) bool {
		return st.Running == 2 && st.Queued == 3 && len(be.Live())-before == 2
	})
	// A running episode reads as its record so far; a queued one has none.
	running := 0
	for g := range 5 {
		var tr struct {
			Steps       []trajectory.Step
			Termination *trajectory.Termination
		}
		code, _ := s.do("GET", fmt.Sprintf("/v1/episodes/%s.a.%d", id, g), nil, &tr)
		switch {
		case code == 200 && len(tr.Steps) <= 2 && tr.Termination == nil:
			running++
		case code != 404:
			t.Errorf("episode %d: %d %+v", g, code, tr)
		}
	}
	if running != 2 {
		t.Errorf("%d episodes read as running, want 2", running)
	}
	start := time.Now()
	var st status
	if code, _ := s.do("DELETE", "/v1/rollouts/"+id, nil, &st); code != 200 {
		t.Fatalf("DELETE: %d", code)
	}
	st = s.waitState(id, 5*time.Second, func(st status) bool { return st.EpisodesDone == 5 })
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the cancel took %s", took)
	}
	if st.State != runtime.RolloutCancelled || st.Ends["cancelled"] != 5 {
		t.Errorf("after cancel: %+v", st)
	}
	if live := len(be.Live()) - before; live != 0 {
		t.Errorf("%d sandboxes still live after the cancel", live)
	}
	for _, e := range s.episodes(id, "") {
		if e.Termination.Reason != trajectory.EndCancelled || e.Reward != nil {
			t.Errorf("episode %s: %+v reward %v", e.EpisodeID, e.Termination, e.Reward)
		}
	}
	// Cancelling again, or an unknown id.
	if code, _ := s.do("DELETE", "/v1/rollouts/"+id, nil, nil); code != 200 {
		t.Errorf("second DELETE: %d", code)
	}
	if code, _ := s.do("DELETE", "/v1/rollouts/nope", nil, nil); code != 404 {
		t.Errorf("DELETE of an unknown rollout: %d", code)
	}
}

func TestAFullServiceAnswers429WithRetryAfter(t *testing.T) {
	p, _ := blockingPolicy(t)
	s := startService(t, "", func(o *runtime.Options) {
		o.Limits.MaxRunning, o.Limits.MaxQueued, o.Limits.MaxEnvEpisodes = 1, 2, 1
	})
	id := s.submit(rolloutBody(p, 3, task("a"))) // 1 running, 2 queued: full
	s.waitRunning(1, 30*time.Second)             // started (on a loaded host, not at once)
	var e apiErr
	code, h := s.do("POST", "/v1/rollouts", rolloutBody(p, 1, task("b")), &e)
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" || e.Error.Code != "overloaded" {
		t.Errorf("a rollout past the queue bound: %d Retry-After %q %+v", code, h.Get("Retry-After"), e)
	}
	code, _ = s.do("POST", "/v1/rollouts", rolloutBody(p, 4, task("c")), &e)
	if code != http.StatusRequestEntityTooLarge || e.Error.Field != "tasks" {
		t.Errorf("a rollout larger than the service: %d %+v", code, e)
	}
	if st := s.status(id); st.Queued != 2 {
		t.Errorf("the refused rollouts changed the queue: %+v", st)
	}
	// Environment mode has its own bound.
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": task("env")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	code, h = s.do("POST", "/v1/episodes", map[string]any{"task": task("env")}, &e)
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Errorf("an env episode past the bound: %d %+v", code, e)
	}
	s.do("DELETE", "/v1/episodes/"+opened.ID, nil, nil)
	s.do("DELETE", "/v1/rollouts/"+id, nil, nil)
	// Room again.
	id2 := s.submit(rolloutBody(p, 1, task("b")))
	s.do("DELETE", "/v1/rollouts/"+id2, nil, nil)
}

func TestRolloutsShareTheServiceRoundRobin(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{Latency: 20 * time.Millisecond, Responder: answering(func(string) string { return "done" })})
	hold, release := blockingPolicy(t)
	s := startService(t, "", func(o *runtime.Options) { o.Limits.MaxRunning = 1 })
	// A blocker holds the only slot while A (6 episodes) and B (2) queue.
	blocker := s.submit(rolloutBody(hold, 1, task("x")))
	s.waitState(blocker, 10*time.Second, func(st status) bool { return st.Running == 1 })
	a := s.submit(rolloutBody(p, 6, task("a")))
	b := s.submit(rolloutBody(p, 2, task("b")))
	release()
	s.waitState(a, 30*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	s.waitState(b, 30*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	var all []*trajectory.Trajectory
	all = append(all, s.episodes(a, "")...)
	all = append(all, s.episodes(b, "")...)
	sort.Slice(all, func(i, j int) bool { return all[i].StartedAt.Before(all[j].StartedAt) })
	var order []string
	for _, e := range all {
		order = append(order, e.TaskID)
	}
	// Round-robin: B's episodes start second and fourth, not after A's six.
	if got := strings.Join(order, ""); got != "ababaaaa" {
		t.Errorf("start order %s, want ababaaaa", got)
	}
}

func TestEnvironmentModeStepsTheSameSessionARolloutRuns(t *testing.T) {
	be, own := ownWasm(t)
	s := startService(t, "", own)
	tk := task("env")
	tk["limits"] = map[string]any{"max_turns": 3, "max_tool_output_bytes": 64}
	tk["files"] = map[string]string{"/work/hello.txt": "hi\n", "/work/big.txt": strings.Repeat("x", 500)}
	var opened struct {
		ID       string
		Messages []struct{ Role, Content string }
		Tools    []struct {
			Type     string
			Function struct{ Name string }
		}
	}
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": tk}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	if len(opened.Messages) != 2 || opened.Messages[1].Content != tk["prompt"] || len(opened.Tools) != 2 ||
		opened.Tools[0].Type != "function" || opened.Tools[0].Function.Name != "bash" {
		t.Fatalf("opened: %+v", opened)
	}
	type result struct {
		Results []struct {
			CallID    string  `json:"call_id"`
			Output    string  `json:"output"`
			ErrorKind *string `json:"error_kind"`
			ExitCode  *int    `json:"exit_code"`
			Truncated bool    `json:"truncated"`
		}
		Done bool
	}
	var r result
	step := func(calls ...map[string]any) int {
		r = result{}
		code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/step", map[string]any{"tool_calls": calls}, &r)
		return code
	}
	// Arguments as the model's raw text, and as an object.
	if code := step(map[string]any{"id": "c1", "name": "bash", "arguments": `{"command": "cat hello.txt"}`},
		map[string]any{"id": "c2", "name": "bash", "arguments": map[string]any{"command": "cat big.txt"}}); code != 200 {
		t.Fatalf("step: %d", code)
	}
	if len(r.Results) != 2 || r.Results[0].CallID != "c1" || r.Results[0].Output != "hi\n" || *r.Results[0].ExitCode != 0 || r.Done {
		t.Errorf("first step: %+v", r)
	}
	if !r.Results[1].Truncated || *r.Results[1].ErrorKind != string(tools.KindOutputTruncated) || len(r.Results[1].Output) > 64 {
		t.Errorf("the task's output cap was not applied: %+v", r.Results[1])
	}
	if step(map[string]any{"name": "no_such_tool", "arguments": "{}"}); *r.Results[0].ErrorKind != string(tools.KindUnknownTool) || r.Results[0].CallID == "" {
		t.Errorf("unknown tool: %+v", r.Results[0])
	}
	var live trajectory.Trajectory
	s.do("GET", "/v1/episodes/"+opened.ID, nil, &live)
	if len(live.Steps) != 5 || live.Termination != nil || live.Policy.Kind != "env" {
		t.Errorf("live trajectory: %d steps, termination %+v", len(live.Steps), live.Termination)
	}
	// The third turn reaches max_turns 3: done.
	if step(map[string]any{"name": "bash", "arguments": `{"command":"true"}`}); !r.Done {
		t.Errorf("max_turns did not end the episode: %+v", r)
	}
	var e apiErr
	if code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/step", map[string]any{"tool_calls": []any{}, "content": "more"}, &e); code != http.StatusConflict {
		t.Errorf("a step after the end: %d %+v", code, e)
	}
	var fin struct {
		Reward      *trajectory.Reward
		Termination *trajectory.Termination
	}
	if code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/finish", map[string]any{"answer": "done"}, &fin); code != 200 {
		t.Fatalf("finish: %d", code)
	}
	if fin.Termination.Reason != trajectory.EndMaxTurns || fin.Reward == nil {
		t.Errorf("finish after max_turns: %+v %+v", fin.Termination, fin.Reward)
	}

	// A second episode finished by the caller gets its reward.
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": task("env2")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	step(map[string]any{"name": "bash", "arguments": `{"command":"echo hi > out.txt"}`})
	if code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/finish", map[string]any{"answer": "done"}, &fin); code != 200 {
		t.Fatalf("finish: %d", code)
	}
	if fin.Reward == nil || *fin.Reward.Total != 1 || fin.Termination.Reason != trajectory.EndFinished {
		t.Errorf("finish: %+v %+v", fin.Reward, fin.Termination)
	}
	// The record stays readable; the episode is no longer open.
	var tr trajectory.Trajectory
	if code, _ := s.do("GET", "/v1/episodes/"+opened.ID, nil, &tr); code != 200 || tr.Reward == nil || *tr.Reward.Total != 1 || len(tr.Steps) != 2 {
		t.Errorf("GET after finish: %d %+v", code, tr.Reward)
	}
	if code, _ := s.do("DELETE", "/v1/episodes/"+opened.ID, nil, nil); code != 404 {
		t.Errorf("DELETE of a finished episode: %d", code)
	}

	// DELETE closes an open one: cancelled, sandbox stopped.
	before := len(be.Live())
	s.do("POST", "/v1/episodes", map[string]any{"task": task("env3")}, &opened)
	if code, _ := s.do("DELETE", "/v1/episodes/"+opened.ID, nil, nil); code != 200 {
		t.Errorf("DELETE: %d", code)
	}
	if len(be.Live()) != before {
		t.Errorf("the closed episode's sandbox is still live")
	}
	s.do("GET", "/v1/episodes/"+opened.ID, nil, &tr)
	if tr.Termination == nil || tr.Termination.Reason != trajectory.EndCancelled {
		t.Errorf("after DELETE: %+v", tr.Termination)
	}
}

func TestIdleEnvironmentEpisodesAreClosed(t *testing.T) {
	s := startService(t, "", func(o *runtime.Options) { o.Limits.EnvIdleTimeout = 200 * time.Millisecond })
	var opened struct{ ID string }
	s.do("POST", "/v1/episodes", map[string]any{"task": task("idle")}, &opened)
	deadline := time.Now().Add(5 * time.Second)
	for {
		var e apiErr
		code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/step", map[string]any{"tool_calls": []any{}, "content": "hello"}, &e)
		if code == 404 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle episode was not closed")
		}
		time.Sleep(300 * time.Millisecond) // idle longer than the timeout
	}
	var tr trajectory.Trajectory
	s.do("GET", "/v1/episodes/"+opened.ID, nil, &tr)
	if tr.Termination == nil || tr.Termination.Reason != trajectory.EndCancelled || !strings.Contains(tr.Termination.Message, "idle") {
		t.Errorf("reaped episode: %+v", tr.Termination)
	}
}

func TestBadInputIsA4xxNamingTheField(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{})
	s := startService(t, "")
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": task("env")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	good := func(mut func(map[string]any)) map[string]any {
		b := rolloutBody(p, 2, task("a"))
		mut(b)
		return b
	}
	bad := task("a")
	bad["limits"] = map[string]any{"max_turns": -1}
	badBackend := task("a")
	badBackend["sandbox"] = map[string]any{"backend": "vm"}
	badReward := task("a")
	badReward["reward"] = map[string]any{"type": "tets"}
	cases := []struct {
		name, method, path string
		body               any
		status             int
		field              string
	}{
		{"malformed JSON", "POST", "/v1/rollouts", `{"tasks": [`, 400, ""},
		{"an empty body", "POST", "/v1/rollouts", ``, 400, ""},
		{"an unknown field", "POST", "/v1/rollouts", good(func(b map[string]any) { b["grup_size"] = 2 }), 400, "grup_size"},
		{"an unknown policy field", "POST", "/v1/rollouts", good(func(b map[string]any) { b["policy"].(map[string]any)["url"] = "x" }), 400, "policy.url"},
		{"an unknown sampling field", "POST", "/v1/rollouts", good(func(b map[string]any) {
			b["policy"].(map[string]any)["sampling"] = map[string]any{"temp": 1}
		}), 400, "policy.sampling.temp"},
		{"a wrong type", "POST", "/v1/rollouts", good(func(b map[string]any) { b["group_size"] = "four" }), 400, "group_size"},
		{"no tasks", "POST", "/v1/rollouts", good(func(b map[string]any) { delete(b, "tasks") }), 400, "tasks"},
		{"empty tasks", "POST", "/v1/rollouts", good(func(b map[string]any) { b["tasks"] = []any{} }), 400, "tasks"},
		{"a bad task limit", "POST", "/v1/rollouts", good(func(b map[string]any) { b["tasks"] = []any{task("ok"), bad} }), 400, "tasks[1].limits.max_turns"},
		{"a bad backend in a task", "POST", "/v1/rollouts", good(func(b map[string]any) { b["tasks"] = []any{badBackend} }), 400, "tasks[0].sandbox.backend"},
		{"a bad reward type", "POST", "/v1/rollouts", good(func(b map[string]any) { b["tasks"] = []any{badReward} }), 400, "tasks[0].reward.type"},
		{"a task without a prompt", "POST", "/v1/rollouts", good(func(b map[string]any) { b["tasks"] = []any{map[string]any{"id": "x", "prompt": ""}} }), 400, "tasks[0].prompt"},
		{"an unknown task id", "POST", "/v1/rollouts", good(func(b map[string]any) { b["tasks"] = []any{map[string]any{"id": "nope"}} }), 400, "tasks[0].id"},
		{"a duplicate task", "POST", "/v1/rollouts", good(func(b map[string]any) { b["tasks"] = []any{task("a"), task("a")} }), 400, "tasks[1].id"},
		{"a host workspace", "POST", "/v1/rollouts", good(func(b map[string]any) {
			tk := task("w")
			tk["workspace"] = map[string]any{"from": "/etc"}
			b["tasks"] = []any{tk}
		}), 400, "tasks[0].workspace"},
		{"group_size zero", "POST", "/v1/rollouts", good(func(b map[string]any) { b["group_size"] = -1 }), 400, "group_size"},
		{"group_size too big", "POST", "/v1/rollouts", good(func(b map[string]any) { b["group_size"] = 5000 }), 400, "group_size"},
		{"no policy", "POST", "/v1/rollouts", good(func(b map[string]any) { delete(b, "policy") }), 400, "policy"},
		{"no base_url", "POST", "/v1/rollouts", good(func(b map[string]any) { delete(b["policy"].(map[string]any), "base_url") }), 400, "policy.base_url"},
		{"a base_url that is no URL", "POST", "/v1/rollouts", good(func(b map[string]any) { b["policy"].(map[string]any)["base_url"] = "localhost:8000" }), 400, "policy.base_url"},
		{"no model", "POST", "/v1/rollouts", good(func(b map[string]any) { delete(b["policy"].(map[string]any), "model") }), 400, "policy.model"},
		{"a bad temperature", "POST", "/v1/rollouts", good(func(b map[string]any) {
			b["policy"].(map[string]any)["sampling"] = map[string]any{"temperature": -1}
		}), 400, "policy.sampling.temperature"},
		{"a bad backend", "POST", "/v1/rollouts", good(func(b map[string]any) { b["backend"] = "vm" }), 400, "backend"},
		{"a bad override", "POST", "/v1/rollouts", good(func(b map[string]any) { b["overrides"] = map[string]any{"limits": map[string]any{"max_turns": 20000}} }), 400, "overrides.limits.max_turns"},
		{"an unknown rollout", "GET", "/v1/rollouts/r-nope", nil, 404, "id"},
		{"episodes of an unknown rollout", "GET", "/v1/rollouts/r-nope/episodes?stream=1", nil, 404, "id"},
		{"a bad export format", "GET", "/v1/rollouts/r-nope/export?format=csv", nil, 404, "id"},
		{"an unknown route", "GET", "/v2/nothing", nil, 404, ""},
		{"env: no task", "POST", "/v1/episodes", map[string]any{}, 400, "task"},
		{"env: a bad task", "POST", "/v1/episodes", map[string]any{"task": bad}, 400, "task.limits.max_turns"},
		{"env: an unknown field", "POST", "/v1/episodes", map[string]any{"task": task("x"), "tsk": 1}, 400, "tsk"},
		{"env: malformed JSON", "POST", "/v1/episodes", `{"task": {`, 400, ""},
		{"step: an unknown episode", "POST", "/v1/episodes/e-nope/step", map[string]any{"tool_calls": []any{}}, 404, "id"},
		{"step: no tool_calls", "POST", "/v1/episodes/" + opened.ID + "/step", map[string]any{}, 400, "tool_calls"},
		{"step: a call without a name", "POST", "/v1/episodes/" + opened.ID + "/step", map[string]any{"tool_calls": []any{map[string]any{"id": "1"}}}, 400, "tool_calls[0].name"},
		{"step: arguments that are a number", "POST", "/v1/episodes/" + opened.ID + "/step", map[string]any{"tool_calls": []any{map[string]any{"name": "bash", "arguments": 3}}}, 400, "tool_calls[0].arguments"},
		{"step: an unknown field", "POST", "/v1/episodes/" + opened.ID + "/step", map[string]any{"tool_calls": []any{}, "tool_call": 1}, 400, "tool_call"},
		{"step: malformed JSON", "POST", "/v1/episodes/" + opened.ID + "/step", `{`, 400, ""},
		{"finish: a wrong type", "POST", "/v1/episodes/" + opened.ID + "/finish", map[string]any{"answer": 3}, 400, "answer"},
		{"finish: an unknown episode", "POST", "/v1/episodes/e-nope/finish", map[string]any{}, 404, "id"},
		{"get: an unknown episode", "GET", "/v1/episodes/e-nope", nil, 404, "id"},
		{"delete: an unknown episode", "DELETE", "/v1/episodes/e-nope", nil, 404, "id"},
	}
	for _, c := range cases {
		t.Run(c.name+" is refused", func(t *testing.T) {
			var e apiErr
			code, h := s.do(c.method, c.path, c.body, &e)
			if code != c.status || e.Error.Field != c.field || e.Error.Message == "" || e.Error.Code == "" {
				t.Errorf("%d %+v, want %d naming %q", code, e.Error, c.status, c.field)
			}
			if ct := h.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
	// A validator's message is passed through.
	var e apiErr
	s.do("POST", "/v1/rollouts", good(func(b map[string]any) { b["tasks"] = []any{badReward} }), &e)
	if !strings.Contains(e.Error.Message, `"tets" is not one of`) {
		t.Errorf("message %q", e.Error.Message)
	}
	// Nothing bad was admitted.
	var list struct{ Rollouts []status }
	s.do("GET", "/v1/rollouts", nil, &list)
	if len(list.Rollouts) != 0 {
		t.Errorf("bad requests created rollouts: %+v", list.Rollouts)
	}
}

func TestAnUnreachablePolicyFailsItsEpisodesAndTheServiceStaysHealthy(t *testing.T) {
	s := startService(t, "")
	body := map[string]any{"tasks": []any{task("a")}, "group_size": 3,
		"policy": map[string]any{"base_url": "http://127.0.0.1:1/v1", "model": "m", "max_retries": 0}}
	id := s.submit(body)
	st := s.waitState(id, 20*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	if st.Ends["policy_error"] != 3 || st.RewardMean != nil {
		t.Errorf("status %+v", st)
	}
	for _, e := range s.episodes(id, "?stream=1") {
		if e.Termination.Reason != trajectory.EndPolicyError || e.Reward != nil || e.Group == nil || !e.Group.ZeroVariance {
			t.Errorf("episode %s: %+v reward %+v group %+v", e.EpisodeID, e.Termination, e.Reward, e.Group)
		}
	}
	var h runtime.Health
	if code, _ := s.do("GET", "/healthz", nil, &h); code != 200 || h.Status != "ok" {
		t.Errorf("healthz: %d %+v", code, h)
	}
	// And it still runs a rollout against a working policy.
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	ok := s.submit(rolloutBody(p, 1, task("a")))
	if st := s.waitState(ok, 20*time.Second, func(st status) bool { return st.State == runtime.RolloutDone }); st.Ends["finished"] != 1 {
		t.Errorf("after the unreachable policy: %+v", st)
	}
	if !strings.Contains(s.metrics(), `rollbox_policy_errors_total{endpoint="http://127.0.0.1:1/v1"} 3`) {
		t.Error("policy errors not counted")
	}
}

// flakyBackends fails the first n creates with an engine error.
type flakyBackends struct {
	inner runtime.BackendSource
	fail  atomic.Int64
}

func (f *flakyBackends) Backend(ctx context.Context, name string) (sandbox.Backend, error) {
	be, err := f.inner.Backend(ctx, name)
	if err != nil {
		return nil, err
	}
	return flakyBackend{be, f}, nil
}

type flakyBackend struct {
	sandbox.Backend
	f *flakyBackends
}

func (b flakyBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if b.f.fail.Add(-1) >= 0 {
		return nil, fmt.Errorf("the engine broke: %w", sandbox.ErrSandboxFailed)
	}
	return b.Backend.Create(ctx, spec)
}

func TestASandboxFailureBeforeThePolicyIsRetriedAndCounted(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	flaky := &flakyBackends{inner: wasmBackends(t)}
	flaky.fail.Store(1)
	s := startService(t, "", func(o *runtime.Options) { o.Backends = flaky })
	id := s.submit(rolloutBody(p, 1, task("a")))
	st := s.waitState(id, 20*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	if st.Ends["finished"] != 1 || st.InfraRetries != 1 {
		t.Errorf("status %+v", st)
	}
	if m, _ := filepath.Glob(filepath.Join(s.data, "attempts", "*.json")); len(m) != 1 {
		t.Errorf("the failed attempt's record: %v", m)
	}
	if !strings.Contains(s.metrics(), `rollbox_infra_retries_total{backend="wasm"} 1`) {
		t.Error("the retry is not counted")
	}
	var sum runtime.Summary
	if s.do("GET", "/v1/rollouts/"+id+"/summary", nil, &sum); sum.InfraRetries != 1 || sum.Episodes != 1 {
		t.Errorf("summary: %+v", sum)
	}
	// Past the attempts bound the episode ends sandbox_error, unscored.
	flaky.fail.Store(10)
	id = s.submit(rolloutBody(p, 1, task("b")))
	st = s.waitState(id, 20*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	if st.Ends["sandbox_error"] != 1 || st.InfraRetries != 2 {
		t.Errorf("status %+v", st)
	}
}

func TestARestartRecordsWhatACrashLeftInFlightAsInterrupted(t *testing.T) {
	p, release := blockingPolicy(t)
	a := startService(t, "", func(o *runtime.Options) { o.Limits.MaxRunning = 1 })
	id := a.submit(rolloutBody(p, 3, task("a")))
	// Episode 0 has taken a turn and waits on the policy; 1 and 2 are queued.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if j, _ := filepath.Glob(filepath.Join(a.data, "episodes", "*.partial")); len(j) == 1 {
			if b, _ := os.ReadFile(j[0]); strings.Count(string(b), `"k":"step"`) == 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("episode 0 did not take its first turn")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The crash: what is on disk now is what a killed process leaves. The
	// new server starts on a copy of it (the old one still holds the
	// database's lock in this process).
	crashed := t.TempDir()
	copyDir(t, a.data, crashed)
	release()

	b := startService(t, crashed)
	if len(b.rec.Interrupted) != 3 || len(b.rec.Rollouts) != 1 {
		t.Errorf("recovery %+v", b.rec)
	}
	st := b.status(id)
	if st.State != runtime.RolloutCancelled || !st.Interrupted || st.EpisodesDone != 3 || st.Ends["interrupted"] != 3 {
		t.Errorf("status after the restart %+v", st)
	}
	var list struct{ Rollouts []status }
	b.do("GET", "/v1/rollouts", nil, &list)
	if len(list.Rollouts) != 1 || list.Rollouts[0].State != runtime.RolloutCancelled || !list.Rollouts[0].Interrupted {
		t.Errorf("listing %+v", list)
	}
	eps := b.episodes(id, "?stream=1")
	if len(eps) != 3 {
		t.Fatalf("%d episodes listed after the restart, want 3", len(eps))
	}
	for _, e := range eps {
		if e.Termination.Reason != trajectory.EndInterrupted || e.Reward != nil || e.Group == nil {
			t.Errorf("episode %s: %+v", e.EpisodeID, e.Termination)
		}
		if e.GroupIndex == 0 && (len(e.Steps) != 2 || e.Stats.Turns != 1 || e.Stats.ToolCalls != 1) {
			t.Errorf("the episode in flight kept %d steps (stats %+v), want its 2", len(e.Steps), e.Stats)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(crashed, "episodes", "*.partial")); len(m) != 0 {
		t.Errorf("journals left: %v", m)
	}
	if !strings.Contains(b.metrics(), "rollbox_recovered_episodes_total 3") {
		t.Error("recovered episodes not counted")
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.Walk(from, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if info.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestTheOpenAPIDocumentCoversEveryRouteAndNoOther(t *testing.T) {
	s := startService(t, "")
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
		Comps   map[string]map[string]any `json:"components"`
	}
	if code, _ := s.do("GET", "/openapi.json", nil, &doc); code != 200 {
		t.Fatalf("GET /openapi.json: %d", code)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi %q", doc.OpenAPI)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			if method == "parameters" {
				continue
			}
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	served := map[string]bool{}
	for _, r := range s.srv.Routes() {
		served[r.Method+" "+r.Path] = true
		if !documented[r.Method+" "+r.Path] {
			t.Errorf("%s %s is served but not documented", r.Method, r.Path)
		}
	}
	for r := range documented {
		if !served[r] {
			t.Errorf("%s is documented but not served", r)
		}
	}
	// Every route is really served by the mux (not the catch-all 404).
	for _, r := range s.srv.Routes() {
		path := strings.ReplaceAll(r.Path, "{id}", "x")
		req, _ := http.NewRequest(r.Method, s.url+path, strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 404 && strings.Contains(string(b), `"no route`) {
			t.Errorf("%s %s is not routed", r.Method, r.Path)
		}
	}
	// Every $ref resolves.
	raw := runtime.OpenAPI()
	for _, m := range refRe(raw) {
		name := strings.TrimPrefix(m, "#/components/schemas/")
		if _, ok := doc.Comps["schemas"][name]; !ok {
			t.Errorf("dangling $ref %s", m)
		}
	}
}

func refRe(doc []byte) []string {
	var out []string
	s := string(doc)
	for {
		i := strings.Index(s, `"$ref": "`)
		if i < 0 {
			return out
		}
		s = s[i+len(`"$ref": "`):]
		j := strings.IndexByte(s, '"')
		out = append(out, s[:j])
		s = s[j:]
	}
}

func TestExportsRoundTripAsJSONLAndParquet(t *testing.T) {
	var n atomic.Int64
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string {
		if n.Add(1)%2 == 0 {
			return "done"
		}
		return "no"
	})})
	s := startService(t, "")
	id := s.submit(rolloutBody(p, 2, task("a"), task("b")))
	streamed := s.episodes(id, "?stream=1")
	byID := map[string]*trajectory.Trajectory{}
	for _, e := range streamed {
		byID[e.EpisodeID] = e
	}

	resp, err := http.Get(s.url + "/v1/rollouts/" + id + "/export?format=jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := readNDJSON(t, resp.Body)
	resp.Body.Close()
	if len(lines) != 4 {
		t.Fatalf("JSONL export has %d lines", len(lines))
	}
	for _, l := range lines {
		if l.Group == nil || l.Group.Advantage != byID[l.EpisodeID].Group.Advantage {
			t.Errorf("JSONL %s: group %+v", l.EpisodeID, l.Group)
		}
	}

	resp, err = http.Get(s.url + "/v1/rollouts/" + id + "/export?format=parquet")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.HasPrefix(b, []byte("PAR1")) {
		t.Fatalf("parquet export: %d %.20q", resp.StatusCode, b)
	}
	rows, err := runtime.ReadParquet(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d parquet rows", len(rows))
	}
	for _, r := range rows {
		tr := byID[r.EpisodeID]
		if tr == nil {
			t.Fatalf("row for unknown episode %s", r.EpisodeID)
		}
		if r.RolloutID != id || r.TaskID != tr.TaskID || r.Termination != "finished" || r.Turns != 2 || !r.Scored ||
			*r.RewardTotal != *tr.Reward.Total || *r.Advantage != tr.Group.Advantage || *r.ZeroVariance != tr.Group.ZeroVariance ||
			*r.GroupRewardMean != tr.Group.RewardMean || r.Backend != "wasm" || *r.Answer != *tr.Termination.Answer {
			t.Errorf("row %+v does not match its trajectory", r)
		}
		var comps map[string]float64
		if err := json.Unmarshal([]byte(r.RewardComponents), &comps); err != nil || len(comps) == 0 {
			t.Errorf("components %q", r.RewardComponents)
		}
		var msgs []struct {
			Role    string
			Content string
		}
		if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil || len(msgs) != 5 || msgs[0].Role != "user" ||
			msgs[2].Role != "tool" || msgs[2].Content != "hi\n" {
			t.Errorf("messages %s", r.Messages)
		}
		var steps []trajectory.Step
		if err := json.Unmarshal([]byte(r.Steps), &steps); err != nil || len(steps) != 4 {
			t.Errorf("steps: %v", err)
		}
	}
	var e apiErr
	if code, _ := s.do("GET", "/v1/rollouts/"+id+"/export?format=csv", nil, &e); code != 400 || e.Error.Field != "format" {
		t.Errorf("a bad format: %d %+v", code, e)
	}

	// The same from the directory, offline.
	ts, skipped, err := runtime.LoadEpisodes(filepath.Join(s.data, "episodes"), id)
	if err != nil || len(ts) != 4 || len(skipped) != 0 {
		t.Fatalf("LoadEpisodes: %d %v", len(ts), err)
	}
	for _, tr := range ts {
		if tr.Group == nil || tr.Group.Advantage != byID[tr.EpisodeID].Group.Advantage {
			t.Errorf("offline group stats of %s: %+v", tr.EpisodeID, tr.Group)
		}
	}
}

func percentilesOf(xs []float64) [2]float64 {
	if len(xs) == 0 {
		return [2]float64{}
	}
	sort.Float64s(xs)
	at := func(q float64) float64 { return xs[min(len(xs)-1, int(math.Ceil(q*float64(len(xs))))-1)] }
	return [2]float64{at(0.5), at(0.99)}
}

func TestAnEndedRolloutLeavesMemoryAndIsReadBackFromTheStore(t *testing.T) {
	var n atomic.Int64
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string {
		if n.Add(1)%2 == 0 {
			return "done"
		}
		return "no"
	})})
	s := startService(t, "", func(o *runtime.Options) { o.Limits.KeepEnded = 10 * time.Millisecond })
	id := s.submit(rolloutBody(p, 2, task("a"), task("b")))
	live := s.episodes(id, "?stream=1")
	before := s.status(id)
	time.Sleep(100 * time.Millisecond) // forgotten: the next requests read the store
	after := s.status(id)
	if after.State != before.State || after.EpisodesDone != 4 || *after.RewardMean != *before.RewardMean || after.Ends["finished"] != 4 {
		t.Errorf("read back %+v, was %+v", after, before)
	}
	again := s.episodes(id, "?stream=1")
	if len(again) != 4 {
		t.Fatalf("%d episodes read back", len(again))
	}
	adv := map[string]float64{}
	for _, e := range live {
		adv[e.EpisodeID] = e.Group.Advantage
	}
	for _, e := range again {
		if e.Group == nil || e.Group.Advantage != adv[e.EpisodeID] {
			t.Errorf("episode %s read back with group %+v, streamed with advantage %v", e.EpisodeID, e.Group, adv[e.EpisodeID])
		}
	}
}

func TestTheRolloutStatusAndSummaryCountTruncatedStepsBesideErrorKinds(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.Script(
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command":"seq 1 3000; exit 2"}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer":"done"}`}}},
	)})
	s := startService(t, "")
	tk := task("cut")
	tk["limits"] = map[string]any{"max_turns": 6, "max_tool_output_bytes": 500}
	id := s.submit(rolloutBody(p, 3, tk))
	s.waitState(id, time.Minute, func(st status) bool { return st.State == runtime.RolloutDone })
	check := func(s *service, when string) {
		t.Helper()
		var st struct {
			ToolErrors map[string]int         `json:"tool_errors"`
			Truncated  trajectory.Truncations `json:"truncated"`
		}
		s.do("GET", "/v1/rollouts/"+id, nil, &st)
		var sum runtime.Summary
		s.do("GET", "/v1/rollouts/"+id+"/summary", nil, &sum)
		for _, got := range []struct {
			where      string
			truncated  trajectory.Truncations
			toolErrors map[string]int
		}{{"status", st.Truncated, st.ToolErrors}, {"summary", sum.Truncated, sum.ToolErrors}} {
			if got.truncated.Total != 3 || got.truncated.Tools["bash"] != 3 || len(got.truncated.Tools) != 1 || got.toolErrors["nonzero_exit"] != 3 {
				t.Errorf("%s %s: truncated %+v beside tool errors %v, want 3 bash steps beside nonzero_exit=3", when, got.where, got.truncated, got.toolErrors)
			}
		}
	}
	check(s, "live")
	// A restarted service reads the counts back from its store.
	again := t.TempDir()
	copyDir(t, s.data, again)
	check(startService(t, again), "after a restart")
}
