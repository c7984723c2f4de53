package replay

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// ErrBadTrajectory marks a trajectory that cannot be replayed as it is (no
// task, an unknown backend, a task that no longer parses).
var ErrBadTrajectory = errors.New("trajectory cannot be replayed")

// Options configure Episode.
type Options struct {
	// NewSandbox makes the sandbox. Episode passes the spec the recording
	// ran: its limits, runtime, network, workdir, pinned env and hostname,
	// and Image as resolved (see ResolveImage).
	NewSandbox agent.SandboxFactory
	// Image, if set, replaces the task's image name (the recorded digest as
	// "docker:sha256:...").
	Image string
	// Dir receives the replay's own trajectory.
	Dir string
	// BaseDir resolves the task's relative workspace and index paths
	// (default: the task file's directory the run recorded, when it exists
	// here, else the current one; see BaseDir).
	BaseDir string
	// ID is the replay's own rollout id (default a fresh "replay-..." one):
	// its trajectory is <ID>.<task id>.<group index>, never the recorded
	// episode's id, so it never replaces the recording or joins its group.
	ID string
	// File is the trajectory file being replayed, recorded in replay_of.
	File string
	// Until stops after the step with this index; -1 replays everything.
	Until int
	// Policy, if set, takes over after Until (at the end of that step's
	// turn) or at the first divergence, and the episode runs on live.
	Policy     agent.Policy
	PolicyInfo trajectory.Policy
	// KeepFinish stops before a recorded finish call, so the sandbox is
	// still there for AtStop (a finished episode closes its sandbox).
	KeepFinish bool
	// Ignore masks text matching these (with "<ignored>") before comparing.
	Ignore []*regexp.Regexp
	// Strict compares outputs byte for byte: wall-clock durations (pytest's
	// "in 0.02s", go test's "ok pkg 0.123s", time's "real 0m0.01s") are
	// otherwise masked, and a step that differs only there is reported
	// matched with DurationsDiffer.
	Strict bool
	// Configure, if set, adjusts the episode's config (search tools).
	Configure func(*agent.Config) error
	// OnStep, if set, sees each step as it is replayed (streamed reports).
	OnStep func(StepReport)
	// LiveSubagents re-runs an orchestrator's sub-agents, each replaying
	// its own recorded turns in a fresh sandbox (their records are read
	// from SubagentDir); by default every spawn_subagents call is answered
	// with the recorded sub-agents' answers, as the orchestrator saw them.
	LiveSubagents bool
	// SubagentDir is the directory the recorded sub-episode files
	// (subagents[].file) are relative to: the recorded trajectory's own
	// (default: File's directory).
	SubagentDir string
	// AtStop, if set, is called with the live sandbox where the replay
	// stops, before the sandbox is closed (an interactive shell).
	AtStop func(ctx context.Context, sb sandbox.Sandbox) error
}

// Report is what a replay found.
type Report struct {
	EpisodeID string `json:"episode_id"`
	TaskID    string `json:"task_id"`
	Backend   string `json:"backend"`
	// Image is what ran: the recorded digest, or the name when there is none.
	Image string `json:"image,omitempty"`
	// Notes are things worth knowing that are not divergences (an image
	// found by digest, a recorded sandbox that differs from the task's).
	Notes []string     `json:"notes,omitempty"`
	Steps []StepReport `json:"steps"`
	// Divergence is the first step whose result differs, if any.
	Divergence *StepReport `json:"divergence"`
	// Stop says where and why the replay stopped: "end" (the recording
	// ran out), "until", "divergence", "ended" (the episode ended), "live"
	// (a live policy ran it on).
	Stop       string `json:"stop"`
	StopDetail string `json:"stop_detail"`
	// LastStep is the index of the last recorded step replayed.
	LastStep int `json:"last_step"`
	// Recorded and Replayed are the two ends and rewards, when the replay
	// ran to an end.
	Recorded *End `json:"recorded,omitempty"`
	Replayed *End `json:"replayed,omitempty"`
	// ReplayID is the episode id of the replay's own record, and
	// Trajectory its path.
	ReplayID   string `json:"replay_id"`
	Trajectory string `json:"trajectory"`
}

// End is how an episode ended.
type End struct {
	Reason string   `json:"reason"`
	Reward *float64 `json:"reward"`
}

