package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rollbox/rollbox/agent/reward"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// SandboxFactory makes the episode's sandbox for a spec.
type SandboxFactory func(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error)

// Config is one episode.
type Config struct {
	Task       *Task
	EpisodeID  string
	RolloutID  string
	GroupID    string
	GroupIndex int
	Seed       int64
	// Dir receives the trajectory (<episode_id>.json).
	Dir string
	// Backend is used when the task names none.
	Backend    string
	NewSandbox SandboxFactory
	// Policy is the decider for Run; PolicyInfo describes it.
	Policy     Policy
	PolicyInfo trajectory.Policy
	Sampling   Sampling
	// ExtraTools add to the builtins (search, read, prune).
	ExtraTools map[string]tools.Tool
	// ToolEnv, if set, is called to add to each episode's tool Env (the
	// retriever's ledger).
	ToolEnv func(env *tools.Env) error
	// Observe, if set, sees every step as it is recorded (metrics).
	Observe func(trajectory.Step)
	// Pinned, if set, is pinned instead of fresh values (seed, episode id,
	// hostname, env; see PinnedEnv): replay passes a trajectory's own.
	Pinned map[string]string
	// BeforeCall, if set, is asked before each tool call runs; false stops
	// the turn there and leaves the episode open (replay stops at a step).
	BeforeCall func(call ToolCall) bool
}

// Session is an episode in progress: its sandbox, tools, messages and
// record. Run drives it with a Policy; the rollout API's environment mode
// drives it step by step. Methods are serialised by a mutex.
type Session struct {
	mu       sync.Mutex
	cfg      Config
	task     *Task
	start    time.Time
	deadline time.Time
	w        *trajectory.Writer
	sb       sandbox.Sandbox
	reg      *tools.Registry
	env      *tools.Env
	messages []Message
	schemas  []ToolSchema
	turn     int
	stats    trajectory.Stats
	// lastUsage is the prompt+completion the server last reported and the
	// number of messages it covered.
	lastUsage     int64
	lastUsageMsgs int
	finish        *tools.Finish
	// taskFiles are the files the task seeded (path → content), kept for
	// the verifier to restore protected ones from.
	taskFiles  map[string][]byte
	seenIDs    []string
	pruneSizes []int
	ended      bool
	tr         *trajectory.Trajectory
}

