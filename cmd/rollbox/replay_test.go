package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
)

// recordRun runs a task file with a scripted policy and returns the
// trajectories by task id, in a directory of the test's own.
func recordRun(t *testing.T, tasks, policy string) map[string]string {
	t.Helper()
	out := t.TempDir()
	if strings.HasPrefix(tasks, "../../examples/") && strings.HasPrefix(policy, "../../examples/") {
		// An example's run is the same for every test that reads it: run
		// it once and give each test a copy (seven tests read the coding
		// example's).
		if err := os.CopyFS(out, os.DirFS(exampleRun(t, tasks, policy))); err != nil {
			t.Fatal(err)
		}
	} else if code, _, stderr := rollbox(t, "run", "--tasks", tasks, "--policy", "scripted:"+policy, "--out", out); code != 0 {
		t.Fatalf("rollbox run: exit %d: %s", code, stderr)
	}
	files, _ := filepath.Glob(filepath.Join(out, "episodes", "*.json"))
	byTask := map[string]string{}
	for _, f := range files {
		tr, err := trajectory.Read(f)
		if err != nil {
			t.Fatal(err)
		}
		byTask[tr.TaskID] = f
	}
	return byTask
}

// exampleRuns are the example runs recordRun made, by task and policy file,
// under exampleRunsDir (removed by TestMain).
var (
	exampleRunsMu  sync.Mutex
	exampleRuns    = map[[2]string]*exampleRunResult{}
	exampleRunsDir string
)

type exampleRunResult struct {
	once sync.Once
	out  string
	err  error
}

