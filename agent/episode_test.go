package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
	"github.com/rollbox/rollbox/tools"
)

// The episode tests run on the real WASM backend: the embedded default.
func wasmFactory(t *testing.T) agent.SandboxFactory { return wasmtest.Factory(t) }

const calcTask = `{"id": "fix-add", "prompt": "The tests in /work fail. Fix the code.",
 "sandbox": {"backend": "wasm"},
 "files": {"/work/calc.py": "def add(a, b):\n    return a - b\n",
           "/work/test_calc.py": "from calc import add\nassert add(2, 3) == 5, 'add(2, 3) != 5'\nprint('ok')\n"},
 "reward": {"type": "tests", "command": "cd /work && python test_calc.py", "timeout_s": 60},
 "limits": {"max_turns": 6}}`

func loadTask(t testing.TB, js string) *agent.Task {
	t.Helper()
	tasks, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(js), " ")), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return tasks[0]
}

func runEpisode(t *testing.T, task *agent.Task, p agent.Policy, mutate ...func(*agent.Config)) *trajectory.Trajectory {
	t.Helper()
	dir := t.TempDir()
	cfg := agent.Config{Task: task, EpisodeID: "ep", RolloutID: "r", GroupID: "g", Dir: dir, Backend: "wasm",
		NewSandbox: wasmFactory(t), Policy: p, PolicyInfo: trajectory.Policy{Kind: "test"}}
	for _, m := range mutate {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr, err := agent.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// What was written is what was returned, and it matches the schema.
	b, err := os.ReadFile(filepath.Join(dir, "ep.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := trajectory.Validate(b); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*.partial")); len(m) > 0 {
		t.Errorf("journal left behind: %v", m)
	}
	return tr
}

func toolSteps(tr *trajectory.Trajectory) []trajectory.Step {
	var out []trajectory.Step
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepTool {
			out = append(out, s)
		}
	}
	return out
}

func kindOf(s trajectory.Step) string {
	if s.ErrorKind == nil {
		return ""
	}
	return *s.ErrorKind
}

func TestAnEpisodeThatFixesTheCodePassesItsTests(t *testing.T) {
	tr := runEpisode(t, loadTask(t, calcTask), &turnsPolicy{turns: []agent.Turn{
		calls("run_tests", `{}`),
		calls("edit", `{"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}`),
		calls("run_tests", ``),
		calls("finish", `{"answer": "fixed"}`),
	}})
	if tr.Termination.Reason != trajectory.EndFinished || *tr.Termination.Answer != "fixed" {
		t.Fatalf("termination = %+v", tr.Termination)
	}
	if tr.Reward == nil || *tr.Reward.Total != 1 || tr.Reward.Components["tests"] != 1 {
		t.Fatalf("reward = %+v", tr.Reward)
	}
	steps := toolSteps(tr)
	if kindOf(steps[0]) != string(tools.KindNonzeroExit) || !strings.Contains(steps[0].Output, "add(2, 3) != 5") {
		t.Errorf("first run_tests: kind %q output %q", kindOf(steps[0]), steps[0].Output)
	}
	if steps[1].Files["/work/calc.py"] == "" {
		t.Errorf("edit did not record the file it wrote: %+v", steps[1].Files)
	}
	if kindOf(steps[2]) != "" || *steps[2].ExitCode != 0 {
		t.Errorf("second run_tests: kind %q exit %v output %q", kindOf(steps[2]), steps[2].ExitCode, steps[2].Output)
	}
	if tr.Reward.Verifier == nil || !strings.Contains(string(*tr.Reward.Verifier.Stdout), "ok") {
		t.Errorf("verifier output not kept: %+v", tr.Reward.Verifier)
	}
	if tr.Sandbox.Backend != "wasm" || tr.Stats.Turns != 4 || tr.Stats.ToolCalls != 4 {
		t.Errorf("sandbox %+v stats %+v", tr.Sandbox, tr.Stats)
	}
}

