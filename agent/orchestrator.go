package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// NameSpawnSubagents is the orchestrator's tool: it runs sub-agents on
// sub-tasks and answers with each one's final answer.
const NameSpawnSubagents = "spawn_subagents"

// Orchestrator defaults and bounds.
const (
	DefaultMaxSubagents   = 8
	DefaultMaxParallel    = 4
	DefaultMaxAnswerBytes = 4096
	// MaxSubagentsBound is the most sub-agents an episode may declare.
	MaxSubagentsBound = 256
)

// SubagentsDir is the directory, beside an orchestrator's record, that
// holds its sub-episodes' records (<dir>/subagents/<episode_id>.json):
// apart from the episodes, so no reader of a run's episodes counts them.
const SubagentsDir = "subagents"

// Orchestrator is a task's "orchestrator" object: its episodes are
// orchestrator episodes (Kimi K2.5's PARL). The orchestrator (the policy
// being trained) gets the spawn_subagents tool; each sub-task it spawns runs
// as a sub-episode with the same session code, in a sandbox of its own on
// the same backend, driven by the frozen sub-agent policy. A sub-agent's
// final answer, and how it ended, are what the orchestrator observes: a
// sub-agent's failure (sandbox, policy, timeout) is an observation, never
// the orchestrator's infrastructure failure.
type Orchestrator struct {
	// SubagentPolicy is the frozen sub-agent policy: in a task file for
	// `rollbox run` a policy string (scripted:FILE, openai:URL#model=NAME),
	// in the rollout API a policy object ({"base_url", "model"}). Whoever
	// runs the episode resolves it (Config.Subagents.Policy).
	SubagentPolicy json.RawMessage `json:"subagent_policy"`
	// MaxSubagents bounds the sub-agents of an episode, over all its
	// spawn_subagents calls (default 8); a call that would pass it is
	// refused whole (bad_arguments), nothing spawned.
	MaxSubagents int `json:"max_subagents,omitempty"`
	// MaxParallel bounds the sub-agents of a call running at once (default
	// 4, at most max_subagents); the others wait their turn.
	MaxParallel int `json:"max_parallel,omitempty"`
	// SubagentTools are the tools a sub-agent may be given (default: the
	// task's, spawn_subagents aside); a sub-task's "tools" picks among
	// them (finish is always given).
	SubagentTools []string `json:"subagent_tools,omitempty"`
	// SubagentLimits are a sub-episode's limits (default: the defaults).
	SubagentLimits *EpisodeLimits `json:"subagent_limits,omitempty"`
	// ShareWorkspace seeds each sub-agent's sandbox with a copy (a fork) of
	// the orchestrator's workspace as it is at the spawn; without it, a
	// sub-agent's sandbox holds the task's files. Either way a sub-agent's
	// changes to its files never come back: its answer is all the
	// orchestrator gets.
	ShareWorkspace bool `json:"share_workspace,omitempty"`
	// MaxAnswerBytes caps each sub-agent answer shown to the orchestrator
	// (head and tail kept; default 4096); the whole tool output is then
	// capped as any tool's (limits.max_tool_output_bytes).
	MaxAnswerBytes int `json:"max_answer_bytes,omitempty"`
	// Async makes spawn_subagents answer at once with a handle per
	// sub-agent, and gives the orchestrator the wait and collect tools
	// for their results: it goes on while they run. max_parallel then
	// bounds the sub-agents of the whole episode running at once.
	Async bool `json:"async,omitempty"`
}

