package runtime_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// countLines answers the prefix's log line count and finishes with it: a
// group whose prefix ran once in each sandbox scores 1.
var countLines = policyFunc(func(_ context.Context, req agent.Request) (agent.Turn, error) {
	last := req.Messages[len(req.Messages)-1]
	if last.Role == agent.RoleTool && strings.Contains(last.Content, "lines=") {
		_, n, _ := strings.Cut(last.Content, "lines=")
		return agent.Turn{ToolCalls: []agent.ToolCall{{ID: "f", Name: "finish", Arguments: fmt.Sprintf(`{"answer": %q}`, strings.TrimSpace(n))}}}, nil
	}
	return agent.Turn{ToolCalls: []agent.ToolCall{{ID: "c", Name: "bash", Arguments: `{"command": "echo lines=$(wc -l < /work/log.txt)"}`}}}, nil
})

const prefixTask = `{"id": "pre", "prompt": "p", "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "1"},
 "limits": {"max_turns": 6}, "prefix": %s}`

// runPrefixed runs a group of n episodes of the task (JSON, read as if from
// a file in dir) on WASM and returns the summary and how many sandboxes
// the factory made.
func runPrefixed(t *testing.T, task, dir string, n int, create func(context.Context, sandbox.Spec) (sandbox.Sandbox, error)) (*runtime.Summary, string, int64, error) {
	t.Helper()
	tasks, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(task), " ")), filepath.Join(dir, "tasks.jsonl"), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	var made atomic.Int64
	sum, err := runtime.RunBatch(context.Background(), runtime.BatchConfig{Tasks: tasks, OutDir: out, Backend: "wasm", Group: n,
		NewSandbox: func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
			made.Add(1)
			return create(ctx, spec)
		},
		Policy: countLines, PolicyInfo: trajectory.Policy{Kind: "test"}})
	return sum, out, made.Load(), err
}