// Diverged reports whether a step or the end differed.
func (r *Report) Diverged() bool { return r.Divergence != nil }

// StepReport is one replayed step.
type StepReport struct {
	Index int    `json:"index"`
	Turn  int    `json:"turn"`
	Type  string `json:"type"`
	// Name and Arguments are the tool call's; Content the model turn's text.
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
	Content   string `json:"content,omitempty"`
	// Live marks a step the live policy took (nothing to compare with).
	Live bool `json:"live,omitempty"`
	// Match is false for a diverging tool step; Diffs say how.
	Match bool        `json:"match"`
	Diffs []FieldDiff `json:"diffs,omitempty"`
	// DurationsDiffer marks a step that matched once wall-clock durations
	// in its output were masked ("matched (durations differ)").
	DurationsDiffer bool `json:"durations_differ,omitempty"`
	// ErrorKind and ExitCode are the replayed result's.
	ErrorKind  string  `json:"error_kind,omitempty"`
	ExitCode   *int    `json:"exit_code,omitempty"`
	Truncated  bool    `json:"truncated,omitempty"`
	RecordedMS float64 `json:"recorded_ms"`
	ReplayedMS float64 `json:"replayed_ms"`
}

// BaseDir is the directory a replay of tr resolves the task's relative
// workspace and index paths against: base when given (--base), else the
// task file's directory the run recorded (task_dir) when it exists here,
// else the current directory ("").
func BaseDir(tr *trajectory.Trajectory, base string) string {
	if base != "" {
		return base
	}
	if tr.TaskDir != "" {
		if st, err := os.Stat(tr.TaskDir); err == nil && st.IsDir() {
			return tr.TaskDir
		}
	}
	return ""
}

// TaskOf decodes the task a trajectory recorded, resolving relative paths
// as BaseDir(tr, base) says.
func TaskOf(tr *trajectory.Trajectory, base string) (*agent.Task, error) {
	if len(bytes.TrimSpace(tr.Task)) == 0 || string(tr.Task) == "null" {
		return nil, fmt.Errorf("trajectory %s recorded no task: %w", tr.EpisodeID, ErrBadTrajectory)
	}
	task, err := agent.ParseTask(tr.Task, BaseDir(tr, base), nil)
	if err != nil {
		return nil, fmt.Errorf("trajectory %s: its task %q: %v: %w", tr.EpisodeID, tr.TaskID, err, ErrBadTrajectory)
	}
	return task, nil
}