// Open starts an episode: it records the header, creates and seeds the
// sandbox. A sandbox that cannot be made ends the episode sandbox_error at
// once (Ended reports it); the error return is for a record that cannot be
// written.
func Open(ctx context.Context, cfg Config) (*Session, error) {
	t := cfg.Task
	taskJSON, _ := json.Marshal(t)
	sampling := cfg.Sampling
	if t.Seed != nil && sampling.Seed == nil {
		sampling.Seed = t.Seed
	}
	cfg.Sampling = sampling
	samplingJSON, _ := json.Marshal(sampling)
	pi := cfg.PolicyInfo
	pi.Sampling = samplingJSON
	backend := t.Sandbox.Backend
	if backend == "" {
		backend = cfg.Backend
	}
	s := &Session{cfg: cfg, task: t, start: time.Now()}
	s.deadline = s.start.Add(time.Duration(t.Limits.EpisodeTimeoutS * float64(time.Second)))
	s.stats.ToolErrors = map[string]int{}
	rec := &trajectory.Trajectory{
		EpisodeID: cfg.EpisodeID, RolloutID: cfg.RolloutID, GroupID: cfg.GroupID, GroupIndex: cfg.GroupIndex,
		TaskID: t.ID, TaskHash: t.Hash(), Seed: cfg.Seed, Task: taskJSON, StartedAt: s.start.UTC(),
		Sandbox: trajectory.Sandbox{Backend: backend},
		Policy:  pi,
		Pinned:  pins(cfg, t),
	}
	w, err := trajectory.NewWriter(cfg.Dir, rec)
	if err != nil {
		return nil, err
	}
	s.w = w
	reg, err := tools.Select(t.Tools, cfg.ExtraTools)
	if err != nil { // validated at load; a tool set that changed since is the task's error
		return s, s.end(ctx, trajectory.EndSandboxError, "tools: "+err.Error())
	}
	s.reg = reg
	for _, sc := range reg.Schemas() {
		s.schemas = append(s.schemas, ToolSchema{Name: sc.Name, Description: sc.Description, Parameters: sc.Parameters})
	}

	spec := t.SandboxSpec()
	applyPins(&spec, rec.Pinned)
	spec.Labels = map[string]string{"rollbox.episode": cfg.EpisodeID, "rollbox.rollout": cfg.RolloutID}
	sctx, cancel := context.WithDeadline(ctx, s.deadline)
	defer cancel()
	sb, err := cfg.NewSandbox(sctx, backend, spec)
	if err != nil {
		return s, s.endFor(ctx, err, "create sandbox")
	}
	s.sb = sb
	info := sb.Info()
	limits, _ := json.Marshal(info.Limits)
	if err := w.SetSandbox(trajectory.Sandbox{
		Backend: info.Backend, ID: info.ID, Image: info.Image, ImageDigest: info.ImageDigest, Runtime: info.Runtime,
		Network: info.Network, Workdir: info.Workdir, Limits: limits, Loosened: spec.Loosened(),
	}); err != nil {
		return s, err
	}
	files, err := t.SeedFiles(info.Workdir)
	if err != nil {
		return s, s.end(ctx, trajectory.EndSandboxError, err.Error())
	}
	s.taskFiles = make(map[string][]byte, len(files))
	for _, f := range files {
		s.taskFiles[f.Path] = f.Data
	}
	if err := sandbox.Seed(sctx, sb, files); err != nil {
		return s, s.endFor(ctx, err, "seed files")
	}
	python := []string{"python3"}
	if info.Backend == "wasm" {
		python = []string{"python"}
	}
	s.env = &tools.Env{
		Sandbox: sb, Workdir: info.Workdir,
		ExecTimeout: info.Limits.ExecTimeout,
		IdleTimeout: time.Duration(t.Limits.IdleTimeoutS * float64(time.Second)),
		StoreCap:    t.Limits.MaxStoredOutputBytes,
		TestCommand: t.Reward.TestCommand(),
		TestTimeout: time.Duration(t.Reward.TimeoutS * float64(time.Second)),
		PythonArgv:  python,
		Extra:       map[string]any{},
	}
	if cfg.ToolEnv != nil {
		if err := cfg.ToolEnv(s.env); err != nil {
			return s, s.end(ctx, trajectory.EndSandboxError, "tool environment: "+err.Error())
		}
	}
	system := t.System
	if system == "" {
		system = defaultSystemPrompt(info.Workdir, reg.Names())
	}
	s.messages = []Message{{Role: RoleSystem, Content: system}, {Role: RoleUser, Content: t.Prompt}}
	return s, nil
}

func defaultSystemPrompt(workdir string, names []string) string {
	return fmt.Sprintf("You are an agent working in a sandboxed Linux environment. Your working directory is %s. "+
		"Use the tools (%s) to act; call finish when you are done.", workdir, strings.Join(names, ", "))
}

// Messages returns the conversation as the policy will see it next.
func (s *Session) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

// Tools returns the tool schemas offered.
func (s *Session) Tools() []ToolSchema { return s.schemas }

// Ended reports whether the episode is over.
func (s *Session) Ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// Sandbox is the episode's sandbox (nil if it could not be made); it is
// closed when the episode ends.
func (s *Session) Sandbox() sandbox.Sandbox { return s.sb }

// Trajectory returns the record (complete once Ended).
func (s *Session) Trajectory() *trajectory.Trajectory {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tr != nil {
		return s.tr
	}
	return s.w.Trajectory()
}

// Turn returns the number of model turns taken so far.
func (s *Session) Turn() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turn
}

func (s *Session) record(step trajectory.Step) trajectory.Step {
	step, err := s.w.Step(step)
	if err != nil {
		// The record is the product: a step that cannot be written fails loudly.
		panic(fmt.Sprintf("trajectory %s: %v", s.cfg.EpisodeID, err))
	}
	if s.cfg.Observe != nil {
		s.cfg.Observe(step)
	}
	return step
}