// exampleRun runs an example's tasks with its scripted policy once per
// test binary and returns the run's directory (never to be written).
func exampleRun(t *testing.T, tasks, policy string) string {
	t.Helper()
	exampleRunsMu.Lock()
	r := exampleRuns[[2]string{tasks, policy}]
	if r == nil {
		r = &exampleRunResult{}
		exampleRuns[[2]string{tasks, policy}] = r
	}
	exampleRunsMu.Unlock()
	r.once.Do(func() {
		exampleRunsMu.Lock()
		if exampleRunsDir == "" {
			exampleRunsDir, r.err = os.MkdirTemp("", "rollbox-cmd-test-runs-")
		}
		base := exampleRunsDir
		exampleRunsMu.Unlock()
		if r.err != nil {
			return
		}
		r.out, r.err = os.MkdirTemp(base, "run-")
		if r.err != nil {
			return
		}
		if code, _, stderr := rollbox(t, "run", "--tasks", tasks, "--policy", "scripted:"+policy, "--out", r.out); code != 0 {
			r.err = fmt.Errorf("rollbox run: exit %d: %s", code, stderr)
		}
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.out
}

// editTrajectory copies a trajectory file with a change made to its JSON.
func editTrajectory(t *testing.T, file string, change func(doc map[string]any)) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	change(doc)
	b, _ = json.MarshalIndent(doc, "", " ")
	p := filepath.Join(t.TempDir(), filepath.Base(file))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func step(doc map[string]any, i int) map[string]any {
	return doc["steps"].([]any)[i].(map[string]any)
}

// firstToolStep is the index of the first tool step named name.
func firstToolStep(t *testing.T, file, name string) int {
	t.Helper()
	tr, err := trajectory.Read(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepTool && s.Name == name {
			return s.Index
		}
	}
	t.Fatalf("%s has no %s step", file, name)
	return -1
}

// replayEvidence is the evidence on one backend: a run's
// trajectory replays with no divergence; with one recorded output altered,
// the replay names that exact step as the first divergence and exits 1.
func replayEvidence(t *testing.T, file, alterTool string) {
	t.Helper()
	code, stdout, stderr := rollbox(t, "replay", file)
	if code != 0 || !strings.Contains(stdout, "no divergence") || !strings.Contains(stdout, "replayed finished") {
		t.Fatalf("replay of an untouched trajectory: exit %d\n%s\n%s", code, stdout, stderr)
	}
	at := firstToolStep(t, file, alterTool)
	altered := editTrajectory(t, file, func(doc map[string]any) {
		s := step(doc, at)
		s["output"] = strings.Replace(s["output"].(string), "\n", "\nsomething the sandbox never said\n", 1)
	})
	code, stdout, _ = rollbox(t, "replay", altered)
	if code != 1 {
		t.Fatalf("replay of an altered trajectory: exit %d, want 1\n%s", code, stdout)
	}
	want := fmt.Sprintf("first divergence at step %d (turn ", at)
	if !strings.Contains(stdout, want) || !strings.Contains(stdout, "-something the sandbox never said") {
		t.Errorf("report lacks %q and the diff line:\n%s", want, stdout)
	}
	if strings.Contains(stdout, fmt.Sprintf("#%-3d", at+1)) {
		t.Errorf("the replay went on past the divergence:\n%s", stdout)
	}
}

func TestReplayOfAnExampleEpisodeMatchesAndAnAlteredOutputIsFoundAtItsStep(t *testing.T) {
	files := recordRun(t, "../../examples/coding/tasks.jsonl", "../../examples/coding/policy.jsonl")
	replayEvidence(t, files["fix-add"], "read_file")
	// Every example replays as recorded, whatever its reward.
	for task, f := range files {
		if code, stdout, stderr := rollbox(t, "replay", f); code != 0 {
			t.Errorf("%s: exit %d\n%s%s", task, code, stdout, stderr)
		}
	}
}

const dockerReplayTask = `{"id": "py-steps", "prompt": "p", "sandbox": {"backend": "docker", "image": "python"},
 "files": {"/work/calc.py": "def add(a, b):\n    return a - b\n", "/work/check.py": "from calc import add\nassert add(2, 3) == 5, 'add(2, 3) = %r' % add(2, 3)\nprint('ok')\n"},
 "tools": ["bash", "python", "read_file", "edit", "run_tests", "finish"],
 "reward": {"type": "tests", "command": "cd /work && python3 check.py", "timeout_s": 60}}`

const dockerReplayScript = `{"task_id": "py-steps", "turns": [
 {"tool_calls": [{"name": "run_tests", "arguments": {}}]},
 {"tool_calls": [{"name": "bash", "arguments": {"command": "hostname; echo $TZ $SOURCE_DATE_EPOCH; ls -l /work | cut -c1-10; python3 -c 'print({\"b\", \"a\", \"c\", \"d\"})'"}}]},
 {"tool_calls": [{"name": "edit", "arguments": {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}}]},
 {"tool_calls": [{"name": "run_tests", "arguments": {}}]},
 {"tool_calls": [{"name": "finish", "arguments": {}}]}]}`

func TestReplayOfADockerEpisodeMatchesAndAnAlteredOutputIsFoundAtItsStep(t *testing.T) {
	t.Parallel() // waits on its containers
	needDocker(t)
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-cmd")
	dir := t.TempDir()
	tasks := writeFile(t, dir, "tasks.jsonl", strings.Join(strings.Fields(dockerReplayTask), " "))
	script := writeFile(t, dir, "script.jsonl", strings.Join(strings.Fields(dockerReplayScript), " "))
	file := recordRun(t, tasks, script)["py-steps"]
	tr, err := trajectory.Read(file)
	if err != nil || tr.Reward == nil || *tr.Reward.Total != 1 {
		t.Fatalf("recording: %v %+v", err, tr)
	}
	if out := tr.Steps[3].Output; !strings.HasPrefix(out, "sandbox\nUTC 1704067200\n") {
		t.Errorf("the container did not see the pinned hostname and env: %q", out)
	}
	replayEvidence(t, file, "bash")

	t.Run("a changed image digest is refused before anything runs", func(t *testing.T) {
		changed := editTrajectory(t, file, func(doc map[string]any) {
			doc["sandbox"].(map[string]any)["image_digest"] = "sha256:" + strings.Repeat("0", 64)
		})
		code, stdout, stderr := rollbox(t, "replay", changed)
		if code != 2 || !strings.Contains(stderr, "image python changed: the trajectory ran sha256:000") || strings.Contains(stdout, "#0") {
			t.Errorf("exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
		}
	})
	t.Run("a missing image is refused before anything runs", func(t *testing.T) {
		missing := editTrajectory(t, file, func(doc map[string]any) {
			doc["task"].(map[string]any)["sandbox"].(map[string]any)["image"] = "docker:rollbox-test/absent:1"
			doc["sandbox"].(map[string]any)["image_digest"] = "sha256:" + strings.Repeat("1", 64)
		})
		code, stdout, stderr := rollbox(t, "replay", missing)
		if code != 2 || !strings.Contains(stderr, "is not on this machine") || !strings.Contains(stderr, "rollbox-test/absent:1") || strings.Contains(stdout, "#0") {
			t.Errorf("exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
		}
	})
}

func TestReplayUntilStopsAfterThatStep(t *testing.T) {
	files := recordRun(t, "../../examples/coding/tasks.jsonl", "../../examples/coding/policy.jsonl")
	code, stdout, stderr := rollbox(t, "replay", files["fix-add"], "--until", "3")
	if code != 0 || !strings.Contains(stdout, "stopped after step 3 as asked") || !strings.Contains(stdout, "#3 ") || strings.Contains(stdout, "#4 ") {
		t.Errorf("exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = rollbox(t, "replay", "--json", "--until", "1", files["fix-add"])
	var rep struct {
		Stop       string `json:"stop"`
		LastStep   int    `json:"last_step"`
		Divergence any    `json:"divergence"`
		Steps      []struct {
			Index int  `json:"index"`
			Match bool `json:"match"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || code != 0 {
		t.Fatalf("exit %d, %v: %s", code, err, stdout)
	}
	if rep.Stop != "until" || rep.LastStep != 1 || len(rep.Steps) != 2 || rep.Divergence != nil {
		t.Errorf("report %+v", rep)
	}
}

func TestReplayRefusesBadInputBeforeRunningAnything(t *testing.T) {
	files := recordRun(t, "../../examples/coding/tasks.jsonl", "../../examples/coding/policy.jsonl")
	f := files["sum-of-squares"]
	newer := editTrajectory(t, f, func(doc map[string]any) { doc["schema"] = "rollbox.trajectory/v2" })
	noTask := editTrajectory(t, f, func(doc map[string]any) { delete(doc, "task") })
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"a trajectory from a newer schema", []string{newer}, `trajectory schema "rollbox.trajectory/v2" (this rollbox reads rollbox.trajectory/v1): trajectory written by a newer schema; upgrade rollbox`},
		{"a trajectory without its task", []string{noTask}, "recorded no task"},
		{"a missing file", []string{filepath.Join(t.TempDir(), "nope.json")}, "no such file"},
		{"no file", nil, "want one trajectory file"},
		{"a step past the end", []string{f, "--until", "99"}, "--until 99: the trajectory has steps 0..3"},
		{"a bad mask", []string{f, "--ignore", "("}, "--ignore"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := rollbox(t, append([]string{"replay"}, tt.args...)...)
			if code != 2 || !strings.Contains(stderr, tt.want) || stdout != "" {
				t.Errorf("exit %d, stderr %q, stdout %q; want 2 and %q", code, stderr, stdout, tt.want)
			}
		})
	}
}

func TestReplayHandsTheEpisodeToALivePolicyAfterTheStep(t *testing.T) {
	srv, err := fakepolicy.Start(fakepolicy.Config{Record: true, Responder: fakepolicy.Script(
		fakepolicy.Reply{}, fakepolicy.Reply{}, // turns 0 and 1 are replayed, not asked
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command": "sed -i 's/a - b/b + a/' /work/calc.py"}`}}},
		fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer": "live fix"}`}}},
	)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	files := recordRun(t, "../../examples/coding/tasks.jsonl", "../../examples/coding/policy.jsonl")
	out := t.TempDir()
	code, stdout, stderr := rollbox(t, "replay", files["fix-add"], "--until", "2", "--policy", "openai:"+srv.URL()+"#model=m", "--out", out)
	if code != 0 || !strings.Contains(stdout, "the live policy took over after step 3") || !strings.Contains(stdout, "finished, reward 1 (live)") {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	reqs := srv.Requests()
	if len(reqs) != 2 || !strings.Contains(fmt.Sprint(reqs[0].Messages), "def add(a, b)") {
		t.Errorf("the live policy did not see the replayed conversation: %d requests %+v", len(reqs), reqs)
	}
	own, _ := filepath.Glob(filepath.Join(out, "*.json"))
	tr, err := trajectory.Read(own[0])
	if err != nil || tr.Policy.Kind != "openai" || *tr.Termination.Answer != "live fix" || *tr.Reward.Total != 1 {
		t.Errorf("the live episode's record: %v %+v", err, tr)
	}
}

func TestReplayOutNeverWritesOverItsInputAndRecordsWhatItReplayed(t *testing.T) {
	files := recordRun(t, "../../examples/coding/tasks.jsonl", "../../examples/coding/policy.jsonl")
	f := files["rig-the-tests"] // recorded reward 0: a replay that took its place would show
	episodes := filepath.Dir(f)
	before := snapshot(t, filepath.Dir(episodes))
	orig, _ := trajectory.Read(f)
	// --out the very directory the trajectory is in.
	code, stdout, stderr := rollbox(t, "replay", f, "--out", episodes)
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	for p, b := range before {
		if got, _ := os.ReadFile(p); string(got) != b {
			t.Errorf("the replay changed %s", p)
		}
	}
	after, _ := filepath.Glob(filepath.Join(episodes, "*.json"))
	var own *trajectory.Trajectory
	for _, p := range after {
		if _, ok := before[p]; !ok {
			if own != nil {
				t.Fatalf("more than one new file: %v", after)
			}
			if own, _ = trajectory.Read(p); own == nil {
				t.Fatalf("%s does not read", p)
			}
		}
	}
	if own == nil {
		t.Fatalf("no trajectory of the replay in %s", episodes)
	}
	if own.EpisodeID == orig.EpisodeID || own.RolloutID == orig.RolloutID || own.GroupID == orig.GroupID ||
		!strings.HasPrefix(own.RolloutID, "replay-") || !strings.Contains(stdout, own.EpisodeID) {
		t.Errorf("the replay's ids %s %s %s are not its own (recorded %s)", own.EpisodeID, own.RolloutID, own.GroupID, orig.EpisodeID)
	}
	if of := own.ReplayOf; of == nil || of.EpisodeID != orig.EpisodeID || of.RolloutID != orig.RolloutID || of.TaskHash != orig.TaskHash || of.File != f {
		t.Errorf("replay_of = %+v", own.ReplayOf)
	}
	if b, _ := os.ReadFile(filepath.Join(episodes, own.EpisodeID+".json")); trajectory.Validate(b) != nil {
		t.Errorf("the replay's record does not validate: %v", trajectory.Validate(b))
	}
	// The run's group is still the run's: export counts the replay apart.
	code, _, stderr = rollbox(t, "export", "--from", filepath.Dir(episodes), "--rollout", orig.RolloutID)
	if code != exitOK || !strings.Contains(stderr, fmt.Sprintf("%d episode(s) of 1 run(s)", len(files))) {
		t.Errorf("export of the run: exit %d, %s", code, stderr)
	}
}

const durationsTask = `{"id": "timings", "prompt": "p", "sandbox": {"backend": "wasm"}, "tools": ["bash", "finish"],
 "reward": {"type": "exact", "answer": "x"}}`

const durationsScript = `{"task_id": "timings", "turns": [
 {"tool_calls": [{"name": "bash", "arguments": {"command": "echo '3 passed in 0.02s'; echo '=== 1 failed in 62.10s (0:01:02) ==='; echo 'ok  \tgithub.com/x/calc\t0.123s'; echo '--- PASS: TestAdd (0.00s)'; echo 'real\t0m0.01s'; echo 'Ran 3 tests in 0.001s'; echo 'took 12ms at 12:34:56'"}}]},
 {"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`

func TestReplayMasksWallClockDurationsUnlessStrict(t *testing.T) {
	dir := t.TempDir()
	tasks := writeFile(t, dir, "tasks.jsonl", strings.Join(strings.Fields(durationsTask), " "))
	script := writeFile(t, dir, "script.jsonl", strings.Join(strings.Fields(durationsScript), " "))
	file := recordRun(t, tasks, script)["timings"]
	at := firstToolStep(t, file, "bash")
	// The recording as another day's machine would have printed it.
	other := strings.NewReplacer("0.02s", "1.47s", "62.10s (0:01:02)", "75.01s (0:01:15)", "0.123s", "0.2s", "(0.00s)", "(0.31s)",
		"0m0.01s", "0m2.50s", "0.001s", "0.013s", "12ms at 12:34:56", "9ms at 08:00:01")
	slower := editTrajectory(t, file, func(doc map[string]any) {
		s := step(doc, at)
		s["output"] = other.Replace(s["output"].(string))
		s["stdout"] = other.Replace(s["stdout"].(string))
	})
	code, stdout, stderr := rollbox(t, "replay", slower)
	if code != exitOK || !strings.Contains(stdout, "matched (durations differ)") || !strings.Contains(stdout, "no divergence") ||
		!strings.Contains(stdout, "1 matched with other wall-clock durations") {
		t.Fatalf("replay: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = rollbox(t, "replay", slower, "--strict")
	if code != exitFailure || !strings.Contains(stdout, fmt.Sprintf("first divergence at step %d", at)) || !strings.Contains(stdout, "only wall-clock durations differ") {
		t.Fatalf("replay --strict: exit %d\n%s", code, stdout)
	}
	code, stdout, _ = rollbox(t, "replay", file, "--strict")
	if code != exitOK || strings.Contains(stdout, "durations differ") {
		t.Fatalf("replay --strict of the untouched recording: exit %d\n%s", code, stdout)
	}
	// A number that is not a duration still diverges.
	counted := editTrajectory(t, file, func(doc map[string]any) {
		s := step(doc, at)
		s["output"] = strings.Replace(s["output"].(string), "3 passed", "4 passed", 1)
	})
	if code, stdout, _ = rollbox(t, "replay", counted); code != exitFailure || !strings.Contains(stdout, "-4 passed") {
		t.Fatalf("a changed count: exit %d\n%s", code, stdout)
	}
}

func TestAReplayResolvesARelativeWorkspaceAsTheRunDid(t *testing.T) {
	root := t.TempDir()
	proj := filepath.Join(root, "proj")
	os.MkdirAll(filepath.Join(proj, "ws"), 0o755)
	os.WriteFile(filepath.Join(proj, "ws", "data.txt"), []byte("from the workspace\n"), 0o644)
	writeFile(t, proj, "tasks.jsonl", `{"id": "ws", "prompt": "p", "workspace": {"from": "ws", "to": "/work"}, "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "x"}}`)
	writeFile(t, proj, "script.jsonl", `{"task_id": "ws", "turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "cat /work/data.txt"}}]}, {"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`)
	// The run reads the task file from its own directory ...
	t.Chdir(proj)
	file := recordRun(t, "tasks.jsonl", "script.jsonl")["ws"]
	tr, _ := trajectory.Read(file)
	if tr.TaskDir != proj {
		t.Fatalf("task_dir = %q, want %q", tr.TaskDir, proj)
	}
	// ... the developer replays from elsewhere, without flags.
	elsewhere := filepath.Join(root, "elsewhere")
	os.Mkdir(elsewhere, 0o755)
	t.Chdir(elsewhere)
	if code, stdout, stderr := rollbox(t, "replay", file); code != exitOK || !strings.Contains(stdout, "no divergence") {
		t.Fatalf("replay from another directory: exit %d\n%s%s", code, stdout, stderr)
	}
	// The project moved: the error says what was tried and names --base.
	moved := filepath.Join(root, "moved")
	if err := os.Rename(proj, moved); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := rollbox(t, "replay", file)
	if code != exitBadInput || stdout != "" || !strings.Contains(stderr, `the task's workspace "ws" resolves against the current directory (the task file's directory the run recorded, `+proj+`, is not here)`) ||
		!strings.Contains(stderr, "pass --base DIR") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if code, stdout, stderr := rollbox(t, "replay", file, "--base", moved); code != exitOK {
		t.Fatalf("replay --base: exit %d\n%s%s", code, stdout, stderr)
	}
}
