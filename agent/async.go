package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// The tools of an asynchronous orchestrator (orchestrator.async), beside
// spawn_subagents: wait blocks until given sub-agents (any or all) have
// ended, or a timeout, and answers with their results; collect answers at
// once with the results of those that have ended. Each result is answered
// exactly once, by one of them.
const (
	NameWait    = "wait"
	NameCollect = "collect"
)

// asyncState is an asynchronous orchestrator's sub-agents: running while
// the orchestrator goes on, until collected or the episode ends.
type asyncState struct {
	// ctx is the episode's, cancelled (with a *StopCause) when it ends:
	// the lifecycle of its sub-agents.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
	// sem bounds the episode's sub-agents running at once (max_parallel).
	sem chan struct{}
	// calls counts the spawn_subagents calls (a handle's s<call>).
	calls int

	mu sync.Mutex
	// subs are the sub-agents in the order spawned.
	subs []*asyncSub
	// changed is closed, and replaced, whenever a sub-agent ends.
	changed chan struct{}
}

// asyncSub is one asynchronously spawned sub-agent.
type asyncSub struct {
	handle string
	// ended and sa (its summary) are set when it ends; collected once its
	// result was answered (or the episode ended without it).
	ended, collected bool
	sa               trajectory.Subagent
	// readyAt is, in a replay fed by the recording, the step whose output
	// held its result when recorded (-1: at once, not recorded; -2: never).
	readyAt int
}

func newAsyncState(ctx context.Context, maxParallel int) *asyncState {
	a := &asyncState{sem: make(chan struct{}, maxParallel), changed: make(chan struct{})}
	a.ctx, a.cancel = context.WithCancelCause(ctx)
	return a
}

// ended records a sub-agent's end and wakes the waiters.
func (a *asyncState) ended(sub *asyncSub, sa trajectory.Subagent) {
	a.mu.Lock()
	sub.sa, sub.ended = sa, true
	close(a.changed)
	a.changed = make(chan struct{})
	a.mu.Unlock()
}

// spawnAsync starts a call's sub-agents and answers at once with their
// handles. With share_workspace their sandboxes are forked now, so each
// starts from the workspace as it is at the spawn.
func (s *Session) spawnAsync(ctx context.Context, tasks []subTask, allowed []string) (tools.Result, error) {
	orch, as := s.orch, s.orch.async
	call := as.calls
	as.calls++
	orch.spawned += len(tasks)
	step := s.w.Steps() // the tool step this call is recorded as
	replay := s.cfg.Subagents != nil && s.cfg.Subagents.Recorded != nil
	var forks []sandbox.Sandbox
	var forkErr error
	if orch.o.ShareWorkspace && !replay {
		forks, forkErr = s.forkAll(ctx, len(tasks))
	}
	handles := make([]string, len(tasks))
	for i, st := range tasks {
		sub := &asyncSub{handle: fmt.Sprintf("s%d-%d", call, i), readyAt: -2}
		handles[i] = sub.handle
		as.mu.Lock()
		as.subs = append(as.subs, sub)
		as.mu.Unlock()
		if replay {
			sa, at := s.recordedAsync(call, i, step, sub.handle, st)
			sub.readyAt = at
			as.ended(sub, sa)
			continue
		}
		// With share_workspace the sub-agent's sandbox is its fork, made
		// above: handed over once, closed here if it never starts.
		var fork SandboxFactory
		var kid sandbox.Sandbox
		var used atomic.Bool
		if orch.o.ShareWorkspace {
			if forks != nil {
				kid = forks[i]
			}
			fork = func(_ context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
				if forkErr != nil {
					return nil, fmt.Errorf("share_workspace: %w", forkErr)
				}
				if used.Swap(true) {
					return nil, fmt.Errorf("share_workspace: the sub-agent's fork was already used: %w", sandbox.ErrInvalidSpec)
				}
				sandbox.NameEpisode(kid, spec.Labels[sandbox.LabelEpisode])
				return kid, nil
			}
		}
		as.wg.Add(1)
		go func() {
			defer as.wg.Done()
			sa := s.runAsync(call, step, i, st, allowed, fork)
			if kid != nil && !used.Load() {
				kid.Close()
			}
			sa.Handle = sub.handle
			as.ended(sub, sa)
		}()
	}
	b, _ := json.Marshal(map[string][]string{"handles": handles})
	return tools.Result{Text: string(b) + "\n"}, nil
}