// replayable refuses an imported episode that does not carry what a
// replay needs, saying what is missing: a conversation imported from
// production (OpenAI format) records no sandbox, workspace or Rollbox
// tools, and later user messages cannot be played back into a session.
// An imported Rollbox trajectory of a real sandbox replays like any other.
func replayable(tr *trajectory.Trajectory) error {
	if tr.Import == nil {
		return nil
	}
	var missing []string
	if tr.Sandbox.Backend == "" || sandbox.CheckBackend(tr.Sandbox.Backend) != nil {
		missing = append(missing, tr.Import.Missing...)
		if len(missing) == 0 {
			missing = append(missing, "sandbox.backend")
		}
	}
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepUser {
			missing = append(missing, fmt.Sprintf("a way to play back the user's later messages (step %d is one)", s.Index))
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("episode %s was imported from %s (format %s, id %s) and cannot be replayed: it does not record %s; "+
		"replay works on imported Rollbox trajectories of a sandbox (their task carries the image and the files): %w",
		tr.EpisodeID, trajectory.SourceOf(tr), tr.Import.Format, tr.Import.ExternalID, strings.Join(missing, ", "), ErrBadTrajectory)
}

// Episode recreates a recorded episode's sandbox and re-executes its tool
// calls in order through the same session code that recorded them (the
// same tools, environment, truncation and error kinds), comparing each
// result with the recorded one. It stops at the first divergence, after
// step Until, or where the recording ends; with a Policy the episode then
// goes on live. The error is for a replay that could not run at all.
//
// # Errors
//
// ErrBadTrajectory (wrapped) for a trajectory without a usable task or
// backend; an error from the record of the replay itself.
func Episode(ctx context.Context, tr *trajectory.Trajectory, opts Options) (*Report, error) {
	if err := replayable(tr); err != nil {
		return nil, err
	}
	task, err := TaskOf(tr, opts.BaseDir)
	if err != nil {
		return nil, err
	}
	if err := sandbox.CheckBackend(tr.Sandbox.Backend); err != nil {
		return nil, fmt.Errorf("trajectory %s: sandbox.backend %v: %w", tr.EpisodeID, err, ErrBadTrajectory)
	}
	var recLimits *sandbox.Limits
	if len(tr.Sandbox.Limits) > 0 && string(tr.Sandbox.Limits) != "null" {
		recLimits = new(sandbox.Limits)
		if err := json.Unmarshal(tr.Sandbox.Limits, recLimits); err != nil {
			return nil, fmt.Errorf("trajectory %s: sandbox.limits: %v: %w", tr.EpisodeID, err, ErrBadTrajectory)
		}
	}
	until := opts.Until
	if until < 0 {
		until = len(tr.Steps) - 1
	}
	if opts.Policy != nil { // a live policy needs every call of a turn answered
		until = endOfTurn(tr, until)
	}
	r := &Report{EpisodeID: tr.EpisodeID, TaskID: tr.TaskID, Backend: tr.Sandbox.Backend, LastStep: -1, Steps: []StepReport{}}
	r.Image = tr.Sandbox.ImageDigest
	if r.Image == "" {
		r.Image = task.Sandbox.Image
	}

	rp := &run{tr: tr, opts: opts, until: until, report: r}
	var sampling agent.Sampling
	if len(tr.Policy.Sampling) > 0 {
		json.Unmarshal(tr.Policy.Sampling, &sampling)
	}
	pinned := tr.Pinned
	if pinned == nil {
		pinned = map[string]string{}
	}
	info := opts.PolicyInfo
	if info.Kind == "" {
		info = trajectory.Policy{Kind: "replay", Endpoint: tr.EpisodeID}
	}
	id := opts.ID
	if id == "" {
		id = NewID()
	}
	of := &trajectory.ReplayOf{EpisodeID: tr.EpisodeID, RolloutID: tr.RolloutID, TaskHash: tr.TaskHash, File: opts.File}
	if opts.Until >= 0 {
		of.Until = &opts.Until
	}
	cfg := agent.Config{
		Task: task, EpisodeID: fmt.Sprintf("%s.%s.%d", id, tr.TaskID, tr.GroupIndex), RolloutID: id, GroupID: id + "." + tr.TaskID,
		GroupIndex: tr.GroupIndex, ReplayOf: of,
		Seed: tr.Seed, Dir: opts.Dir, Backend: tr.Sandbox.Backend, PolicyInfo: info, Sampling: sampling, Pinned: pinned,
		NewSandbox: func(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error) {
			if opts.Image != "" {
				spec.Image = opts.Image
			}
			r.Notes = append(r.Notes, recordedSpec(&spec, tr.Sandbox, recLimits)...)
			return opts.NewSandbox(ctx, tr.Sandbox.Backend, spec)
		},
		Observe:    rp.observe,
		BeforeCall: rp.beforeCall,
	}
	if task.Orchestrator != nil {
		sub, err := subagentsOf(tr, opts)
		if err != nil {
			return nil, err
		}
		cfg.Subagents = sub
	}
	if opts.Configure != nil {
		if err := opts.Configure(&cfg); err != nil {
			return nil, err
		}
	}
	s, err := agent.Open(ctx, cfg)
	var oe *agent.OpenError
	if err != nil && !errors.As(err, &oe) {
		return nil, err
	}
	r.ReplayID = cfg.EpisodeID
	r.Trajectory = filepath.Join(opts.Dir, cfg.EpisodeID+".json")
	if oe != nil { // the sandbox could not be made
		rp.endDiverged(s.Trajectory())
		return r, nil
	}

	turns := Turns(tr)
	models := modelSteps(tr)
	for i, turn := range turns {
		if rp.stopped() || models[i] > until {
			break
		}
		if _, _, err := s.Step(ctx, turn); err != nil {
			return r, err
		}
		rp.mu.Lock()
		r.LastStep = rp.next - 1
		rp.mu.Unlock()
		if s.Ended() {
			break
		}
	}

	switch {
	case s.Ended():
		// The replay ran to an end of its own: compare it with the recording's.
		rp.compareEnd(s.Trajectory())
	case opts.Policy != nil:
		if r.Divergence != nil {
			r.StopDetail = fmt.Sprintf("diverged at step %d; the live policy took over after step %d", r.Divergence.Index, r.LastStep)
		} else {
			r.StopDetail = fmt.Sprintf("the live policy took over after step %d", r.LastStep)
		}
		r.Stop = "live"
		rp.mu.Lock()
		rp.live = true
		rp.mu.Unlock()
		got, err := s.Drive(ctx, opts.Policy)
		if err != nil {
			return r, err
		}
		r.Replayed = endOf(got)
	default:
		rp.explainStop()
		if opts.AtStop != nil && s.Sandbox() != nil {
			if err := opts.AtStop(ctx, s.Sandbox()); err != nil {
				s.Cancel(context.WithoutCancel(ctx), trajectory.EndCancelled, "replay stopped: "+r.StopDetail)
				return r, err
			}
		}
		if err := s.Cancel(context.WithoutCancel(ctx), trajectory.EndCancelled, "replay stopped: "+r.StopDetail); err != nil {
			return r, err
		}
	}
	return r, nil
}

// NewID returns a fresh replay rollout id: "replay-<UTC time>-<random>".
func NewID() string {
	var b [6]byte
	rand.Read(b[:])
	return "replay-" + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

// run is the state of one replay, shared with the session's hooks.
type run struct {
	tr     *trajectory.Trajectory
	opts   Options
	until  int
	report *Report

	mu   sync.Mutex
	next int // index of the next step the session records
	live bool
	// heldFinish is set when a recorded finish was held back (KeepFinish).
	heldFinish bool
}

// stopped reports whether the recorded turns stop here: at a divergence
// (a live policy, if any, takes over after the diverging turn) or a finish
// held back.
func (rp *run) stopped() bool {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return rp.report.Divergence != nil || rp.heldFinish
}

// beforeCall lets a call run unless the replay has diverged (and no live
// policy is waiting), passed Until, or it is a finish to hold back.
func (rp *run) beforeCall(call agent.ToolCall) bool {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.live {
		return true
	}
	if rp.report.Divergence != nil && rp.opts.Policy == nil {
		return false
	}
	if rp.next > rp.until {
		return false
	}
	if rp.opts.KeepFinish && call.Name == "finish" {
		rp.heldFinish = true
		return false
	}
	return true
}

// observe compares each step the session records with the recorded one.
func (rp *run) observe(got trajectory.Step) {
	rp.mu.Lock()
	rp.next = got.Index + 1
	sr := StepReport{Index: got.Index, Turn: got.Turn, Type: got.Type, Name: got.Name, Content: got.Content,
		Live: rp.live, Match: true, ReplayedMS: got.DurationMS, ExitCode: got.ExitCode, Truncated: got.Truncated}
	if got.ErrorKind != nil {
		sr.ErrorKind = *got.ErrorKind
	}
	if got.Type == trajectory.StepTool {
		sr.Arguments = string(got.Arguments)
	} else {
		for _, c := range got.ToolCalls {
			sr.Arguments += c.Name + " "
		}
		sr.Arguments = strings.TrimSpace(sr.Arguments)
	}
	if !rp.live {
		if got.Index < len(rp.tr.Steps) {
			rec := rp.tr.Steps[got.Index]
			sr.RecordedMS = rec.DurationMS
			switch {
			case rec.Type != got.Type:
				sr.Match = false
				sr.Diffs = []FieldDiff{{Field: "type", Recorded: rec.Type, Replayed: got.Type}}
			case got.Type == trajectory.StepTool:
				sr.Diffs, sr.DurationsDiffer = compareTool(rec, got, rp.opts.Ignore, rp.opts.Strict)
				sr.Match = len(sr.Diffs) == 0
			}
		} else {
			sr.Match = false
			sr.Diffs = []FieldDiff{{Field: "step", Recorded: "(none: the recording has " + fmt.Sprint(len(rp.tr.Steps)) + " steps)", Replayed: got.Type + " " + got.Name}}
		}
		if !sr.Match && rp.report.Divergence == nil {
			d := sr
			rp.report.Divergence = &d
		}
	}
	rp.report.Steps = append(rp.report.Steps, sr)
	onStep := rp.opts.OnStep
	rp.mu.Unlock()
	if onStep != nil {
		onStep(sr)
	}
}

// compareEnd compares the replay's end and reward with the recording's.
func (rp *run) compareEnd(got *trajectory.Trajectory) {
	r := rp.report
	r.Recorded, r.Replayed = endOf(rp.tr), endOf(got)
	r.Stop = "ended"
	r.StopDetail = "the episode ended " + r.Replayed.Reason
	if r.Divergence != nil {
		return
	}
	d := &StepReport{Index: len(got.Steps), Type: "end", Match: false}
	if a, b := r.Recorded.Reason, r.Replayed.Reason; a != b {
		d.Diffs = append(d.Diffs, FieldDiff{Field: "termination.reason", Recorded: a, Replayed: b})
	}
	// An imported episode's reward is its outcome reward (the signals that
	// came later), not the task's: it is not compared.
	if a, b := rewardText(r.Recorded.Reward), rewardText(r.Replayed.Reward); a != b && rp.tr.Outcomes == nil {
		d.Diffs = append(d.Diffs, FieldDiff{Field: "reward.total", Recorded: a, Replayed: b})
	}
	if rp.tr.Reward != nil && got.Reward != nil && rp.tr.Reward.Verifier != nil && got.Reward.Verifier != nil {
		a, b := rp.tr.Reward.Verifier, got.Reward.Verifier
		if a.ExitCode != b.ExitCode {
			d.Diffs = append(d.Diffs, FieldDiff{Field: "reward.verifier.exit_code", Recorded: fmt.Sprint(a.ExitCode), Replayed: fmt.Sprint(b.ExitCode)})
		}
	}
	if len(got.Steps) != len(rp.tr.Steps) {
		d.Diffs = append(d.Diffs, FieldDiff{Field: "steps", Recorded: fmt.Sprint(len(rp.tr.Steps)), Replayed: fmt.Sprint(len(got.Steps))})
	}
	if len(d.Diffs) > 0 {
		r.Divergence = d
		r.Stop = "divergence"
		r.StopDetail = "the episode ended differently"
	}
}

// endDiverged reports a sandbox that could not be made.
func (rp *run) endDiverged(got *trajectory.Trajectory) {
	r := rp.report
	r.Recorded, r.Replayed = endOf(rp.tr), endOf(got)
	msg := ""
	if got.Termination != nil {
		msg = got.Termination.Message
	}
	r.Stop = "ended"
	r.StopDetail = "the sandbox could not be made: " + msg
	if r.Recorded.Reason != r.Replayed.Reason || len(rp.tr.Steps) > 0 {
		r.Divergence = &StepReport{Index: 0, Type: "end", Diffs: []FieldDiff{{Field: "termination", Recorded: r.Recorded.Reason, Replayed: r.Replayed.Reason + ": " + msg}}}
		r.Stop = "divergence"
	}
}

// explainStop says why a replay that did not reach an end stopped.
func (rp *run) explainStop() {
	r := rp.report
	switch {
	case r.Divergence != nil:
		r.Stop = "divergence"
		r.StopDetail = fmt.Sprintf("stopped at the first divergence, step %d", r.Divergence.Index)
	case rp.heldFinish:
		r.Stop = "until"
		r.StopDetail = fmt.Sprintf("stopped before the recorded finish (step %d) to keep the sandbox", r.LastStep+1)
	case rp.until < len(rp.tr.Steps)-1:
		r.Stop = "until"
		r.StopDetail = fmt.Sprintf("stopped after step %d as asked", r.LastStep)
	default:
		r.Stop = "end"
		reason := "?"
		if rp.tr.Termination != nil {
			reason = rp.tr.Termination.Reason
			if m := rp.tr.Termination.Message; m != "" {
				reason += ": " + m
			}
		}
		r.StopDetail = "the recording ends here (" + reason + ")"
	}
}

func endOf(t *trajectory.Trajectory) *End {
	e := &End{Reason: "?"}
	if t.Termination != nil {
		e.Reason = t.Termination.Reason
	}
	if v, ok := t.Value(); ok {
		e.Reward = &v
	}
	return e
}

func rewardText(v *float64) string {
	if v == nil {
		return "none"
	}
	return fmt.Sprintf("%.6g", *v)
}

// modelSteps lists the index of each model step, in order.
func modelSteps(tr *trajectory.Trajectory) []int {
	var out []int
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepModel {
			out = append(out, s.Index)
		}
	}
	return out
}

// endOfTurn is the last step of the turn holding step i.
func endOfTurn(tr *trajectory.Trajectory, i int) int {
	if i >= len(tr.Steps) {
		return len(tr.Steps) - 1
	}
	turn := tr.Steps[i].Turn
	for i+1 < len(tr.Steps) && tr.Steps[i+1].Turn == turn {
		i++
	}
	return i
}

// recordedSpec makes spec the sandbox the recording ran (limits, runtime,
// network, workdir) and says where that differs from what the task alone
// would give today.
func recordedSpec(spec *sandbox.Spec, rec trajectory.Sandbox, limits *sandbox.Limits) []string {
	var notes []string
	want := spec.WithDefaults()
	if limits != nil {
		if *limits != want.Limits {
			notes = append(notes, fmt.Sprintf("the recorded limits (%s) differ from the task's defaults today (%s); using the recorded ones", limitsText(*limits), limitsText(want.Limits)))
		}
		spec.Limits = *limits
	}
	if rec.Runtime != "" {
		spec.Runtime = rec.Runtime
	}
	if rec.Network != "" {
		spec.Network = rec.Network
	}
	if rec.Workdir != "" {
		spec.Workdir = rec.Workdir
	}
	return notes
}

// limitsText is a sandbox's limits as people read them.
func limitsText(l sandbox.Limits) string {
	return fmt.Sprintf("cpus %g, memory %d MB, pids %d, disk %d MB, tmp %d MB, exec timeout %v, output %d B",
		l.CPUs, l.MemoryMB, l.PIDs, l.DiskMB, l.TmpMB, l.ExecTimeout, l.OutputBytes)
}

// subagentsOf is how a replayed orchestrator's spawn_subagents calls are
// answered: from the recorded sub-agents (default), or, with
// LiveSubagents, by running each again on its own recorded turns.
func subagentsOf(tr *trajectory.Trajectory, opts Options) (*agent.Subagents, error) {
	if !opts.LiveSubagents {
		return &agent.Subagents{Recorded: append([]trajectory.Subagent{}, tr.Subagents...)}, nil
	}
	dir := opts.SubagentDir
	if dir == "" {
		dir = filepath.Dir(opts.File)
	}
	p := &promptTurns{turns: map[string][]agent.Turn{}, failed: map[string]string{}}
	for _, sa := range tr.Subagents {
		if sa.File == "" {
			continue
		}
		sub, err := trajectory.Read(filepath.Join(dir, sa.File))
		if err != nil {
			return nil, fmt.Errorf("live sub-agents need the sub-episodes' records: %w", err)
		}
		if _, dup := p.turns[sa.Prompt]; dup {
			continue
		}
		p.turns[sa.Prompt] = Turns(sub)
		if t := sub.Termination; t != nil && t.Reason == trajectory.EndPolicyError {
			p.failed[sa.Prompt] = t.Message
		}
	}
	info := trajectory.Policy{Kind: "replay", Endpoint: "sub-agents of " + tr.EpisodeID}
	return &agent.Subagents{Policy: func(*agent.Task) (agent.Policy, trajectory.Policy, error) { return p, info, nil }}, nil
}

// promptTurns replays a sub-agent's recorded turns, picked by its prompt;
// one whose recording ended policy_error fails again after them, with the
// recorded message.
type promptTurns struct {
	turns  map[string][]agent.Turn
	failed map[string]string
}

// recordedPolicyError is a recorded policy failure, as it was worded.
type recordedPolicyError struct{ msg string }

func (e recordedPolicyError) Error() string { return e.msg }
func (e recordedPolicyError) Unwrap() error { return agent.ErrPolicy }

func (p *promptTurns) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	var prompt string
	for _, m := range req.Messages {
		if m.Role == agent.RoleUser {
			prompt = m.Content
			break
		}
	}
	turns, ok := p.turns[prompt]
	if msg, failed := p.failed[prompt]; failed && req.Turn >= len(turns) {
		return agent.Turn{}, recordedPolicyError{msg}
	}
	if !ok || req.Turn >= len(turns) {
		return agent.Turn{}, fmt.Errorf("%w: the recording has no turn %d of a sub-agent with this prompt", agent.ErrPolicy, req.Turn)
	}
	return turns[req.Turn], nil
}