// ToolOutcome is one tool call's result as the trainer sees it.
type ToolOutcome struct {
	CallID    string  `json:"call_id"`
	Name      string  `json:"name"`
	Output    string  `json:"output"`
	ErrorKind *string `json:"error_kind"`
	ExitCode  *int    `json:"exit_code"`
	Truncated bool    `json:"truncated"`
}

// Step records an assistant turn and runs its tool calls in order. It
// returns the results and whether the episode ended (finish, max turns,
// context budget, deadline, sandbox failure).
func (s *Session) Step(ctx context.Context, turn Turn) ([]ToolOutcome, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil, true, errors.New("the episode has ended")
	}
	outs, err := s.stepLocked(ctx, turn)
	return outs, s.ended, err
}

func (s *Session) stepLocked(ctx context.Context, turn Turn) ([]ToolOutcome, error) {
	now := time.Now()
	step := trajectory.Step{
		Type: trajectory.StepModel, Turn: s.turn, StartedAt: now.Add(-turn.Latency).UTC(),
		DurationMS: ms(turn.Latency), Content: turn.Content, ToolCallsFromText: turn.ToolCallsFromText,
		FinishReason: turn.FinishReason, Model: turn.Model, Raw: turn.Raw, Attempts: turn.Attempts,
	}
	for _, c := range turn.ToolCalls {
		tc := trajectory.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments}
		if json.Valid([]byte(c.Arguments)) {
			tc.Parsed = json.RawMessage(c.Arguments)
		}
		step.ToolCalls = append(step.ToolCalls, tc)
	}
	if turn.Usage != nil {
		step.Usage = &trajectory.Usage{PromptTokens: turn.Usage.PromptTokens, CompletionTokens: turn.Usage.CompletionTokens, TotalTokens: turn.Usage.TotalTokens}
		s.stats.PromptTokens += turn.Usage.PromptTokens
		s.stats.CompletionTokens += turn.Usage.CompletionTokens
	} else {
		c := EstimateTokens(turn.Content)
		for _, tc := range turn.ToolCalls {
			c += EstimateTokens(tc.Name) + EstimateTokens(tc.Arguments)
		}
		step.Usage = &trajectory.Usage{PromptTokens: s.contextTokensLocked(), CompletionTokens: c, Estimated: true}
		step.Usage.TotalTokens = step.Usage.PromptTokens + c
		s.stats.CompletionTokens += c
	}
	if len(turn.Logprobs) > 0 {
		step.Logprobs, _ = json.Marshal(turn.Logprobs)
	}
	step.PromptTokenIDs, step.CompletionTokenIDs = turn.PromptTokenIDs, turn.CompletionTokenIDs
	s.record(step)
	s.stats.Turns++
	s.stats.PolicyMS += ms(turn.Latency)
	s.turn++
	msg := Message{Role: RoleAssistant, Content: turn.Content, ToolCalls: turn.ToolCalls}
	s.messages = append(s.messages, msg)
	if turn.Usage != nil && turn.Usage.TotalTokens > 0 {
		s.lastUsage, s.lastUsageMsgs = turn.Usage.TotalTokens, len(s.messages)
	}

	var outs []ToolOutcome
	if len(turn.ToolCalls) == 0 {
		s.messages = append(s.messages, Message{Role: RoleUser, Content: "No tool was called. Call a tool to act, or call finish to end the episode."})
	}
	for i, call := range turn.ToolCalls {
		if err := s.deadlineErr(ctx); err != nil {
			return outs, s.endCtx(ctx, err)
		}
		if s.cfg.BeforeCall != nil && !s.cfg.BeforeCall(call) {
			return outs, nil
		}
		out, fatal := s.runCall(ctx, call)
		outs = append(outs, out)
		if fatal != nil {
			return outs, s.endFor(ctx, fatal, "tool "+call.Name)
		}
		if s.finish != nil {
			msg := ""
			if rest := len(turn.ToolCalls) - i - 1; rest > 0 {
				msg = fmt.Sprintf("%d tool call(s) after finish were not run", rest)
			}
			return outs, s.end(ctx, trajectory.EndFinished, msg)
		}
	}
	if s.turn >= s.task.Limits.MaxTurns {
		return outs, s.end(ctx, trajectory.EndMaxTurns, fmt.Sprintf("reached max_turns %d", s.task.Limits.MaxTurns))
	}
	if err := s.fitContextLocked(); err != nil {
		return outs, s.end(ctx, trajectory.EndContextOverflow, err.Error())
	}
	return outs, nil
}