func TestAnAgentThatRewritesTheTestsDoesNotPass(t *testing.T) {
	tr := runEpisode(t, loadTask(t, calcTask), &turnsPolicy{turns: []agent.Turn{
		calls("write_file", `{"path": "/work/test_calc.py", "content": "print('ok')\n"}`),
		calls("run_tests", `{}`),
		calls("write_file", `{"path": "/work/PASSED", "content": "all tests passed"}`),
		calls("finish", `{}`),
	}})
	if steps := toolSteps(tr); kindOf(steps[1]) != "" {
		t.Fatalf("the rigged test should pass inside the episode: %q", steps[1].Output)
	}
	if tr.Reward == nil || *tr.Reward.Total != 0 {
		t.Fatalf("reward = %+v, want 0: the verifier must run the task's own tests", tr.Reward)
	}
	v := tr.Reward.Verifier
	if v == nil || !v.CleanRoom || len(v.Skipped) != 1 || v.Skipped[0].Path != "/work/test_calc.py" {
		t.Fatalf("verifier = %+v, want the rewritten test skipped", tr.Reward.Verifier)
	}
	if len(v.Copied) != 1 || v.Copied[0] != "/work/PASSED" {
		t.Errorf("copied = %v, want the agent's new file", v.Copied)
	}
}

func TestBadToolCallsAreRecordedAndTheEpisodeGoesOn(t *testing.T) {
	tr := runEpisode(t, loadTask(t, calcTask), &turnsPolicy{turns: []agent.Turn{
		calls("bash", `{"command": "echo hi"`), // invalid JSON
		calls("rm_rf", `{}`),                   // unknown tool
		calls("edit", `{"path": "calc.py"}`),   // missing arguments
		{Content: "I am thinking."},            // no tool call
		calls("edit", `{"path": "calc.py", "old_string": "nope", "new_string": "x"}`),       // no match
		calls("bash", `{"command": "echo one; echo two"}`, "bash", `{"command": "exit 3"}`), // parallel calls
	}})
	if tr.Termination.Reason != trajectory.EndMaxTurns {
		t.Fatalf("termination = %+v", tr.Termination)
	}
	steps := toolSteps(tr)
	want := []string{string(tools.KindBadArguments), string(tools.KindUnknownTool), string(tools.KindBadArguments), string(tools.KindBadArguments), "", string(tools.KindNonzeroExit)}
	if len(steps) != len(want) {
		t.Fatalf("%d tool steps, want %d", len(steps), len(want))
	}
	for i, w := range want {
		if kindOf(steps[i]) != w {
			t.Errorf("step %d (%s): kind %q, want %q; output %q", i, steps[i].Name, kindOf(steps[i]), w, steps[i].Output)
		}
	}
	if string(steps[0].Arguments) != `"{\"command\": \"echo hi\""` {
		t.Errorf("invalid arguments not kept raw: %s", steps[0].Arguments)
	}
	if steps[4].Output != "one\ntwo\n" || *steps[5].ExitCode != 3 {
		t.Errorf("parallel calls: %q / %v", steps[4].Output, steps[5].ExitCode)
	}
	if tr.Reward == nil || *tr.Reward.Total != 0 {
		t.Errorf("a max_turns episode is scored: %+v", tr.Reward)
	}
	if tr.Stats.ToolErrors[string(tools.KindBadArguments)] != 3 {
		t.Errorf("tool errors = %v", tr.Stats.ToolErrors)
	}
}

type failingPolicy struct{ err error }

func (p failingPolicy) Next(context.Context, agent.Request) (agent.Turn, error) {
	return agent.Turn{}, p.err
}

func TestAPolicyFailureEndsTheEpisodeUnscored(t *testing.T) {
	tr := runEpisode(t, loadTask(t, calcTask), failingPolicy{errors.Join(errors.New("500 after 5 attempts"), agent.ErrPolicy)})
	if tr.Termination.Reason != trajectory.EndPolicyError || !strings.Contains(tr.Termination.Message, "500 after 5 attempts") {
		t.Fatalf("termination = %+v", tr.Termination)
	}
	if tr.Reward != nil {
		t.Fatalf("a policy failure was scored: %+v", tr.Reward)
	}
}