// forkAll forks the orchestrator's sandbox n times (share_workspace).
func (s *Session) forkAll(ctx context.Context, n int) ([]sandbox.Sandbox, error) {
	f, ok := sandbox.Find[sandbox.Forker](s.sb)
	if !ok {
		return nil, fmt.Errorf("the %s backend's sandboxes cannot be forked: %w", s.backend, sandbox.ErrInvalidSpec)
	}
	kids, err := f.Fork(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("fork the orchestrator's sandbox: %w", err)
	}
	return kids, nil
}

// runAsync runs one asynchronous sub-agent: a place among max_parallel,
// then a slot of the scheduler (if any; never the orchestrator's, which
// goes on), under the episode's context and deadline.
func (s *Session) runAsync(call, step, index int, st subTask, allowed []string, fork SandboxFactory) trajectory.Subagent {
	as := s.orch.async
	ctx, cancel := context.WithDeadline(as.ctx, s.deadline)
	defer cancel()
	select {
	case as.sem <- struct{}{}:
		defer func() { <-as.sem }()
	case <-ctx.Done():
		names := st.Tools
		if len(names) == 0 {
			names = allowed
		}
		return trajectory.Subagent{EpisodeID: fmt.Sprintf("%s.s%d-%d", s.cfg.EpisodeID, call, index), Step: step, Stage: call, Index: index,
			Prompt: st.Prompt, Tools: names, End: trajectory.EndCancelled, Message: ctxMessage(ctx, ctx.Err())}
	}
	return s.runSubagent(ctx, call, step, index, st, allowed, s.cfg.Subagents.Slots, false, fork)
}

// recordedAsync is an asynchronous sub-agent of a replay fed by the
// recording: the recorded one with the same handle and prompt, ready at
// the step that collected it when recorded (never, if it was not);
// otherwise not_recorded, ready at once.
func (s *Session) recordedAsync(call, index, step int, handle string, st subTask) (trajectory.Subagent, int) {
	for _, r := range s.cfg.Subagents.Recorded {
		if r.Handle == handle && r.Prompt == st.Prompt {
			at := -2
			if r.CollectedStep != nil {
				at = *r.CollectedStep
			}
			r.Step, r.File, r.Critical, r.CollectedStep = step, "", false, nil
			return r, at
		}
	}
	tl := st.Tools
	if tl == nil {
		tl = []string{}
	}
	return trajectory.Subagent{EpisodeID: fmt.Sprintf("%s.s%d-%d", s.cfg.EpisodeID, call, index), Step: step, Stage: call, Index: index,
		Prompt: st.Prompt, Tools: tl, Handle: handle, End: EndNotRecorded,
		Message: fmt.Sprintf("the recording has no sub-agent %s with this prompt", handle)}, -1
}

// readyLocked says whether a sub-agent's result can be answered at step.
func (as *asyncState) readyLocked(sub *asyncSub, step int, replay bool) bool {
	if sub.collected || !sub.ended {
		return false
	}
	return !replay || sub.readyAt == -1 || sub.readyAt == step
}

// waitTool is an asynchronous orchestrator's wait.
type waitTool struct{ s *Session }

const waitSchema = `{"type": "object", "additionalProperties": false, "properties": {
 "handles": {"type": "array", "items": {"type": "string"}, "description": "the sub-agents to wait on (default: every one not yet collected)"},
 "mode": {"type": "string", "enum": ["all", "any"], "description": "all (default): until every one has ended; any: until one has"},
 "timeout_s": {"type": "number", "minimum": 0, "description": "give up after this many seconds (default: the episode's deadline)"}}}`

func (waitTool) Schema() tools.Schema {
	return tools.Schema{Name: NameWait, Description: "Wait until sub-agents spawned earlier have ended (all of them, or any one), or a timeout, and return the results of those that ended (each result is returned once, by wait or collect).",
		Parameters: json.RawMessage(waitSchema)}
}

// collectTool is an asynchronous orchestrator's collect.
type collectTool struct{ s *Session }

const collectSchema = `{"type": "object", "additionalProperties": false, "properties": {
 "handles": {"type": "array", "items": {"type": "string"}, "description": "the sub-agents to collect (default: every one not yet collected)"}}}`