// runCall runs one tool call, records it and appends the tool message. A
// non-nil error is a sandbox failure that ends the episode.
func (s *Session) runCall(ctx context.Context, call ToolCall) (ToolOutcome, error) {
	start := time.Now()
	tctx, cancel := context.WithDeadline(ctx, s.deadline)
	res, err := s.reg.Call(tctx, s.env, call.Name, call.Arguments)
	cancel()
	dur := time.Since(start)
	step := trajectory.Step{
		Type: trajectory.StepTool, Turn: s.turn - 1, StartedAt: start.UTC(), DurationMS: ms(dur),
		CallID: call.ID, Name: call.Name, Arguments: argumentsJSON(call.Arguments),
	}
	s.stats.ToolCalls++
	s.stats.ToolMS += ms(dur)
	if err != nil {
		kind := trajectory.ErrSandbox
		msg := err.Error()
		if sandbox.IsAbuse(err) {
			kind = trajectory.ErrSandboxAbuse
		}
		if cerr := s.deadlineErr(ctx); cerr != nil {
			kind = trajectory.ErrTimeout
			msg = cerr.Error()
		}
		step.ErrorKind, step.Error, step.OK = &kind, msg, ptr(false)
		step.Output = "error: " + msg
		s.stats.ToolErrors[kind]++
		s.record(step)
		s.messages = append(s.messages, Message{Role: RoleTool, ToolCallID: call.ID, Name: call.Name, Content: step.Output})
		out := ToolOutcome{CallID: call.ID, Name: call.Name, Output: step.Output, ErrorKind: &kind}
		if kind == trajectory.ErrTimeout {
			return out, s.deadlineErr(ctx)
		}
		return out, err
	}
	text, dropped := Truncate(res.Text, s.task.Limits.MaxToolOutputBytes)
	step.Output, step.Truncated = text, dropped > 0
	step.BytesDropped = dropped + res.StdoutDropped + res.StderrDropped
	step.ExitCode, step.Signal, step.TimedOut, step.OOMKilled = res.ExitCode, res.Signal, res.TimedOut, res.OOMKilled
	step.Files = res.Files
	if res.Stdout != nil || res.Stderr != nil {
		step.Stdout, step.Stderr = trajectory.NewBytes(res.Stdout), trajectory.NewBytes(res.Stderr)
		step.StdoutStoredDropped, step.StderrStoredDropped = res.StdoutDropped, res.StderrDropped
	}
	kind := res.ErrorKind
	if kind == "" && (step.Truncated || step.BytesDropped > 0) {
		kind = trajectory.ErrOutputTruncated
	}
	if kind != "" {
		step.ErrorKind = &kind
		step.Error = res.Err
		s.stats.ToolErrors[kind]++
	}
	step.OK = ptr(res.ErrorKind == "")
	recorded := s.record(step)
	if step.Truncated {
		s.event(trajectory.ContextEvent{Step: recorded.Index, Kind: "tool_output_truncated",
			Detail: fmt.Sprintf("%s output cut to %d bytes for the model; %d bytes not shown", call.Name, s.task.Limits.MaxToolOutputBytes, dropped)})
	}
	for _, e := range res.Events {
		s.event(trajectory.ContextEvent{Step: recorded.Index, Kind: e.Kind, Detail: e.Detail, IDs: e.IDs, Tokens: e.Tokens})
		switch e.Kind {
		case "seen":
			s.seenIDs = append(s.seenIDs, e.IDs...)
		case "pruned":
			s.pruneSizes = append(s.pruneSizes, len(e.IDs))
			s.applyPruneLocked(e.IDs)
		}
	}
	s.messages = append(s.messages, Message{Role: RoleTool, ToolCallID: call.ID, Name: call.Name, Content: text})
	if res.Finish != nil {
		s.finish = res.Finish
	}
	return ToolOutcome{CallID: call.ID, Name: call.Name, Output: text, ErrorKind: step.ErrorKind, ExitCode: res.ExitCode, Truncated: step.Truncated}, nil
}