func TestASandboxThatCannotStartEndsTheEpisodeUnscored(t *testing.T) {
	tr := runEpisode(t, loadTask(t, calcTask), &turnsPolicy{}, func(c *agent.Config) {
		c.NewSandbox = func(context.Context, string, sandbox.Spec) (sandbox.Sandbox, error) {
			return nil, errors.Join(errors.New("engine down"), sandbox.ErrEngineUnavailable)
		}
	})
	if tr.Termination.Reason != trajectory.EndSandboxError || tr.Reward != nil || len(tr.Steps) != 0 {
		t.Fatalf("termination %+v reward %+v steps %d", tr.Termination, tr.Reward, len(tr.Steps))
	}
}

// closingSandbox closes its real sandbox after n execs, as a dying container would.
type closingSandbox struct {
	sandbox.Sandbox
	mu sync.Mutex
	n  int
}

func (c *closingSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Result, error) {
	c.mu.Lock()
	c.n--
	if c.n < 0 {
		c.Sandbox.Close()
	}
	c.mu.Unlock()
	return c.Sandbox.Exec(ctx, req)
}

func TestASandboxThatDiesMidEpisodeIsNeverScored(t *testing.T) {
	factory := wasmFactory(t)
	tr := runEpisode(t, loadTask(t, calcTask), &turnsPolicy{turns: []agent.Turn{
		calls("bash", `{"command": "true"}`),
		calls("bash", `{"command": "true"}`),
		calls("finish", `{}`),
	}}, func(c *agent.Config) {
		c.NewSandbox = func(ctx context.Context, b string, spec sandbox.Spec) (sandbox.Sandbox, error) {
			sb, err := factory(ctx, b, spec)
			return &closingSandbox{Sandbox: sb, n: 1}, err
		}
	})
	if tr.Termination.Reason != trajectory.EndSandboxError || tr.Reward != nil {
		t.Fatalf("termination %+v reward %+v", tr.Termination, tr.Reward)
	}
	steps := toolSteps(tr)
	if len(steps) != 2 || kindOf(steps[1]) != string(tools.KindSandbox) {
		t.Fatalf("steps = %+v", steps)
	}
}

func TestLongAndBinaryOutputIsTruncatedForTheModelAndKeptLosslessly(t *testing.T) {
	task := loadTask(t, strings.Replace(calcTask, `"max_turns": 6`, `"max_turns": 6, "max_tool_output_bytes": 1000, "max_stored_output_bytes": 4000`, 1))
	tr := runEpisode(t, task, &turnsPolicy{turns: []agent.Turn{
		calls("bash", `{"command": "seq 1 2000"}`),
		calls("bash", `{"command": "printf 'caf\\351'"}`),
		calls("finish", `{}`),
	}})
	steps := toolSteps(tr)
	long := steps[0]
	if !long.Truncated || kindOf(long) != string(tools.KindOutputTruncated) || len(long.Output) > 1100 || !strings.Contains(long.Output, "output truncated") {
		t.Errorf("long output: truncated %v kind %q len %d", long.Truncated, kindOf(long), len(long.Output))
	}
	total := int64(0)
	for i := 1; i <= 2000; i++ {
		total += int64(len(strconv.Itoa(i)) + 1)
	}
	if got := int64(len(*long.Stdout)) + long.StdoutStoredDropped; got != total {
		t.Errorf("stored %d + dropped %d = %d, want the full %d bytes accounted for", len(*long.Stdout), long.StdoutStoredDropped, got, total)
	}
	if long.BytesDropped <= 0 || long.BytesDropped < long.StdoutStoredDropped {
		t.Errorf("bytes_dropped = %d", long.BytesDropped)
	}
	if !strings.HasPrefix(string(*long.Stdout), "1\n2\n3\n") || !strings.HasSuffix(string(*long.Stdout), "1999\n2000\n") {
		t.Errorf("stored stdout lost its head or tail")
	}
	if len(eventsOf(tr, "tool_output_truncated")) != 1 {
		t.Errorf("context events = %+v", tr.ContextEvents)
	}
	bin := steps[1]
	if bin.Stdout == nil || string(*bin.Stdout) != "caf\xe9" {
		t.Fatalf("python step: kind %q output %q stdout %v", kindOf(bin), bin.Output, bin.Stdout)
	}
	if bin.Output != "caf\uFFFD\n" {
		t.Errorf("the model saw %q, want the invalid byte replaced", bin.Output)
	}
	// Reading the trajectory back keeps the exact bytes.
	b, _ := json.Marshal(tr)
	back, err := trajectory.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(*back.Steps[3].Stdout); got != string(*tr.Steps[3].Stdout) {
		t.Errorf("stdout changed in the round trip: %q vs %q", got, *tr.Steps[3].Stdout)
	}
}