// A task's prefix runs once per group, in one sandbox: every episode of
// the group is a fork of it (its files, the prefix's steps first in its
// record, forked_from the prefix's own record) and goes on by itself; the
// prefix's record is kept apart from the episodes. The first k steps of a
// recorded trajectory make a prefix too.
func TestAGroupBranchesFromOneSandboxThatRanTheTasksPrefixOnce(t *testing.T) {
	be := wasmtest.Backend(t)
	create := func(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) { return be.Create(ctx, spec) }
	scripted := `{"turns": [{"content": "setting up", "tool_calls": [{"name": "bash", "arguments": {"command": "echo once >> /work/log.txt"}}]}]}`
	dir := t.TempDir()
	sum, out, made, err := runPrefixed(t, fmt.Sprintf(prefixTask, scripted), dir, 4, create)
	if err != nil {
		t.Fatal(err)
	}
	if made != 1 {
		t.Errorf("%d sandboxes made for a group of 4 with a prefix, want 1 (the prefix's; the episodes' are its forks)", made)
	}
	if sum.Episodes != 4 || sum.Scored != 4 || sum.RewardMean == nil || *sum.RewardMean != 1 {
		t.Fatalf("summary: %d episodes, %d scored, mean %v; want 4 episodes that each saw the prefix's one line", sum.Episodes, sum.Scored, sum.RewardMean)
	}
	gid := sum.RolloutID + ".pre"
	for i := range 4 {
		tr, err := trajectory.Read(filepath.Join(out, "episodes", fmt.Sprintf("%s.%d.json", gid, i)))
		if err != nil {
			t.Fatal(err)
		}
		if tr.ForkedFrom == nil || tr.ForkedFrom.EpisodeID != gid+".prefix" || tr.ForkedFrom.Step != 2 ||
			tr.Steps[0].Content != "setting up" || tr.GroupIndex != i || tr.Seed != int64(i) || tr.Pinned[agent.PinSeed] != fmt.Sprint(i) ||
			tr.Pinned[agent.PinEpisodeID] != tr.EpisodeID || len(tr.Steps) != 6 {
			t.Errorf("episode %d: forked_from %+v, group index %d, seed %d, pins %v, %d steps (first %q)",
				i, tr.ForkedFrom, tr.GroupIndex, tr.Seed, tr.Pinned, len(tr.Steps), tr.Steps[0].Content)
		}
	}
	pre, err := trajectory.Read(filepath.Join(out, "prefixes", gid+".prefix.json"))
	if err != nil || pre.Termination == nil || !strings.Contains(pre.Termination.Message, "prefix done: 4 episodes") || len(pre.Steps) != 2 {
		t.Fatalf("the prefix's record: %+v, %v", pre, err)
	}

	// The first 2 steps of one of those records as the prefix of another
	// task: the same again.
	b, err := os.ReadFile(filepath.Join(out, "episodes", gid+".0.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rec.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	sum, _, made, err = runPrefixed(t, fmt.Sprintf(prefixTask, `{"trajectory": "rec.json", "steps": 2}`), dir, 3, create)
	if err != nil || made != 1 || sum.Scored != 3 || sum.RewardMean == nil || *sum.RewardMean != 1 {
		t.Fatalf("a recorded prefix: %v, %d sandboxes, summary %+v", err, made, sum)
	}
}

// A prefix whose sandbox cannot be made fails each episode of the group as
// the infrastructure's failure (retried, then recorded sandbox_error naming
// the prefix); none is left open.
func TestAPrefixThatCannotRunFailsItsEpisodesAsInfrastructure(t *testing.T) {
	scripted := `{"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}]}`
	broken := func(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
		return nil, fmt.Errorf("engine hiccup: %w", sandbox.ErrSandboxFailed)
	}
	sum, out, made, _ := runPrefixed(t, fmt.Sprintf(prefixTask, scripted), t.TempDir(), 2, broken)
	if sum.Ends[trajectory.EndSandboxError] != 2 || sum.InfraRetries != 4 || made != 6 {
		t.Fatalf("ends %v, %d retries, %d sandboxes tried; want 2 sandbox_error after 3 attempts each", sum.Ends, sum.InfraRetries, made)
	}
	tr, err := trajectory.Read(filepath.Join(out, "episodes", sum.RolloutID+".pre.1.json"))
	if err != nil || !strings.Contains(tr.Termination.Message, "run the prefix: prefix "+sum.RolloutID+".pre.prefix") {
		t.Errorf("the episode's end: %+v %v", tr.Termination, err)
	}
}

// A prefix is refused at load, naming the field, when it could not be
// what it says.
func TestABadPrefixIsRefusedAtLoad(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rec.json"), []byte(`{"schema": "rollbox.trajectory/v1", "episode_id": "e", "steps": [
	 {"index": 0, "type": "model", "turn": 0, "tool_calls": [{"id": "a", "name": "bash", "arguments": "{}"}]},
	 {"index": 1, "type": "tool", "turn": 0}]}`), 0o644)
	for _, c := range []struct{ name, prefix, file, want string }{
		{"calling finish", `{"turns": [{"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`, "f", "prefix: turn 0 calls finish"},
		{"both forms", `{"turns": [{"content": "x"}], "trajectory": "rec.json", "steps": 1}`, "f", "not both"},
		{"neither", `{}`, "f", "give turns or trajectory"},
		{"a nameless call", `{"turns": [{"tool_calls": [{"arguments": {}}]}]}`, "f", "prefix.turns[0].tool_calls[0].name: required"},
		{"as many turns as max_turns", `{"turns": [{}, {}, {}, {}, {}, {}]}`, "f", "leave none of limits.max_turns"},
		{"a recording outside the task's directory", `{"trajectory": "../x.json", "steps": 1}`, "f", "not a path inside"},
		{"a recording in a task sent inline", `{"trajectory": "rec.json", "steps": 1}`, "", "only in a task file"},
		{"steps ending inside a turn", `{"trajectory": "rec.json", "steps": 1}`, "f", "prefix.steps: 1 ends inside turn 0"},
		{"more steps than recorded", `{"trajectory": "rec.json", "steps": 3}`, "f", "prefix.steps: 3 is outside 1..2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := ""
			if c.file != "" {
				name = filepath.Join(dir, "tasks.jsonl")
			}
			_, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(fmt.Sprintf(prefixTask, c.prefix)), " ")), name, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error with %q", err, c.want)
			}
		})
	}
	if _, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(fmt.Sprintf(prefixTask, `{"trajectory": "rec.json", "steps": 2}`)), " ")), filepath.Join(dir, "tasks.jsonl"), nil); err != nil {
		t.Errorf("a whole turn of a recording: %v", err)
	}
}