// PruneMarker opens the placeholder that replaces a pruned document's text.
const PruneMarker = "[pruned from context: "

// docMarker brackets a document's text in a tool message, so that pruning
// can find and remove it: "<<doc ID>>\n...\n<</doc ID>>".
func docOpen(id string) string  { return "<<doc " + id + ">>" }
func docClose(id string) string { return "<</doc " + id + ">>" }

// applyPruneLocked replaces the text of each pruned document in earlier
// messages with a short placeholder, so the policy no longer sees it.
func (s *Session) applyPruneLocked(ids []string) {
	for i := range s.messages {
		m := &s.messages[i]
		if m.Role != RoleTool {
			continue
		}
		for _, id := range ids {
			open, close := docOpen(id), docClose(id)
			for {
				a := strings.Index(m.Content, open)
				if a < 0 {
					break
				}
				b := strings.Index(m.Content[a:], close)
				if b < 0 {
					break
				}
				b += a + len(close)
				m.Content = m.Content[:a] + PruneMarker + id + "]" + m.Content[b:]
			}
		}
	}
}

func (s *Session) event(e trajectory.ContextEvent) {
	if err := s.w.Event(e); err != nil {
		panic(fmt.Sprintf("trajectory %s: %v", s.cfg.EpisodeID, err))
	}
}

func argumentsJSON(raw string) json.RawMessage {
	if json.Valid([]byte(raw)) && strings.TrimSpace(raw) != "" {
		return json.RawMessage(raw)
	}
	b, _ := json.Marshal(raw)
	return b
}

func ptr[T any](v T) *T { return &v }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// EstimateTokens is Rollbox's token estimate when the server reports no
// usage: one token per 4 bytes of UTF-8, rounded up. It overestimates
// English prose slightly for BPE tokenizers and underestimates dense code.
// It is the retriever's own, so the context ledger and the episode's
// budget count alike.
func EstimateTokens(s string) int64 { return retriever.EstimateTokens(s) }

// messageTokens estimates a message: its text plus 4 tokens of framing.
func messageTokens(m Message) int64 {
	n := EstimateTokens(m.Content) + 4
	for _, c := range m.ToolCalls {
		n += EstimateTokens(c.Name) + EstimateTokens(c.Arguments) + 4
	}
	return n
}

// contextTokensLocked is the size of the next prompt: the server's last
// report plus estimates of what came after, or all estimates.
func (s *Session) contextTokensLocked() int64 {
	var n int64
	from := 0
	if s.lastUsage > 0 && s.lastUsageMsgs <= len(s.messages) {
		n, from = s.lastUsage, s.lastUsageMsgs
	} else {
		for _, sc := range s.schemas {
			n += EstimateTokens(sc.Name) + EstimateTokens(sc.Description) + EstimateTokens(string(sc.Parameters))
		}
	}
	for _, m := range s.messages[from:] {
		n += messageTokens(m)
	}
	return n
}