func TestAContextOverBudgetEndsOrTruncatesAsTheTaskSays(t *testing.T) {
	big := `{"command": "seq 1 3000"}`
	for _, mode := range []string{"end", "truncate"} {
		t.Run("context_overflow "+mode, func(t *testing.T) {
			task := loadTask(t, strings.Replace(calcTask, `"max_turns": 6`,
				`"max_turns": 4, "max_context_tokens": 3000, "max_tool_output_bytes": 9000, "context_overflow": "`+mode+`"`, 1))
			tr := runEpisode(t, task, &turnsPolicy{turns: []agent.Turn{
				calls("bash", big), calls("bash", big), calls("bash", big), calls("finish", `{}`),
			}})
			switch mode {
			case "end":
				if tr.Termination.Reason != trajectory.EndContextOverflow || len(eventsOf(tr, "context_overflow")) != 1 {
					t.Fatalf("termination %+v events %+v", tr.Termination, tr.ContextEvents)
				}
			case "truncate":
				if tr.Termination.Reason != trajectory.EndFinished || len(eventsOf(tr, "context_truncated")) == 0 {
					t.Fatalf("termination %+v events %+v", tr.Termination, tr.ContextEvents)
				}
			}
			if tr.Reward == nil {
				t.Errorf("a context end is the model's and is scored")
			}
		})
	}
}

func TestTheEpisodeDeadlineStopsALongCommand(t *testing.T) {
	task := loadTask(t, strings.Replace(calcTask, `"max_turns": 6`, `"max_turns": 6, "episode_timeout_s": 1`, 1))
	start := time.Now()
	tr := runEpisode(t, task, &turnsPolicy{turns: []agent.Turn{calls("bash", `{"command": "sleep 30"}`)}})
	if tr.Termination.Reason != trajectory.EndEpisodeTimeout {
		t.Fatalf("termination = %+v", tr.Termination)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("took %v", el)
	}
}

func TestACommandThatGoesQuietIsStoppedAndKeepsItsOutput(t *testing.T) {
	task := loadTask(t, strings.Replace(calcTask, `"max_turns": 6`, `"max_turns": 2, "idle_timeout_s": 0.5`, 1))
	tr := runEpisode(t, task, &turnsPolicy{turns: []agent.Turn{calls("bash", `{"command": "echo started; sleep 30"}`), calls("finish", `{}`)}})
	s := toolSteps(tr)[0]
	if kindOf(s) != string(tools.KindTimeout) || !strings.HasPrefix(s.Output, "started\n") || !s.TimedOut {
		t.Fatalf("kind %q timed out %v output %q", kindOf(s), s.TimedOut, s.Output)
	}
}