// Through the service: a rollout of a task with a prefix runs it once per
// group (every episode forked_from the group's prefix, the prefix's
// files there); environment mode refuses such a task, naming the field.
func TestTheServiceRunsATasksPrefixOncePerGroup(t *testing.T) {
	_, own := ownWasm(t)
	s := startService(t, "", own)
	// cat hello.txt, then finish "done" once it holds the prefix's line.
	p := startPolicy(t, fakepolicy.Config{Responder: func(req *fakepolicy.Request) fakepolicy.Reply {
		if last := req.Messages[len(req.Messages)-1]; last.Role == "tool" && strings.Contains(last.Content, "hi\nprefix") {
			return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "done"}`}}}
		}
		return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command": "cat hello.txt"}`}}}
	}})
	tk := task("pre")
	tk["prefix"] = map[string]any{"turns": []any{map[string]any{"tool_calls": []any{
		map[string]any{"name": "bash", "arguments": map[string]any{"command": "echo prefix >> hello.txt"}}}}}}
	id := s.submit(rolloutBody(p, 3, tk))
	st := s.waitState(id, time.Minute, func(st status) bool { return st.EpisodesDone == 3 })
	if st.State != "done" || st.Ends["finished"] != 3 || st.RewardMean == nil || *st.RewardMean != 1 {
		t.Fatalf("rollout: %+v", st)
	}
	for _, tr := range s.episodes(id, "") {
		if tr.ForkedFrom == nil || tr.ForkedFrom.EpisodeID != tr.GroupID+".prefix" || tr.ForkedFrom.Step != 2 {
			t.Errorf("%s: forked_from %+v", tr.EpisodeID, tr.ForkedFrom)
		}
	}
	var e apiErr
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": tk}, &e); code != 400 || e.Error.Field != "task.prefix" {
		t.Errorf("an env episode of a prefixed task: %d %+v", code, e)
	}
}

// A group's forks are made as its episodes open, not all at once when the
// first one does: with one episode in flight, a group of 6 never holds
// more live sandboxes than that episode's and its prefix's (kept while the
// group's episodes are still to open), where forking the whole group up
// front held 6 idle ones beside it. The prefix still runs once.
func TestAGroupsForksAreMadeAsItsEpisodesOpenSoTheyHoldNoIdleSandboxes(t *testing.T) {
	be := wasmtest.Backend(t)
	scripted := `{"turns": [{"content": "setting up", "tool_calls": [{"name": "bash", "arguments": {"command": "echo once >> /work/log.txt"}}]}]}`
	dir := t.TempDir()
	tasks, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(fmt.Sprintf(prefixTask, scripted)), " ")), filepath.Join(dir, "tasks.jsonl"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var peak atomic.Int64
	watch := policyFunc(func(ctx context.Context, req agent.Request) (agent.Turn, error) {
		if n := int64(len(be.Live())); n > peak.Load() {
			peak.Store(n)
		}
		return countLines.Next(ctx, req)
	})
	var made atomic.Int64
	sum, err := runtime.RunBatch(context.Background(), runtime.BatchConfig{Tasks: tasks, OutDir: t.TempDir(), Backend: "wasm", Group: 6, Concurrency: 1,
		NewSandbox: func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
			made.Add(1)
			return be.Create(ctx, spec)
		},
		Policy: watch, PolicyInfo: trajectory.Policy{Kind: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Scored != 6 || sum.RewardMean == nil || *sum.RewardMean != 1 || made.Load() != 1 {
		t.Fatalf("%d scored, mean %v, %d sandboxes made; want 6 episodes that each saw the prefix's one line, from 1 prefix sandbox", sum.Scored, sum.RewardMean, made.Load())
	}
	if p := peak.Load(); p > 2 {
		t.Errorf("%d sandboxes were live at once with one episode in flight; want at most 2 (the episode's and the prefix's)", p)
	}
	if live := be.Live(); len(live) != 0 {
		t.Errorf("left open after the batch: %v", live)
	}
}

// needContainerd is a containerd backend of the test's own with opts,
// closed (with what it made) at the end; it skips without containerd and
// the base image in it, and fails instead under CI=true.
func needContainerd(t *testing.T, opts containerd.Options) *containerd.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	skip := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("containerd required under CI=true: %s", why)
		}
		t.Skipf("no containerd: %s", why)
	}
	guest, err := images.NewBuilder(os.Stderr).Build(ctx, images.Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"})
	if err != nil {
		skip("building the guest agent: " + err.Error())
	}
	opts.GuestPath, opts.Owner = guest, dockerTestOwner
	be, err := containerd.New(ctx, opts)
	if err != nil {
		skip(err.Error())
	}
	t.Cleanup(func() {
		be.Close()
		containerd.Cleanup(context.Background(), be.Client(), dockerTestOwner)
	})
	sb, err := be.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		skip("a base container does not start (rollbox images build base): " + err.Error())
	}
	sb.Close()
	return be
}

