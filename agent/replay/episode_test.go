package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/replay"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

func wasmFactory(t *testing.T) agent.SandboxFactory { return wasmtest.Factory(t) }

const fixTask = `{"id": "fix-add", "prompt": "Fix calc.py.", "sandbox": {"backend": "wasm"},
 "files": {"/work/calc.py": "def add(a, b):\n    return a - b\n",
           "/work/test_calc.py": "from calc import add\nassert add(2, 3) == 5, 'add(2, 3) = %r' % add(2, 3)\nprint('ok')\n"},
 "tools": ["bash", "python", "read_file", "edit", "run_tests", "finish"],
 "reward": {"type": "tests", "command": "cd /work && python test_calc.py", "timeout_s": 60},
 "limits": {"max_turns": 10}}`

type turns []agent.Turn

func (p turns) Next(_ context.Context, req agent.Request) (agent.Turn, error) {
	if req.Turn >= len(p) {
		return agent.Turn{}, fmt.Errorf("no turn %d: %w", req.Turn, agent.ErrPolicy)
	}
	return p[req.Turn], nil
}

func call(name, args string) agent.Turn {
	return agent.Turn{ToolCalls: []agent.ToolCall{{ID: name, Name: name, Arguments: args}}}
}

// the recorded episode: steps 0..11, tool steps at odd indexes.
var fixTurns = turns{
	call("run_tests", `{}`), // 1: fails
	call("bash", `{"command": "echo $SOURCE_DATE_EPOCH $TZ; ls /work; hostname; python -c 'print(sorted({\"b\", \"a\", \"c\"}))'"}`), // 3
	call("python", `{"code": "import calc\nprint(calc.add(1, 1))\nraise SystemExit(3)"}`),                                            // 5
	call("edit", `{"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}`),                                                // 7
	call("run_tests", ``),                 // 9: passes
	call("finish", `{"answer": "fixed"}`), // 11
}