func TestCancellingTheRunEndsTheEpisodeCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	dir := t.TempDir()
	tr, err := agent.Run(ctx, agent.Config{Task: loadTask(t, calcTask), EpisodeID: "ep", Dir: dir, Backend: "wasm",
		NewSandbox: wasmFactory(t), Policy: &turnsPolicy{turns: []agent.Turn{calls("bash", `{"command": "sleep 30"}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Termination.Reason != trajectory.EndCancelled || tr.Reward != nil {
		t.Fatalf("termination %+v reward %+v", tr.Termination, tr.Reward)
	}
}

// blockedPolicy waits for its context.
type blockedPolicy struct{}

func (blockedPolicy) Next(ctx context.Context, _ agent.Request) (agent.Turn, error) {
	<-ctx.Done()
	return agent.Turn{}, ctx.Err()
}

func TestAnEpisodeStoppedWithACauseEndsForItsReasonWhereverItIs(t *testing.T) {
	for _, tt := range []struct {
		name   string
		policy agent.Policy
		slow   bool // the sandbox is slow to make: stopped while opening
	}{
		{"while a tool runs", &turnsPolicy{turns: []agent.Turn{calls("bash", `{"command": "sleep 30"}`)}}, false},
		{"while the policy is asked", blockedPolicy{}, false},
		{"while its sandbox is made", blockedPolicy{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			time.AfterFunc(300*time.Millisecond, func() {
				cancel(&agent.StopCause{Reason: trajectory.EndInterrupted, Message: "the service stopped"})
			})
			factory := wasmFactory(t)
			if tt.slow {
				inner := factory
				factory = func(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error) {
					<-ctx.Done()
					return inner(context.WithoutCancel(ctx), backend, spec)
				}
			}
			tr, err := agent.Run(ctx, agent.Config{Task: loadTask(t, calcTask), EpisodeID: "ep", Dir: t.TempDir(), Backend: "wasm",
				NewSandbox: factory, Policy: tt.policy})
			if err != nil {
				t.Fatal(err)
			}
			if tr.Termination.Reason != trajectory.EndInterrupted || tr.Termination.Message != "the service stopped" || tr.Reward != nil {
				t.Fatalf("termination %+v reward %+v", tr.Termination, tr.Reward)
			}
		})
	}
}

func TestBytesDroppedIsTheOutputTheModelDidNotSeeAndTheMarkersSayIt(t *testing.T) {
	task := loadTask(t, strings.Replace(calcTask, `"max_turns": 6`, `"max_turns": 6, "max_tool_output_bytes": 1000, "max_stored_output_bytes": 4000`, 1))
	tr := runEpisode(t, task, &turnsPolicy{turns: []agent.Turn{
		calls("bash", `{"command": "seq 1 2000; seq 1 300 >&2; exit 3"}`),
		calls("bash", `{"command": "seq 1 2000"}`),
		calls("finish", `{}`),
	}})
	seqBytes := func(n int) int64 {
		total := int64(0)
		for i := 1; i <= n; i++ {
			total += int64(len(strconv.Itoa(i)) + 1)
		}
		return total
	}
	for i, want := range []struct {
		output int64
		notes  []string
	}{
		{seqBytes(2000) + seqBytes(300), []string{"[stderr]\n", "[exit code 3]\n"}},
		{seqBytes(2000), nil},
	} {
		s := toolSteps(tr)[i]
		shown := s.Output
		told := int64(0)
		for _, m := range markerNumbers.FindAllStringSubmatch(s.Output, -1) {
			n, _ := strconv.ParseInt(m[1]+m[2], 10, 64)
			told += n
			shown = strings.Replace(shown, m[0], "", 1)
		}
		for _, n := range want.notes {
			shown = strings.Replace(shown, n, "", 1)
		}
		if !s.Truncated || told != s.BytesDropped {
			t.Errorf("step %d: truncated %v, the model is told %d bytes, bytes_dropped %d: %q", i, s.Truncated, told, s.BytesDropped, s.Output)
		}
		if unseen := want.output - int64(len(shown)); s.BytesDropped != unseen {
			t.Errorf("step %d: bytes_dropped %d, but %d of the %d bytes of output were not shown", i, s.BytesDropped, unseen, want.output)
		}
	}
}