// On containerd a group's prefix asks for its forks' sandboxes as it
// starts (sandbox.ForkPreparer), so while its turns run the backend makes
// them, and the group's forks take them ready: none of the 2 children is
// created cold (without the hint, the first fork's are).
func TestAPrefixOnContainerdForksIntoSandboxesMadeWhileItRuns(t *testing.T) {
	be := needContainerd(t, containerd.Options{ForkSpares: 2})
	task := strings.Replace(fmt.Sprintf(prefixTask, `{"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo one >> /work/log.txt; sleep 6"}}]}]}`),
		`"prompt"`, `"sandbox": {"backend": "containerd", "image": "base"}, "prompt"`, 1)
	sum, _, _, err := runPrefixed(t, task, t.TempDir(), 2, be.Create)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Episodes != 2 || sum.Scored != 2 || sum.RewardMean == nil || *sum.RewardMean != 1 {
		t.Fatalf("summary: %d episodes, %d scored, reward mean %v, ends %v", sum.Episodes, sum.Scored, sum.RewardMean, sum.Ends)
	}
	if st := be.ForkStats(); st.FromSpares != 2 || st.Cold != 0 {
		t.Errorf("fork children: %d from spares, %d created cold; want 2 and 0", st.FromSpares, st.Cold)
	}
}

// containerd episodes take warm sandboxes by default, as Docker's do: with
// one running at a time and the rest waiting, the pool (default size)
// makes sandboxes for the waiting ones, and they start in them.
func TestWaitingContainerdEpisodesStartInWarmSandboxes(t *testing.T) {
	be := needContainerd(t, containerd.Options{})
	hold, release := blockingPolicy(t)
	s := startService(t, "", func(o *runtime.Options) {
		o.Backends = runtime.BackendFunc(func(ctx context.Context, name string) (sandbox.Backend, error) {
			if name == sandbox.BackendContainerd {
				return be, nil
			}
			return wasmBackends(t).Backend(ctx, name)
		})
		o.Limits.MaxRunning = 1
	})
	tk := task("a")
	tk["sandbox"] = map[string]any{"backend": "containerd", "image": "base"}
	id := s.submit(rolloutBody(hold, 3, tk)) // 1 runs, 2 wait
	s.waitState(id, 60*time.Second, func(st status) bool { return st.Running == 1 })
	ready := regexp.MustCompile(`rollbox_sandbox_pool_ready\{backend="containerd"\} (\d+)`)
	deadline := time.Now().Add(60 * time.Second)
	for m := ready.FindStringSubmatch(s.metrics()); m == nil || m[1] == "0"; m = ready.FindStringSubmatch(s.metrics()) {
		if time.Now().After(deadline) {
			t.Fatalf("no warm containerd sandbox in 60 s: %v", m)
		}
		time.Sleep(50 * time.Millisecond)
	}
	release()
	if st := s.waitState(id, 90*time.Second, func(st status) bool { return st.State == runtime.RolloutDone }); st.Ends["finished"] != 3 {
		t.Errorf("status %+v", st)
	}
	hits := regexp.MustCompile(`rollbox_sandbox_pool_hits_total\{backend="containerd"\} (\d+)`).FindStringSubmatch(s.metrics())
	if n := 0; hits != nil {
		n, _ = strconv.Atoi(hits[1])
		if n < 1 {
			t.Errorf("no episode started in a warm sandbox: %s", hits[0])
		}
	} else {
		t.Error("no containerd pool hits metric")
	}
}