func (o *Orchestrator) withDefaults() {
	if o.MaxSubagents == 0 {
		o.MaxSubagents = DefaultMaxSubagents
	}
	if o.MaxParallel == 0 {
		o.MaxParallel = min(DefaultMaxParallel, o.MaxSubagents)
	}
	if o.MaxAnswerBytes == 0 {
		o.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
}

// PolicyString is the sub-agent policy when it is given as a string ("" when
// it is an object).
func (o *Orchestrator) PolicyString() string {
	var s string
	if json.Unmarshal(o.SubagentPolicy, &s) != nil {
		return ""
	}
	return s
}

// validate checks the object; knownTools is the task's check of tool names.
func (o *Orchestrator) validate(knownTools func(string) bool, hasRetriever bool) error {
	raw := strings.TrimSpace(string(o.SubagentPolicy))
	switch {
	case raw == "" || raw == "null":
		return errors.New("orchestrator.subagent_policy: required (a policy string such as scripted:FILE or openai:URL#model=NAME, or a policy object)")
	case raw[0] == '"':
		if strings.TrimSpace(o.PolicyString()) == "" {
			return errors.New("orchestrator.subagent_policy: empty")
		}
	case raw[0] != '{':
		return fmt.Errorf("orchestrator.subagent_policy: want a policy string or object, got %s", raw)
	}
	if o.MaxSubagents < 0 || o.MaxSubagents > MaxSubagentsBound {
		return fmt.Errorf("orchestrator.max_subagents: %d is outside 1..%d", o.MaxSubagents, MaxSubagentsBound)
	}
	maxSub := o.MaxSubagents
	if maxSub == 0 {
		maxSub = DefaultMaxSubagents
	}
	if o.MaxParallel < 0 || o.MaxParallel > maxSub {
		return fmt.Errorf("orchestrator.max_parallel: %d is outside 1..%d (max_subagents)", o.MaxParallel, maxSub)
	}
	if o.MaxAnswerBytes < 0 || o.MaxAnswerBytes > ranges.MaxToolOutputBytes {
		return fmt.Errorf("orchestrator.max_answer_bytes: %d is outside 0..%d", o.MaxAnswerBytes, ranges.MaxToolOutputBytes)
	}
	seen := map[string]bool{}
	for i, name := range o.SubagentTools {
		switch {
		case name == NameSpawnSubagents:
			return fmt.Errorf("orchestrator.subagent_tools[%d]: sub-agents do not spawn sub-agents", i)
		case knownTools != nil && !knownTools(name):
			return fmt.Errorf("orchestrator.subagent_tools[%d]: unknown tool %q", i, name)
		case seen[name]:
			return fmt.Errorf("orchestrator.subagent_tools[%d]: %q named twice", i, name)
		case !hasRetriever && slices.Contains(tools.SearchNames(), name):
			return fmt.Errorf("orchestrator.subagent_tools[%d]: %s needs a retriever", i, name)
		}
		seen[name] = true
	}
	if o.SubagentLimits != nil {
		if err := o.SubagentLimits.Validate(); err != nil {
			return fmt.Errorf("orchestrator.subagent_%v", err)
		}
	}
	return nil
}

// Slots is the scheduler's bound on the episodes running at once, as an
// orchestrator episode uses it: each sub-agent holds a slot of its backend
// while it runs, and the orchestrator hands its own to its first sub-agent
// while it waits on them (and takes one again after), so a parent waiting
// on its children never holds a slot they need, and no queued episode
// takes it in between. Acquire is served before the episodes still
// queued.
type Slots interface {
	Acquire(ctx context.Context, backend string) error
	Release(backend string)
}

// Subagents is how an orchestrator episode runs its sub-agents
// (Config.Subagents).
type Subagents struct {
	// Policy resolves a task's orchestrator.subagent_policy into the
	// frozen sub-agent policy and its description.
	Policy func(t *Task) (Policy, trajectory.Policy, error)
	// Slots, if set, bounds the sub-agents with the episodes (see Slots).
	Slots Slots
	// Slotless says the orchestrator itself holds no slot of Slots (an
	// environment episode, driven by its trainer): each of its sub-agents
	// takes a slot of its own, and it takes none back after them.
	Slotless bool
	// Recorded, set by replay, answers each spawn_subagents call with the
	// recorded sub-agents of the same stage instead of running them.
	Recorded []trajectory.Subagent
	// Observe, if set, sees each sub-episode as it ends (metrics).
	Observe func(*trajectory.Trajectory)
}

// orchestration is an orchestrator episode's sub-agent state.
type orchestration struct {
	o      Orchestrator
	policy Policy
	info   trajectory.Policy
	// stage counts the spawn_subagents calls; spawned the sub-agents.
	stage, spawned int
	// stageSteps has, per stage, the most turns one of its sub-agents took.
	stageSteps []int
	subSteps   int
	// async is the asynchronous sub-agents' state (orchestrator.async).
	async *asyncState
}

// openOrchestration resolves the sub-agent policy of an orchestrator task.
// ctx is the episode's: an asynchronous orchestrator's sub-agents run
// under it until the episode ends.
func (s *Session) openOrchestration(ctx context.Context) error {
	t := s.task
	if t.Orchestrator == nil {
		return nil
	}
	o := *t.Orchestrator
	o.withDefaults()
	s.orch = &orchestration{o: o}
	if o.Async {
		s.orch.async = newAsyncState(ctx, o.MaxParallel)
	}
	sub := s.cfg.Subagents
	if sub != nil && sub.Recorded != nil {
		s.orch.info = trajectory.Policy{Kind: "recorded"}
		return nil
	}
	if sub == nil || sub.Policy == nil {
		return errors.New("the task has an orchestrator but nothing resolves its sub-agent policy here")
	}
	p, info, err := sub.Policy(t)
	if err != nil {
		return fmt.Errorf("orchestrator.subagent_policy: %w", err)
	}
	s.orch.policy, s.orch.info = p, info
	return nil
}

// spawnTool is the spawn_subagents tool of one orchestrator episode.
type spawnTool struct{ s *Session }

const spawnSchema = `{"type": "object", "additionalProperties": false, "required": ["tasks"], "properties": {
 "tasks": {"type": "array", "minItems": 1, "description": "the sub-tasks, each run by a sub-agent of its own, in parallel",
  "items": {"type": "object", "additionalProperties": false, "required": ["prompt"], "properties": {
   "prompt": {"type": "string", "minLength": 1, "description": "the sub-task, complete in itself: the sub-agent sees nothing else"},
   "tools": {"type": "array", "items": {"type": "string", "minLength": 1}, "description": "the sub-agent's tools (default: all it may have); finish is always given"}}}}}}`

func (spawnTool) Schema() tools.Schema {
	return tools.Schema{Name: NameSpawnSubagents, Description: "Run sub-agents on sub-tasks in parallel, each in a sandbox of its own, and return each one's final answer (in order) with how it ended.",
		Parameters: json.RawMessage(spawnSchema)}
}

// subTask is one sub-task of a spawn_subagents call.
type subTask struct {
	Prompt string   `json:"prompt"`
	Tools  []string `json:"tools"`
}

// spawnResult is one sub-agent's entry in the tool's output: what the
// orchestrator sees. It holds nothing that differs between runs of the
// same sub-agent (no ids, no times), so a replay compares it.
type spawnResult struct {
	Handle    string `json:"handle,omitempty"`
	Index     int    `json:"index"`
	End       string `json:"end"`
	Message   string `json:"message,omitempty"`
	Answer    string `json:"answer"`
	Truncated bool   `json:"truncated,omitempty"`
	Steps     int    `json:"steps"`
}

func (t spawnTool) Run(ctx context.Context, env *tools.Env, args map[string]any) (tools.Result, error) {
	s, orch := t.s, t.s.orch
	raw, _ := json.Marshal(args)
	var a struct {
		Tasks []subTask `json:"tasks"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return badArgs("spawn_subagents: %v", err), nil
	}
	o := &orch.o
	if left := o.MaxSubagents - orch.spawned; len(a.Tasks) > left {
		return badArgs("spawn_subagents: %d sub-tasks asked for, but only %d more sub-agents may be spawned in this episode (max_subagents %d); nothing was spawned",
			len(a.Tasks), left, o.MaxSubagents), nil
	}
	allowed := s.subagentTools()
	for i, st := range a.Tasks {
		for _, name := range st.Tools {
			if !slices.Contains(allowed, name) {
				return badArgs("spawn_subagents: tasks[%d].tools: %q is not a tool a sub-agent may have (%s); nothing was spawned", i, name, strings.Join(allowed, ", ")), nil
			}
		}
	}
	if orch.async != nil {
		return s.spawnAsync(ctx, a.Tasks, allowed)
	}
	stage := orch.stage
	orch.stage++
	orch.spawned += len(a.Tasks)
	step := s.w.Steps() // the tool step this call is recorded as
	var subs []trajectory.Subagent
	if s.cfg.Subagents != nil && s.cfg.Subagents.Recorded != nil {
		subs = s.recordedSubagents(stage, step, a.Tasks)
	} else {
		subs = s.runSubagents(ctx, stage, step, a.Tasks, allowed)
	}
	orch.endStage(subs)
	out := make([]spawnResult, len(subs))
	for i, sa := range subs {
		out[i] = spawnResult{Index: i, End: sa.End, Message: sa.Message, Answer: sa.Answer, Truncated: sa.Truncated, Steps: sa.Steps}
		if err := s.w.Subagent(sa); err != nil {
			return tools.Result{}, &RecordError{EpisodeID: s.cfg.EpisodeID, Err: err}
		}
	}
	return tools.Result{Text: spawnOutput(out)}, nil
}

func badArgs(format string, a ...any) tools.Result {
	msg := fmt.Sprintf(format, a...)
	return tools.Result{ErrorKind: tools.KindBadArguments, Err: msg, Text: "error: " + msg}
}

// subagentTools are the tools a sub-agent may be given: the orchestrator's
// subagent_tools, else the task's less spawn_subagents; finish always.
func (s *Session) subagentTools() []string {
	names := s.orch.o.SubagentTools
	if len(names) == 0 {
		names = s.task.Tools
	}
	out := make([]string, 0, len(names)+1)
	for _, n := range names {
		if n != NameSpawnSubagents && n != NameWait && n != NameCollect {
			out = append(out, n)
		}
	}
	if !slices.Contains(out, tools.NameFinish) {
		out = append(out, tools.NameFinish)
	}
	return out
}

// runSubagents runs a call's sub-agents, at most max_parallel at once,
// each holding a slot of the scheduler (if any) while it runs; the
// orchestrator's own slot (unless Slotless) is handed to the first
// meanwhile. It returns
// their records in the call's order.
func (s *Session) runSubagents(ctx context.Context, stage, step int, tasks []subTask, allowed []string) []trajectory.Subagent {
	slots := s.cfg.Subagents.Slots
	// The orchestrator's own slot goes to the first sub-agent to start
	// (never released in between, so no queued episode takes it first);
	// the others take slots before any queued episode.
	slotless := s.cfg.Subagents.Slotless
	var inherited atomic.Bool
	inherited.Store(slots != nil && !slotless)
	out := make([]trajectory.Subagent, len(tasks))
	sem := make(chan struct{}, s.orch.o.MaxParallel)
	var wg sync.WaitGroup
	for i, st := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i] = s.runSubagent(ctx, stage, step, i, st, allowed, slots, inherited.CompareAndSwap(true, false), nil)
		}()
	}
	wg.Wait()
	if slots != nil && !slotless && !inherited.Load() {
		// The orchestrator takes a slot back whatever happens: the
		// scheduler counts it running until it ends.
		slots.Acquire(context.WithoutCancel(ctx), s.backend)
	}
	return out
}

// runSubagent runs one sub-episode to its end and summarises it as the
// orchestrator's record holds it.
//
// newSandbox, if set, makes its sandbox (an asynchronous sub-agent's fork,
// made at the spawn); else it is a fork made now (share_workspace) or a
// fresh one.
func (s *Session) runSubagent(ctx context.Context, stage, step, index int, st subTask, allowed []string, slots Slots, inherited bool, newSandbox SandboxFactory) (sa trajectory.Subagent) {
	id := fmt.Sprintf("%s.s%d-%d", s.cfg.EpisodeID, stage, index)
	names := st.Tools
	if len(names) == 0 {
		names = allowed
	}
	if !slices.Contains(names, tools.NameFinish) {
		names = append(slices.Clone(names), tools.NameFinish)
	}
	sa = trajectory.Subagent{EpisodeID: id, Step: step, Stage: stage, Index: index, Prompt: st.Prompt, Tools: names}
	start := time.Now()
	defer func() { sa.DurationMS = ms(time.Since(start)) }()
	if slots != nil && !inherited {
		if err := slots.Acquire(ctx, s.backend); err != nil {
			sa.End, sa.Message = trajectory.EndCancelled, "cancelled before it started: "+err.Error()
			return sa
		}
	}
	if slots != nil {
		defer slots.Release(s.backend)
	}
	t := s.subTask(st.Prompt, names)
	cfg := Config{
		Task: t, EpisodeID: id, RolloutID: s.cfg.RolloutID, Seed: s.cfg.Seed,
		Dir: filepath.Join(s.cfg.Dir, SubagentsDir), Backend: s.backend, NewSandbox: s.cfg.NewSandbox,
		Policy: s.orch.policy, PolicyInfo: s.orch.info,
		ExtraTools: s.cfg.ExtraTools, ToolEnv: s.cfg.ToolEnv,
		Parent: &trajectory.Parent{EpisodeID: s.cfg.EpisodeID, Step: step, Stage: stage, Index: index},
	}
	switch {
	case newSandbox != nil:
		cfg.NewSandbox = newSandbox
	case s.orch.o.ShareWorkspace:
		cfg.NewSandbox = s.forkSandbox
	}
	tr, err := Run(ctx, cfg)
	sa.File = filepath.Join(SubagentsDir, id+".json")
	if tr == nil {
		sa.End, sa.Message, sa.File = trajectory.EndRecordError, err.Error(), ""
		return sa
	}
	if s.cfg.Subagents.Observe != nil {
		s.cfg.Subagents.Observe(tr)
	}
	summarizeSubagent(&sa, tr, s.orch.o.MaxAnswerBytes)
	if err != nil && sa.Message == "" {
		sa.Message = err.Error()
	}
	return sa
}

// summarizeSubagent fills what the orchestrator's record holds of a
// sub-episode's record: how it ended, its answer as shown (at most
// maxAnswer bytes), its steps, and whether it finished and did work.
func summarizeSubagent(sa *trajectory.Subagent, tr *trajectory.Trajectory, maxAnswer int) {
	sa.Steps, sa.ToolCalls = tr.Stats.Turns, tr.Stats.ToolCalls
	var answer string
	if term := tr.Termination; term != nil {
		sa.End, sa.Message = term.Reason, term.Message
		if term.Answer != nil {
			answer = *term.Answer
		}
	}
	sa.AnswerBytes = len(answer)
	shown, dropped := Truncate(answer, maxAnswer)
	sa.Answer, sa.Truncated = shown, dropped > 0
	sa.Finished = sa.End == trajectory.EndFinished && strings.TrimSpace(answer) != ""
	work := 0
	for _, step := range tr.Steps {
		if step.Type == trajectory.StepTool && step.Name != tools.NameFinish && toolRan(step) {
			work++
		}
	}
	sa.Useful = sa.Finished && work > 0
}

// toolRan says a tool step did something: the tool ran, whatever its
// command's exit status. A call the tool never ran (a tool the sub-agent
// was not given, arguments it refused, a sandbox or policy failure, a
// cancellation) is no work: else an orchestrator earns r_parallel with
// sub-agents it hands no tool but finish, whose calls all fail.
func toolRan(step trajectory.Step) bool {
	if step.ErrorKind == nil {
		return true
	}
	switch tools.ErrorKind(*step.ErrorKind) {
	case tools.KindNonzeroExit, tools.KindOutputTruncated, tools.KindTimeout, tools.KindOOM:
		return true
	}
	return false
}

// subTask is the task a sub-agent runs: the sub-task's prompt with the
// orchestrator task's sandbox (and, without share_workspace, its files),
// the tools given, the sub-agent limits, and no reward (a sub-agent is
// frozen: its outcome is an observation, never scored).
func (s *Session) subTask(prompt string, names []string) *Task {
	p := s.task
	t := &Task{ID: p.ID + ".sub", Prompt: prompt, Sandbox: p.Sandbox, Tools: names, Retriever: p.Retriever, dir: p.dir}
	if l := s.orch.o.SubagentLimits; l != nil {
		t.Limits = *l
	}
	if !s.orch.o.ShareWorkspace {
		t.Files, t.FilesBase64, t.Workspace = p.Files, p.FilesBase64, p.Workspace
	}
	t.WithDefaults()
	return t
}

// forkSandbox makes a sub-agent's sandbox as a fork of the orchestrator's
// (share_workspace): its files as they are now. The orchestrator runs
// nothing meanwhile: it is waiting on this call.
func (s *Session) forkSandbox(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error) {
	f, ok := sandbox.Find[sandbox.Forker](s.sb)
	if !ok {
		return nil, fmt.Errorf("share_workspace: the %s backend's sandboxes cannot be forked: %w", backend, sandbox.ErrInvalidSpec)
	}
	kids, err := f.Fork(ctx, 1)
	if err != nil {
		return nil, fmt.Errorf("share_workspace: fork the orchestrator's sandbox: %w", err)
	}
	sandbox.NameEpisode(kids[0], spec.Labels[sandbox.LabelEpisode])
	return kids[0], nil
}

// recordedSubagents answers a call from the recording (replay): the
// recorded sub-agents of the same stage and index with the same prompt,
// as the orchestrator saw them; one the recording lacks ends
// "not_recorded".
func (s *Session) recordedSubagents(stage, step int, tasks []subTask) []trajectory.Subagent {
	out := make([]trajectory.Subagent, len(tasks))
	for i, st := range tasks {
		out[i] = trajectory.Subagent{EpisodeID: fmt.Sprintf("%s.s%d-%d", s.cfg.EpisodeID, stage, i), Step: step, Stage: stage, Index: i, Prompt: st.Prompt, Tools: st.Tools,
			End: EndNotRecorded, Message: fmt.Sprintf("the recording has no sub-agent %d of stage %d with this prompt", i, stage)}
		for _, r := range s.cfg.Subagents.Recorded {
			if r.Stage == stage && r.Index == i && r.Prompt == st.Prompt {
				r.Step, r.File, r.Critical = step, "", false
				out[i] = r
				break
			}
		}
		if out[i].Tools == nil {
			out[i].Tools = []string{}
		}
	}
	return out
}

// EndNotRecorded is a replayed sub-agent's end when the recording holds no
// sub-agent for the call (the replay's orchestrator diverged).
const EndNotRecorded = "not_recorded"

// orchestratorStats fills an orchestrator episode's critical steps: per
// stage, the orchestrator's turns plus its longest sub-agent's, summed
// over stages, which is the orchestrator's turns plus the sum over stages
// of the stage's longest sub-agent.
func (s *Session) orchestratorStats() {
	if s.orch == nil {
		return
	}
	crit, total, n := s.stats.Turns, s.stats.Turns+s.orch.subSteps, s.orch.spawned
	for _, m := range s.orch.stageSteps {
		crit += m
	}
	s.stats.CriticalSteps, s.stats.TotalSteps, s.stats.Subagents = &crit, &total, &n
}

// CriticalSteps computes an orchestrator record's critical steps from its
// tree (see trajectory.CriticalSteps).
func CriticalSteps(t *trajectory.Trajectory) int { return trajectory.CriticalSteps(t) }

// spawnOutput is the tool's answer: {"results": [...]}, one sub-agent a line.
func spawnOutput(rs []spawnResult) string {
	var b strings.Builder
	b.WriteString("{\"results\": [\n")
	for i, r := range rs {
		line, _ := json.Marshal(r)
		b.Write(line)
		if i < len(rs)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("]}\n")
	return b.String()
}

// endStage accounts a stage's sub-agents: their steps in the total, the
// longest one's in the stage's critical steps, and that one marked
// Critical (the first of equals).
func (o *orchestration) endStage(subs []trajectory.Subagent) {
	most := 0
	for i := range subs {
		most = max(most, subs[i].Steps)
		o.subSteps += subs[i].Steps
	}
	for i := range subs {
		if subs[i].Steps == most {
			subs[i].Critical = true
			break
		}
	}
	o.stageSteps = append(o.stageSteps, most)
}