func (collectTool) Schema() tools.Schema {
	return tools.Schema{Name: NameCollect, Description: "Return at once the results of the sub-agents spawned earlier that have ended and were not returned yet, and the handles still running.",
		Parameters: json.RawMessage(collectSchema)}
}

func (t collectTool) Run(ctx context.Context, env *tools.Env, args map[string]any) (tools.Result, error) {
	raw, _ := json.Marshal(args)
	var a struct {
		Handles []string `json:"handles"`
	}
	if err := strictDecode(raw, &a); err != nil {
		return badArgs("collect: %v", err), nil
	}
	return t.s.consumeAsync(ctx, NameCollect, a.Handles, "any", 0, false)
}

func (t waitTool) Run(ctx context.Context, env *tools.Env, args map[string]any) (tools.Result, error) {
	raw, _ := json.Marshal(args)
	var a struct {
		Handles  []string `json:"handles"`
		Mode     string   `json:"mode"`
		TimeoutS *float64 `json:"timeout_s"`
	}
	if err := strictDecode(raw, &a); err != nil {
		return badArgs("wait: %v", err), nil
	}
	switch a.Mode {
	case "":
		a.Mode = "all"
	case "all", "any":
	default:
		return badArgs("wait: mode %q is not all or any", a.Mode), nil
	}
	var timeout time.Duration
	if a.TimeoutS != nil {
		if *a.TimeoutS < 0 {
			return badArgs("wait: timeout_s %v is negative", *a.TimeoutS), nil
		}
		timeout = time.Duration(*a.TimeoutS * float64(time.Second))
	}
	return t.s.consumeAsync(ctx, NameWait, a.Handles, a.Mode, timeout, a.TimeoutS == nil)
}