func record(t *testing.T, taskJSON string, p agent.Policy) *trajectory.Trajectory {
	t.Helper()
	tasks, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(taskJSON), " ")), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := agent.Run(ctx, agent.Config{Task: tasks[0], EpisodeID: "r.fix-add.0", RolloutID: "r", GroupID: "r.fix-add",
		Dir: dir, Backend: "wasm", NewSandbox: wasmFactory(t), Policy: p, PolicyInfo: trajectory.Policy{Kind: "test"}}); err != nil {
		t.Fatal(err)
	}
	// Read back what was written, as a developer's copy would be.
	tr, err := trajectory.Read(filepath.Join(dir, "r.fix-add.0.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func replayOf(t *testing.T, tr *trajectory.Trajectory, mutate ...func(*replay.Options)) *replay.Report {
	t.Helper()
	opts := replay.Options{NewSandbox: wasmFactory(t), Dir: t.TempDir(), Until: -1}
	for _, m := range mutate {
		m(&opts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := replay.Episode(ctx, tr, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAReplayOfADeterministicEpisodeMatchesEveryStepAndTheReward(t *testing.T) {
	tr := record(t, fixTask, fixTurns)
	if tr.Reward == nil || *tr.Reward.Total != 1 || len(tr.Steps) != 12 {
		t.Fatalf("recording: reward %+v, %d steps", tr.Reward, len(tr.Steps))
	}
	r := replayOf(t, tr)
	if r.Diverged() {
		t.Fatalf("diverged at step %d: %+v", r.Divergence.Index, r.Divergence.Diffs)
	}
	if r.Stop != "ended" || r.Replayed.Reason != "finished" || *r.Replayed.Reward != 1 || len(r.Steps) != 12 || r.LastStep != 11 {
		t.Errorf("report: stop %q, end %+v, %d steps, last %d", r.Stop, r.Replayed, len(r.Steps), r.LastStep)
	}
	// The replay recorded its own trajectory, which says it was a replay.
	own, err := trajectory.Read(r.Trajectory)
	if err != nil || own.Policy.Kind != "replay" || own.Pinned["env.TZ"] != "UTC" {
		t.Errorf("the replay's own record: %v %+v", err, own)
	}
}

func TestAnAlteredRecordedOutputIsReportedAtThatStepWithADiff(t *testing.T) {
	tr := record(t, fixTask, fixTurns)
	tests := []struct {
		name  string
		step  int
		alter func(s *trajectory.Step)
		field string
	}{
		{"the output the model saw", 3, func(s *trajectory.Step) { s.Output = strings.Replace(s.Output, "calc.py", "calc2.py", 1) }, "output"},
		{"an exit code", 5, func(s *trajectory.Step) { c := 4; s.ExitCode = &c }, "exit_code"},
		{"the sha256 of a file written", 7, func(s *trajectory.Step) { s.Files["/work/calc.py"] = "0000" }, "files[/work/calc.py] sha256"},
		{"the stored stderr", 1, func(s *trajectory.Step) { b := trajectory.Bytes("other\n"); s.Stderr = &b }, "stderr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			altered := *tr
			altered.Steps = append([]trajectory.Step(nil), tr.Steps...)
			s := altered.Steps[tt.step]
			s.Files = map[string]string{}
			for k, v := range tr.Steps[tt.step].Files {
				s.Files[k] = v
			}
			tt.alter(&s)
			altered.Steps[tt.step] = s
			var streamed bytes.Buffer
			r := replayOf(t, &altered, func(o *replay.Options) {
				o.OnStep = replay.Text{W: &streamed}.Step
			})
			if !r.Diverged() || r.Divergence.Index != tt.step {
				t.Fatalf("divergence = %+v, want step %d", r.Divergence, tt.step)
			}
			if r.Divergence.Diffs[0].Field != tt.field {
				t.Errorf("diffs = %+v, want %s first", r.Divergence.Diffs, tt.field)
			}
			if r.Stop != "divergence" || r.LastStep != tt.step || len(r.Steps) != tt.step+1 {
				t.Errorf("did not stop at the divergence: stop %q last %d, %d steps", r.Stop, r.LastStep, len(r.Steps))
			}
			if !strings.Contains(streamed.String(), fmt.Sprintf("#%-3d", tt.step)) || !strings.Contains(streamed.String(), "DIVERGED") {
				t.Errorf("streamed report:\n%s", streamed.String())
			}
			var sum bytes.Buffer
			replay.Text{W: &sum}.Summary(r)
			if !strings.Contains(sum.String(), fmt.Sprintf("first divergence at step %d", tt.step)) {
				t.Errorf("summary:\n%s", sum.String())
			}
			if tt.field == "output" && !strings.Contains(sum.String(), "-calc2.py") {
				t.Errorf("no unified diff in the summary:\n%s", sum.String())
			}
		})
	}
}

func TestIgnoredPatternsAreMaskedBeforeComparing(t *testing.T) {
	tr := record(t, fixTask, fixTurns)
	s := &tr.Steps[3]
	s.Output = strings.Replace(s.Output, "sandbox", "host-1234", 1)
	b := trajectory.Bytes(strings.Replace(string(*s.Stdout), "sandbox", "host-1234", 1))
	s.Stdout = &b
	r := replayOf(t, tr, func(o *replay.Options) { o.Ignore = []*regexp.Regexp{regexp.MustCompile(`sandbox|host-\d+`)} })
	if r.Diverged() {
		t.Errorf("diverged despite the mask: %+v", r.Divergence)
	}
}

func TestUntilStopsAfterTheStepAndHandsTheLiveSandboxOver(t *testing.T) {
	tr := record(t, fixTask, fixTurns)
	var seen string
	r := replayOf(t, tr, func(o *replay.Options) {
		o.Until = 7
		o.AtStop = func(ctx context.Context, sb sandbox.Sandbox) error {
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "cat /work/calc.py"})
			seen = string(res.Stdout)
			return err
		}
	})
	if r.Diverged() || r.Stop != "until" || r.LastStep != 7 || len(r.Steps) != 8 {
		t.Errorf("stop %q last %d steps %d divergence %+v", r.Stop, r.LastStep, len(r.Steps), r.Divergence)
	}
	if !strings.Contains(seen, "a + b") {
		t.Errorf("the sandbox at step 7 holds %q, want the edit made", seen)
	}
	// Until on a model step stops before its calls run.
	r = replayOf(t, tr, func(o *replay.Options) { o.Until = 6 })
	if r.LastStep != 6 || r.Steps[len(r.Steps)-1].Type != trajectory.StepModel {
		t.Errorf("until a model step: last %d, steps %+v", r.LastStep, r.Steps)
	}
}

func TestKeepFinishLeavesTheSandboxOpenAtTheEnd(t *testing.T) {
	tr := record(t, fixTask, fixTurns)
	called := false
	r := replayOf(t, tr, func(o *replay.Options) {
		o.KeepFinish = true
		o.AtStop = func(ctx context.Context, sb sandbox.Sandbox) error { called = true; return nil }
	})
	if !called || r.Diverged() || r.LastStep != 10 {
		t.Errorf("AtStop called %v, last %d, divergence %+v", called, r.LastStep, r.Divergence)
	}
}

func TestALivePolicyTakesOverAfterTheStep(t *testing.T) {
	tr := record(t, fixTask, fixTurns)
	// Turns 0..2 are replayed (up to step 5); the live policy then makes a
	// different fix and finishes.
	live := &offsetPolicy{from: 3, turns: turns{
		call("bash", `{"command": "printf 'def add(a, b):\\n    return b + a\\n' > /work/calc.py"}`),
		call("finish", `{"answer": "live"}`),
	}}
	r := replayOf(t, tr, func(o *replay.Options) {
		o.Until = 4 // a model step: its turn is finished before the policy takes over
		o.Policy = live
		o.PolicyInfo = trajectory.Policy{Kind: "test-live"}
	})
	if r.Stop != "live" || r.LastStep != 5 || r.Replayed == nil || r.Replayed.Reason != "finished" || *r.Replayed.Reward != 1 {
		t.Fatalf("stop %q last %d end %+v", r.Stop, r.LastStep, r.Replayed)
	}
	own, err := trajectory.Read(r.Trajectory)
	if err != nil || len(own.Steps) != 10 || own.Policy.Kind != "test-live" || *own.Termination.Answer != "live" {
		t.Errorf("the live run's record: %v, %d steps %+v", err, len(own.Steps), own.Termination)
	}
	var live2 int
	for _, s := range r.Steps {
		if s.Live {
			live2++
		}
	}
	if live2 != 4 {
		t.Errorf("%d live steps reported, want 4", live2)
	}
}

// offsetPolicy answers turn n with turns[n-from].
type offsetPolicy struct {
	from  int
	turns turns
}

func (p *offsetPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	req.Turn -= p.from
	return p.turns.Next(ctx, req)
}

func TestAnEpisodeThatEndedOnThePolicyIsReplayedToWhereTheRecordingEnds(t *testing.T) {
	tr := record(t, fixTask, fixTurns[:2]) // the policy runs out: policy_error
	if tr.Termination.Reason != trajectory.EndPolicyError {
		t.Fatalf("recording ended %s", tr.Termination.Reason)
	}
	r := replayOf(t, tr)
	if r.Diverged() || r.Stop != "end" || !strings.Contains(r.StopDetail, "policy_error") {
		t.Errorf("stop %q (%s), divergence %+v", r.Stop, r.StopDetail, r.Divergence)
	}
}

func TestARecordingWithoutATaskIsRefused(t *testing.T) {
	tr := record(t, fixTask, fixTurns[:1])
	tr.Task = nil
	_, err := replay.Episode(context.Background(), tr, replay.Options{NewSandbox: wasmFactory(t), Dir: t.TempDir(), Until: -1})
	if !errors.Is(err, replay.ErrBadTrajectory) {
		t.Errorf("err = %v", err)
	}
}

func TestTheWASMShellRunsLinesAndKeepsTheDirectory(t *testing.T) {
	sb, err := wasmFactory(t)(context.Background(), "wasm", sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	sb.WriteFile(context.Background(), "/work/sub/f.txt", []byte("hello\n"), 0o644)
	var out bytes.Buffer
	in := strings.NewReader("cd sub\npwd\ncat f.txt\nfalse\ncd /nowhere\nexit\necho never\n")
	if err := replay.Shell(context.Background(), sb, in, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"sandbox:/work$ ", "sandbox:/work/sub$ /work/sub\n", "hello\n", "[exit 1]\n", "nowhere"} {
		if !strings.Contains(got, want) {
			t.Errorf("shell output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "never") {
		t.Errorf("ran past exit:\n%s", got)
	}
}

// asImported makes a recorded episode look as POST /v1/imports stores it.
func asImported(tr *trajectory.Trajectory, format string) *trajectory.Trajectory {
	now := time.Now().UTC()
	tr.EpisodeID, tr.RolloutID, tr.Source = "imp-0123", "", trajectory.SourceProduction
	tr.Import = &trajectory.Import{ExternalID: "sess-1", Format: format, ImportedAt: now, PolicyVersion: "v1", GroupBy: "task_id", GroupKey: tr.TaskID}
	tr.Outcomes = &trajectory.Outcomes{Status: trajectory.OutcomePending, MaturesAt: now.Add(time.Hour), Signals: []trajectory.Signal{}}
	tr.Reward = trajectory.Unscored(trajectory.RewardPending, nil, "pending")
	return tr
}

func TestAnImportedTrajectoryReplaysAndAnImportedChatSaysWhatItLacks(t *testing.T) {
	tr := asImported(record(t, fixTask, fixTurns), "trajectory")
	r := replayOf(t, tr)
	if r.Diverged() || r.Stop != "ended" || len(r.Steps) != 12 {
		t.Fatalf("an imported Rollbox trajectory: diverged %v (%+v), stop %q, %d steps", r.Diverged(), r.Divergence, r.Stop, len(r.Steps))
	}

	chat := asImported(record(t, fixTask, fixTurns), "openai")
	chat.Sandbox = trajectory.Sandbox{Backend: "none"}
	chat.Import.Missing = []string{"task.sandbox (an image)", "task.files (the workspace)"}
	chat.Steps = append(chat.Steps, trajectory.Step{Index: len(chat.Steps), Type: trajectory.StepUser, Content: "thanks"})
	_, err := replay.Episode(context.Background(), chat, replay.Options{NewSandbox: wasmFactory(t), Dir: t.TempDir(), Until: -1})
	if !errors.Is(err, replay.ErrBadTrajectory) {
		t.Fatalf("an imported chat: %v", err)
	}
	for _, want := range []string{"imported from production", "task.sandbox (an image)", "task.files (the workspace)", "the user's later messages (step 12"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
}