// fitContextLocked enforces max_context_tokens: "end" returns an error;
// "truncate" blanks the oldest tool outputs until the context fits.
func (s *Session) fitContextLocked() error {
	limit := int64(s.task.Limits.MaxContextTokens)
	n := s.contextTokensLocked()
	s.stats.ContextTokens = n
	if limit <= 0 || n <= limit {
		return nil
	}
	last := len(s.w.Trajectory().Steps) - 1
	if s.task.Limits.ContextOverflow == "truncate" {
		s.lastUsage = 0 // the server's count no longer applies
		for i := range s.messages {
			m := &s.messages[i]
			if m.Role != RoleTool || strings.HasPrefix(m.Content, "[removed") {
				continue
			}
			before := messageTokens(*m)
			m.Content = "[removed to fit the context budget]"
			s.event(trajectory.ContextEvent{Step: last, Kind: "context_truncated",
				Detail: fmt.Sprintf("tool output of message %d removed to fit max_context_tokens %d", i, limit), Tokens: before - messageTokens(*m)})
			if n = s.contextTokensLocked(); n <= limit {
				s.stats.ContextTokens = n
				return nil
			}
		}
	}
	s.event(trajectory.ContextEvent{Step: last, Kind: "context_overflow",
		Detail: fmt.Sprintf("context of %d tokens exceeds max_context_tokens %d", n, limit), Tokens: n})
	return fmt.Errorf("context of %d tokens exceeds max_context_tokens %d", n, limit)
}

// Truncate cuts text to limit bytes for the model: the head and the tail
// with a marker between them saying how much was left out. It cuts on rune
// boundaries and makes the text valid UTF-8. dropped counts the bytes of
// text not shown.
func Truncate(text string, limit int) (string, int64) {
	text = strings.ToValidUTF8(text, "\uFFFD")
	if limit <= 0 || len(text) <= limit {
		return text, 0
	}
	dropped := len(text) - limit
	marker := fmt.Sprintf("\n[... output truncated: %d bytes omitted ...]\n", dropped)
	budget := max(limit-len(marker), 2)
	head := budget - budget/2
	tail := budget / 2
	for head > 0 && !utf8.RuneStart(text[head]) {
		head--
	}
	t := len(text) - tail
	for t < len(text) && !utf8.RuneStart(text[t]) {
		t++
	}
	shown := text[:head] + text[t:]
	return text[:head] + marker + text[t:], int64(len(text) - len(shown))
}

// deadlineErr reports the episode deadline or the caller's cancellation.
func (s *Session) deadlineErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if time.Now().After(s.deadline) {
		return errEpisodeTimeout
	}
	return nil
}

var errEpisodeTimeout = errors.New("episode deadline passed")

// endCtx ends the episode for a context error or the deadline.
func (s *Session) endCtx(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, errEpisodeTimeout) || errors.Is(err, context.DeadlineExceeded):
		return s.end(ctx, trajectory.EndEpisodeTimeout, fmt.Sprintf("episode_timeout_s %v passed", s.task.Limits.EpisodeTimeoutS))
	default:
		return s.end(ctx, trajectory.EndCancelled, "cancelled: "+err.Error())
	}
}

// endFor ends the episode for an error from the sandbox (or the context):
// sandbox_abuse when the agent's own commands broke the sandbox (scored 0),
// sandbox_error (unscored) otherwise.
func (s *Session) endFor(ctx context.Context, err error, what string) error {
	if cerr := s.deadlineErr(ctx); cerr != nil {
		return s.endCtx(ctx, cerr)
	}
	if sandbox.IsAbuse(err) {
		return s.end(ctx, trajectory.EndSandboxAbuse, what+": "+err.Error())
	}
	return s.end(ctx, trajectory.EndSandboxError, what+": "+err.Error())
}

// Finish ends the episode as the trainer asks (environment mode): with an
// answer, like the finish tool. It returns the reward.
func (s *Session) Finish(ctx context.Context, answer *string, ids []string) (*trajectory.Trajectory, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.finish = &tools.Finish{Answer: answer, IDs: ids}
		if err := s.end(ctx, trajectory.EndFinished, "finished by the caller"); err != nil {
			return nil, err
		}
	}
	return s.tr, nil
}

// Cancel ends the episode cancelled (or interrupted) unless it has ended.
func (s *Session) Cancel(ctx context.Context, reason, message string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil
	}
	return s.end(ctx, reason, message)
}

// EndPolicy ends the episode for a policy failure.
func (s *Session) EndPolicy(ctx context.Context, err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil
	}
	if cerr := s.deadlineErr(ctx); cerr != nil {
		return s.endCtx(ctx, cerr)
	}
	return s.end(ctx, trajectory.EndPolicyError, err.Error())
}

