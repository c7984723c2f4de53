package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cpugate"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// Session is an episode in progress: its sandbox, tools, messages and
// record. Run drives it with a Policy; the rollout API's environment mode
// drives it step by step. Methods are serialised by a mutex.
type Session struct {
	mu  sync.Mutex
	cfg Config
	// cpu is Drive's turn at cfg.CPU (nil when none): the tool calls and
	// the end's waits are run outside it.
	cpu      *cpugate.Hold
	task     *Task
	start    time.Time
	deadline time.Time
	w        *trajectory.Writer
	sb       sandbox.Sandbox
	closeErr error // from closing sb: recorded as sandbox.close_error
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
	// backend and spec made the episode's sandbox; the verifier makes its
	// own fresh one from them.
	backend string
	spec    sandbox.Spec
	ended   bool
	tr      *trajectory.Trajectory
	tok     tokenState
	// orch is an orchestrator episode's sub-agent state (nil otherwise).
	orch *orchestration
}

// tokenState is a token-mode episode's place in its token sequence.
type tokenState struct {
	on bool
	// segment is the current segment's index (-1 before the first turn);
	// ids its ids so far (the last turn's prompt and completion); msgs the
	// number of messages they hold.
	segment int
	ids     []int64
	msgs    int
	// restart, when set, makes the next turn start a new segment, for that
	// reason (start, pruned, context_truncated).
	restart string
}

// TokenContext is the token sequence the next turn continues (token
// mode), nil in chat mode.
func (s *Session) TokenContext() *TokenContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.tok.on {
		return nil
	}
	if s.tok.restart != "" {
		return &TokenContext{}
	}
	return &TokenContext{Prefix: s.tok.ids, New: s.tok.msgs}
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

// record appends a step to the record. The record is the product: a step
// that cannot be written ends the episode (the caller calls failRecord).
func (s *Session) record(step trajectory.Step) (trajectory.Step, error) {
	step, err := s.w.Step(step)
	if err != nil {
		return step, err
	}
	if s.cfg.Observe != nil {
		s.cfg.Observe(step)
	}
	return step, nil
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

// ErrEnded is returned by Step on an episode that has ended (by the
// caller's Finish or Cancel, or a step before).
var ErrEnded = errors.New("the episode has ended")

// Step records an assistant turn and runs its tool calls in order. It
// returns the results and whether the episode ended (finish, max turns,
// context budget, deadline, sandbox failure).
//
// # Errors
//
// ErrEnded on an ended episode; a *RecordError when the record could not be
// written (the episode has then ended record_error).
func (s *Session) Step(ctx context.Context, turn Turn) ([]ToolOutcome, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil, true, ErrEnded
	}
	outs, err := s.stepLocked(ctx, turn)
	return outs, s.ended, err
}