func strictDecode(raw []byte, v any) error {
	d := json.NewDecoder(strings.NewReader(string(raw)))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// asyncResults is what wait and collect answer: the results of the
// sub-agents that ended (in the order spawned), the handles still running
// of those asked about, and whether a wait gave up.
type asyncResults struct {
	Results  []spawnResult `json:"results"`
	Pending  []string      `json:"pending"`
	TimedOut bool          `json:"timed_out,omitempty"`
}

// consumeAsync answers wait (block until mode is met, the timeout or ctx)
// and collect (timeout 0). The results it answers are consumed: they make
// a stage (see orchestratorStats) and are journaled in the record. While
// it blocks the orchestrator gives its scheduler slot back, so its
// sub-agents can take it.
func (s *Session) consumeAsync(ctx context.Context, tool string, handles []string, mode string, timeout time.Duration, untilDeadline bool) (tools.Result, error) {
	as := s.orch.async
	step := s.w.Steps() // the tool step this call is recorded as
	replay := s.cfg.Subagents != nil && s.cfg.Subagents.Recorded != nil
	as.mu.Lock()
	var set []*asyncSub
	if len(handles) == 0 {
		for _, sub := range as.subs {
			if !sub.collected {
				set = append(set, sub)
			}
		}
	}
	for i, h := range handles {
		j := slices.IndexFunc(as.subs, func(sub *asyncSub) bool { return sub.handle == h })
		switch {
		case j < 0:
			as.mu.Unlock()
			return badArgs("%s: handles[%d]: no sub-agent %q was spawned in this episode", tool, i, h), nil
		case as.subs[j].collected:
			as.mu.Unlock()
			return badArgs("%s: handles[%d]: the result of %s was already returned", tool, i, h), nil
		case slices.Contains(set, as.subs[j]):
			as.mu.Unlock()
			return badArgs("%s: handles[%d]: %s named twice", tool, i, h), nil
		}
		set = append(set, as.subs[j])
	}
	as.mu.Unlock()
	if len(set) == 0 && tool == NameWait {
		return badArgs("wait: no sub-agent is left to wait on (every result was returned)"), nil
	}
	var timer <-chan time.Time
	if tool == NameWait && !untilDeadline {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	slots := s.cfg.Subagents.Slots
	if s.cfg.Subagents.Slotless {
		slots = nil // it holds none to give back
	}
	released, timedOut := false, false
	var ready, pending []*asyncSub
	for {
		as.mu.Lock()
		ready, pending = ready[:0], pending[:0]
		for _, sub := range set {
			if as.readyLocked(sub, step, replay) {
				ready = append(ready, sub)
			} else {
				pending = append(pending, sub)
			}
		}
		changed := as.changed
		as.mu.Unlock()
		met := len(pending) == 0 || (mode == "any" && len(ready) > 0)
		if met || tool == NameCollect {
			break
		}
		if replay || (timer != nil && timeout == 0) {
			timedOut = true
			break
		}
		if slots != nil && !released {
			slots.Release(s.backend)
			released = true
		}
		var err error
		select {
		case <-changed:
			continue
		case <-timer:
			timedOut = true
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			if released {
				slots.Acquire(context.WithoutCancel(ctx), s.backend)
			}
			return tools.Result{}, err
		}
		break
	}
	if released {
		// The orchestrator takes a slot back whatever happens: the
		// scheduler counts it running until it ends.
		slots.Acquire(context.WithoutCancel(ctx), s.backend)
	}
	out := asyncResults{Results: []spawnResult{}, Pending: []string{}, TimedOut: timedOut}
	for _, sub := range pending {
		out.Pending = append(out.Pending, sub.handle)
	}
	res, err := s.consume(step, ready)
	if err != nil {
		return tools.Result{}, err
	}
	out.Results = res
	return tools.Result{Text: asyncOutput(out)}, nil
}

// consume answers the ready sub-agents' results at step: they are a stage
// (the orchestrator's turns since the last stage plus the longest of them
// are its critical steps), marked collected and journaled.
func (s *Session) consume(step int, ready []*asyncSub) ([]spawnResult, error) {
	orch, as := s.orch, s.orch.async
	if len(ready) == 0 {
		return []spawnResult{}, nil
	}
	stage := orch.stage
	orch.stage++
	as.mu.Lock()
	subs := make([]trajectory.Subagent, len(ready))
	for i, sub := range ready {
		sub.collected = true
		subs[i] = sub.sa
	}
	as.mu.Unlock()
	for i := range subs {
		at := step
		subs[i].Stage, subs[i].CollectedStep = stage, &at
	}
	orch.endStage(subs)
	out := make([]spawnResult, len(subs))
	for i, sa := range subs {
		out[i] = spawnResult{Handle: sa.Handle, Index: sa.Index, End: sa.End, Message: sa.Message, Answer: sa.Answer, Truncated: sa.Truncated, Steps: sa.Steps}
		if err := s.w.Subagent(sa); err != nil {
			return nil, &RecordError{EpisodeID: s.cfg.EpisodeID, Err: err}
		}
	}
	return out, nil
}

// stopSubagents ends an asynchronous orchestrator's sub-agents as it ends:
// those still running are cancelled, all are waited for, and those never
// collected are journaled after the others (stage: the last; on no
// critical path) unless journal is false (the record already failed).
func (s *Session) stopSubagents(journal bool) error {
	if s.orch == nil || s.orch.async == nil {
		return nil
	}
	orch, as := s.orch, s.orch.async
	as.cancel(&StopCause{Reason: trajectory.EndCancelled, Message: "the orchestrator ended before collecting this sub-agent"})
	as.wg.Wait()
	as.mu.Lock()
	var left []trajectory.Subagent
	for _, sub := range as.subs {
		if !sub.collected {
			sub.collected = true
			sa := sub.sa
			sa.Stage, sa.Critical, sa.CollectedStep = orch.stage, false, nil
			left = append(left, sa)
		}
	}
	as.mu.Unlock()
	for _, sa := range left {
		orch.subSteps += sa.Steps
		if !journal {
			continue
		}
		if err := s.w.Subagent(sa); err != nil {
			return err
		}
	}
	return nil
}

// asyncOutput is wait's and collect's answer, one result a line.
func asyncOutput(r asyncResults) string {
	var b strings.Builder
	b.WriteString("{\"results\": [\n")
	for i, res := range r.Results {
		line, _ := json.Marshal(res)
		b.Write(line)
		if i < len(r.Results)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	pending, _ := json.Marshal(r.Pending)
	fmt.Fprintf(&b, "], \"pending\": %s, \"timed_out\": %v}\n", pending, r.TimedOut)
	return b.String()
}