// end computes the reward (when the end is the model's), closes the sandbox
// and writes the final record. Cleanup runs even if ctx was cancelled.
func (s *Session) end(ctx context.Context, reason, message string) error {
	if s.ended {
		return nil
	}
	s.ended = true
	cleanup := context.WithoutCancel(ctx)
	term := &trajectory.Termination{Reason: reason, Message: message, Step: len(s.w.Trajectory().Steps) - 1}
	if s.finish != nil {
		term.Answer, term.IDs = s.finish.Answer, s.finish.IDs
	}
	var rw *trajectory.Reward
	switch {
	case reason == trajectory.EndSandboxAbuse:
		// The agent broke its own sandbox: a failure, scored 0 without a
		// verifier (nothing it left can be trusted), never dropped.
		rw = &trajectory.Reward{Total: 0, Components: map[string]float64{trajectory.AbuseComponent: 0},
			Details: []string{"the episode's own commands broke its sandbox: " + message}}
	case trajectory.Scored(reason) && s.sb != nil:
		in := reward.Input{Sandbox: s.sb, Workdir: s.sb.Info().Workdir, TaskFiles: s.taskFiles,
			SeenIDs: s.seenIDs, PruneSizes: s.pruneSizes, VerifierOutputCap: s.task.Limits.MaxStoredOutputBytes}
		if s.finish != nil {
			in.Answer, in.IDs = s.finish.Answer, s.finish.IDs
		}
		r, err := reward.Evaluate(cleanup, s.task.Reward, in)
		switch {
		case err != nil && sandbox.IsAbuse(err):
			term = &trajectory.Termination{Reason: trajectory.EndSandboxAbuse, Step: term.Step, Answer: term.Answer, IDs: term.IDs,
				Message: fmt.Sprintf("the episode's sandbox, broken by its own commands, could not verify (episode had ended %s): %v", reason, err)}
			rw = &trajectory.Reward{Total: 0, Components: map[string]float64{trajectory.AbuseComponent: 0},
				Details: []string{term.Message}}
		case err != nil:
			term = &trajectory.Termination{Reason: trajectory.EndSandboxError, Step: term.Step, Answer: term.Answer, IDs: term.IDs,
				Message: fmt.Sprintf("the sandbox failed while computing the reward (episode had ended %s): %v", reason, err)}
		default:
			rw = r
		}
	}
	if s.sb != nil {
		s.sb.Close()
	}
	s.stats.DurationMS = ms(time.Since(s.start))
	if err := s.w.End(term, rw, s.stats); err != nil {
		return err
	}
	s.tr = s.w.Trajectory()
	return nil
}

// Run drives a whole episode with cfg.Policy and returns its trajectory.
// The error is only for a record that could not be written; every other
// failure is recorded as the episode's end.
func Run(ctx context.Context, cfg Config) (*trajectory.Trajectory, error) {
	s, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return s.Drive(ctx, cfg.Policy)
}

// Drive asks p for turns and steps the episode until it ends, like Run
// (which is Open then Drive); replay drives a session it has already
// stepped through recorded turns. The error is only for a record that
// could not be written.
func (s *Session) Drive(ctx context.Context, p Policy) (*trajectory.Trajectory, error) {
	cfg := s.cfg
	for !s.Ended() {
		if derr := s.deadlineErr(ctx); derr != nil {
			s.mu.Lock()
			err := s.endCtx(ctx, derr)
			s.mu.Unlock()
			if err != nil {
				return nil, err
			}
			break
		}
		pctx, cancel := context.WithDeadline(ctx, s.deadline)
		turn, err := p.Next(pctx, Request{
			EpisodeID: cfg.EpisodeID, TaskID: cfg.Task.ID, Turn: s.Turn(),
			Messages: s.Messages(), Tools: s.Tools(), Sampling: s.cfg.Sampling,
		})
		cancel()
		if err != nil {
			if err := s.EndPolicy(ctx, err); err != nil {
				return nil, err
			}
			break
		}
		if _, _, err := s.Step(ctx, turn); err != nil {
			return nil, err
		}
	}
	return s.Trajectory(), nil
}