func (s *Session) stepLocked(ctx context.Context, turn Turn) ([]ToolOutcome, error) {
	if stop, err := s.recordTurnLocked(ctx, &turn); stop {
		return nil, err
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
			if s.ended { // the record failed
				return outs, fatal
			}
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
	if err := s.fitContextLocked(ctx); err != nil {
		if s.ended {
			return outs, err
		}
		return outs, s.end(ctx, trajectory.EndContextOverflow, err.Error())
	}
	return outs, nil
}

// recordTurnLocked records the model's turn (stepLocked); stop says the
// episode ended with err. A function of its own so that its frame (a
// trajectory.Step and its copies, ~3.5 KB) is not on the episode's stack
// while the turn's tools run (recordCall).
//
//go:noinline
func (s *Session) recordTurnLocked(ctx context.Context, t *Turn) (stop bool, err error) {
	turn := *t
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
	switch {
	case turn.Usage != nil:
		step.Usage = &trajectory.Usage{PromptTokens: turn.Usage.PromptTokens, CompletionTokens: turn.Usage.CompletionTokens, TotalTokens: turn.Usage.TotalTokens}
		s.stats.PromptTokens += turn.Usage.PromptTokens
		s.stats.CompletionTokens += turn.Usage.CompletionTokens
	case s.tok.on && turn.Tokens != nil:
		// The ids are the count: nothing to estimate.
		n, c := int64(len(turn.Tokens.Prompt)), int64(len(turn.Tokens.Completion))
		step.Usage = &trajectory.Usage{PromptTokens: n, CompletionTokens: c, TotalTokens: n + c}
		s.stats.PromptTokens += n
		s.stats.CompletionTokens += c
	default:
		c := EstimateTokens(turn.Content)
		for _, tc := range turn.ToolCalls {
			c += EstimateTokens(tc.Name) + EstimateTokens(tc.Arguments)
		}
		step.Usage = &trajectory.Usage{PromptTokens: s.contextTokensLocked(), CompletionTokens: c, Estimated: true}
		step.Usage.TotalTokens = step.Usage.PromptTokens + c
		s.stats.PromptTokens += step.Usage.PromptTokens
		s.stats.CompletionTokens += c
	}
	step.Tokens = trajectory.TokensEstimated
	if turn.Usage != nil {
		step.Tokens = trajectory.TokensReported
	}
	if len(turn.Logprobs) > 0 {
		step.Logprobs, _ = json.Marshal(turn.Logprobs)
	}
	step.PromptTokenIDs, step.CompletionTokenIDs = turn.PromptTokenIDs, turn.CompletionTokenIDs
	var tokensErr string
	if s.tok.on {
		tokensErr = s.tokenStepLocked(&step, turn)
	}
	// The episode's token totals are the sums of what its steps show, and
	// say where those come from (one kind, or mixed).
	switch s.stats.Tokens {
	case "":
		s.stats.Tokens = step.Tokens
	case step.Tokens:
	default:
		s.stats.Tokens = trajectory.TokensMixed
	}
	if v := turn.PolicyVersion; v != "" {
		step.PolicyVersion = v
		if s.stats.PolicyVersions == nil {
			s.stats.PolicyVersions = map[string]int{}
		}
		s.stats.PolicyVersions[v]++
	}
	recorded, err := s.record(step)
	if err != nil {
		return true, s.failRecord(err)
	}
	s.stats.Turns++
	s.stats.PolicyMS += ms(turn.Latency)
	s.turn++
	if step.SegmentReason != "" && step.SegmentReason != trajectory.SegmentStart {
		if err := s.event(trajectory.ContextEvent{Step: recorded.Index, Kind: "segment",
			Detail: fmt.Sprintf("turn %d starts token segment %d (%s): %s", step.Turn, *step.Segment, step.SegmentReason, segmentWhy(step.SegmentReason))}); err != nil {
			return true, s.failRecord(err)
		}
	}
	if tokensErr != "" {
		// The ids cannot be trusted: recorded, never scored.
		return true, s.end(ctx, trajectory.EndPolicyError, "token ids: "+tokensErr)
	}
	msg := Message{Role: RoleAssistant, Content: turn.Content, ToolCalls: turn.ToolCalls, Text: turn.Text}
	s.messages = append(s.messages, msg)
	if s.tok.on {
		s.tok.msgs = len(s.messages)
	}
	if turn.Usage != nil && turn.Usage.TotalTokens > 0 {
		s.lastUsage, s.lastUsageMsgs = turn.Usage.TotalTokens, len(s.messages)
	}
	return false, nil
}

// ctxKind is the error kind of a tool call stopped by a context error:
// timeout for the episode's deadline, cancelled for a cancellation.
func ctxKind(err error) tools.ErrorKind {
	if isTimeout(err) {
		return tools.KindTimeout
	}
	return tools.KindCancelled
}

// ctxMessage says what stopped a call: the deadline, or the cancellation's
// cause ("interrupted by SIGINT").
func ctxMessage(ctx context.Context, err error) string {
	if isTimeout(err) {
		return err.Error()
	}
	var sc *StopCause
	if errors.As(context.Cause(ctx), &sc) {
		return "cancelled: " + sc.Message
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return "cancelled: " + cause.Error()
	}
	return "cancelled: " + err.Error()
}

// runCall runs one tool call, records it and appends the tool message. A
// non-nil error is a sandbox failure that ends the episode, or a
// *RecordError that has ended it.
func (s *Session) runCall(ctx context.Context, call ToolCall) (ToolOutcome, error) {
	start := time.Now()
	var (
		res tools.Result
		err error
		dur time.Duration
	)
	// Outside the CPU gate: the call waits (the sandbox, the audit log),
	// and the wait for a turn after it is not the call's.
	s.cpu.Outside(ctx, func() {
		tctx, cancel := context.WithDeadline(ctx, s.deadline)
		res, err = s.reg.Call(tctx, s.env, call.Name, call.Arguments)
		cancel()
		dur = time.Since(start)
	})
	return s.recordCall(ctx, call, start, dur, &res, err)
}

// recordCall records a tool call that ran (runCall). It is a function of
// its own so that its frame (a trajectory.Step and its copies, ~4 KB) is
// not on the episode's stack while the tool runs: thousands of episodes
// wait in their tools at once, each goroutine's stack sized by its deepest
// point (stacks.go's note).
//
//go:noinline
func (s *Session) recordCall(ctx context.Context, call ToolCall, start time.Time, dur time.Duration, res *tools.Result, err error) (ToolOutcome, error) {
	step := trajectory.Step{
		Type: trajectory.StepTool, Turn: s.turn - 1, StartedAt: start.UTC(), DurationMS: ms(dur),
		CallID: call.ID, Name: call.Name, Arguments: argumentsJSON(call.Arguments),
	}
	s.stats.ToolCalls++
	s.stats.ToolMS += ms(dur)
	if err != nil {
		kind := tools.KindSandbox
		msg := err.Error()
		if sandbox.IsAbuse(err) {
			kind = tools.KindSandboxAbuse
		}
		cerr := s.deadlineErr(ctx)
		if cerr != nil {
			kind, msg = ctxKind(cerr), ctxMessage(ctx, cerr)
		}
		k := string(kind)
		step.ErrorKind, step.Error, step.OK = &k, msg, ptr(false)
		step.Output = "error: " + msg
		s.stats.ToolErrors[k]++
		out := ToolOutcome{CallID: call.ID, Name: call.Name, Output: step.Output, ErrorKind: &k}
		if _, rerr := s.record(step); rerr != nil {
			return out, s.failRecord(rerr)
		}
		s.messages = append(s.messages, Message{Role: RoleTool, ToolCallID: call.ID, Name: call.Name, Content: step.Output})
		if cerr != nil {
			return out, cerr
		}
		return out, err
	}
	if res.ErrorKind == tools.KindTimeout {
		// A command killed because the episode was cancelled or the run
		// interrupted did not time out: say what stopped it.
		if cerr := ctx.Err(); cerr != nil && !isTimeout(cerr) {
			res.ErrorKind, res.Err = tools.KindCancelled, ctxMessage(ctx, cerr)
		}
	}
	cut := CutText(res.Text, res.Notes, s.task.Limits.MaxToolOutputBytes)
	text, dropped := cut.Text, cut.Omitted
	step.Output, step.Truncated = text, cut.Truncated
	step.BytesDropped = cut.Unseen
	step.ExitCode, step.Signal, step.TimedOut, step.OOMKilled = res.ExitCode, res.Signal, res.TimedOut, res.OOMKilled
	step.Files = res.Files
	if res.Stdout != nil || res.Stderr != nil {
		step.Stdout, step.Stderr = trajectory.NewBytes(res.Stdout), trajectory.NewBytes(res.Stderr)
		step.StdoutStoredDropped, step.StderrStoredDropped = res.StdoutDropped, res.StderrDropped
	}
	kind := res.ErrorKind
	if kind == "" && (step.Truncated || step.BytesDropped > 0) {
		kind = tools.KindOutputTruncated
	}
	if kind != "" {
		k := string(kind)
		step.ErrorKind = &k
		step.Error = res.Err
		s.stats.ToolErrors[k]++
	}
	step.OK = ptr(res.ErrorKind == "")
	if step.OutputCut() {
		if s.stats.Truncated == nil {
			s.stats.Truncated = &trajectory.Truncations{}
		}
		s.stats.Truncated.Count(call.Name)
	}
	out := ToolOutcome{CallID: call.ID, Name: call.Name, Output: text, ErrorKind: step.ErrorKind, ExitCode: res.ExitCode, Truncated: step.Truncated}
	recorded, err := s.record(step)
	if err != nil {
		return out, s.failRecord(err)
	}
	var events []trajectory.ContextEvent
	if step.Truncated {
		events = append(events, trajectory.ContextEvent{Step: recorded.Index, Kind: "tool_output_truncated",
			Detail: fmt.Sprintf("%s output cut to %d bytes for the model; %d bytes of output omitted", call.Name, s.task.Limits.MaxToolOutputBytes, dropped)})
	}
	for _, e := range res.Events {
		events = append(events, trajectory.ContextEvent{Step: recorded.Index, Kind: e.Kind, Detail: e.Detail, IDs: e.IDs, Tokens: e.Tokens})
	}
	for _, e := range events {
		if err := s.event(e); err != nil {
			return out, s.failRecord(err)
		}
	}
	for _, e := range res.Events {
		switch e.Kind {
		case "seen":
			s.seenIDs = append(s.seenIDs, e.IDs...)
		case "pruned":
			s.pruneSizes = append(s.pruneSizes, len(e.IDs))
			if s.applyPruneLocked(e.IDs) {
				s.restartSegmentLocked(trajectory.SegmentPruned)
			}
		}
	}
	s.messages = append(s.messages, Message{Role: RoleTool, ToolCallID: call.ID, Name: call.Name, Content: text})
	if res.Finish != nil {
		s.finish = res.Finish
	}
	return out, nil
}

func (s *Session) event(e trajectory.ContextEvent) error {
	return s.w.Event(e)
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
