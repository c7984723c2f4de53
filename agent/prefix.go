package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// Prefix is a task's "prefix": turns every episode of the task starts
// with, run once per group in one sandbox that the group's episodes then
// fork from (PrefixGroup). Either Turns (scripted: each a {"content",
// "tool_calls": [{"name", "arguments"}]}, arguments an object or its text)
// or the first Steps steps of the recorded Trajectory (a path relative to
// the task file, in a task file only), which must end where a turn ends.
type Prefix struct {
	Turns      []PrefixTurn `json:"turns,omitempty"`
	Trajectory string       `json:"trajectory,omitempty"`
	Steps      int          `json:"steps,omitempty"`
}

// PrefixTurn is one scripted turn of a prefix.
type PrefixTurn struct {
	Content   string           `json:"content,omitempty"`
	ToolCalls []PrefixToolCall `json:"tool_calls,omitempty"`
}

// PrefixToolCall is a call of a prefix turn.
type PrefixToolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// Model is the Turn.Model of a scripted prefix turn.
const prefixModel = "prefix"

// prefixTurns resolves and checks t.Prefix into the turns an episode
// steps; the error names the field.
func (t *Task) prefixTurns() ([]Turn, error) {
	p := t.Prefix
	if p == nil {
		return nil, nil
	}
	if t.Retriever != nil {
		return nil, errors.New("prefix: a search task's context is kept outside its sandbox and cannot be forked")
	}
	var turns []Turn
	switch {
	case len(p.Turns) > 0 && p.Trajectory != "":
		return nil, errors.New("prefix: give turns or trajectory, not both")
	case len(p.Turns) > 0:
		if p.Steps != 0 {
			return nil, errors.New("prefix.steps: only with prefix.trajectory")
		}
		for i, pt := range p.Turns {
			turn := Turn{Content: pt.Content, Model: prefixModel}
			for j, c := range pt.ToolCalls {
				field := fmt.Sprintf("prefix.turns[%d].tool_calls[%d]", i, j)
				if c.Name == "" {
					return nil, fmt.Errorf("%s.name: required", field)
				}
				args := "{}"
				if a := bytes.TrimSpace(c.Arguments); len(a) > 0 {
					var s string
					if json.Unmarshal(a, &s) == nil {
						args = s
					} else {
						var buf bytes.Buffer
						if err := json.Compact(&buf, a); err != nil {
							return nil, fmt.Errorf("%s.arguments: %v", field, err)
						}
						args = buf.String()
					}
				}
				turn.ToolCalls = append(turn.ToolCalls, ToolCall{ID: fmt.Sprintf("prefix_%d_%d", i, j), Name: c.Name, Arguments: args})
			}
			turns = append(turns, turn)
		}
	case p.Trajectory != "":
		if t.dir == "" {
			return nil, errors.New("prefix.trajectory: only in a task file (a path relative to it); send the turns instead")
		}
		if filepath.IsAbs(p.Trajectory) || !filepath.IsLocal(p.Trajectory) {
			return nil, fmt.Errorf("prefix.trajectory: %q is not a path inside the task file's directory", p.Trajectory)
		}
		tr, err := trajectory.Read(filepath.Join(t.dir, p.Trajectory))
		if err != nil {
			return nil, fmt.Errorf("prefix.trajectory: %v", err)
		}
		k := p.Steps
		if k < 1 || k > len(tr.Steps) {
			return nil, fmt.Errorf("prefix.steps: %d is outside 1..%d (the steps of %s)", k, len(tr.Steps), p.Trajectory)
		}
		if k < len(tr.Steps) && tr.Steps[k].Turn == tr.Steps[k-1].Turn {
			return nil, fmt.Errorf("prefix.steps: %d ends inside turn %d of %s (a prefix is whole turns)", k, tr.Steps[k-1].Turn, p.Trajectory)
		}
		for _, s := range tr.Steps[:k] {
			if s.Type != trajectory.StepModel {
				continue
			}
			turn := Turn{Content: s.Content, Model: s.Model, FinishReason: s.FinishReason}
			for _, c := range s.ToolCalls {
				turn.ToolCalls = append(turn.ToolCalls, ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
			}
			turns = append(turns, turn)
		}
	default:
		return nil, errors.New("prefix: give turns or trajectory with steps")
	}
	for i, turn := range turns {
		for _, c := range turn.ToolCalls {
			if c.Name == tools.NameFinish {
				return nil, fmt.Errorf("prefix: turn %d calls %s (a prefix cannot end the episode)", i, tools.NameFinish)
			}
		}
	}
	if t.Limits.MaxTurns > 0 && len(turns) >= t.Limits.MaxTurns {
		return nil, fmt.Errorf("prefix: %d turns leave none of limits.max_turns (%d)", len(turns), t.Limits.MaxTurns)
	}
	return turns, nil
}

// PrefixGroup runs a task's prefix once for the episodes of one group
// and gives each of them a fork of it: the first episode to open makes the
// prefix's own episode (named Name+".prefix", its record in Dir) and steps
// its turns; each episode then opens in a fork of the prefix's sandbox
// (sandbox.Forker) with a record that starts with the prefix's steps,
// marked forked_from {the prefix episode, step}.
//
// Forks are made as episodes open, never ahead of them: the episodes
// opening at the same moment (a group started together) share one Fork
// call, and an episode the scheduler starts later forks then. So a group
// holds no idle sandbox but its prefix's, kept while some of its Size
// episodes are still to open and closed (its record ended "prefix done")
// once they all have or at Close. An episode that opens again (a retry)
// takes another fork while the prefix's sandbox is kept, else runs the
// prefix anew; so does one beyond Size. Set it as Config.Prefix of every
// episode of the group; Close it when the group is over.
type PrefixGroup struct {
	Name string
	Size int
	Dir  string
	// Ran is how many times an earlier process ran this group's prefix (a
	// resumed `rollbox run`): its runs here are numbered after them, so no
	// record in Dir is written over.
	Ran int

	// opening counts the episodes in branch that have no fork yet: the
	// next Fork makes one for each of them.
	opening atomic.Int64

	mu sync.Mutex
	// base is the prefix episode, not ended while its sandbox is kept; its
	// record so far (parent) is what each fork starts with; left is how
	// long the prefix took of the episode time.
	base   *Session
	parent *trajectory.Trajectory
	left   time.Duration
	forks  []sandbox.Sandbox // made for an episode in branch, not yet taken
	opened map[string]bool   // the episodes that took a fork of base
	runs   int
	closed bool
}

// branch opens episode cfg in a fork of the group's prefix.
func (g *PrefixGroup) branch(ctx context.Context, cfg Config) (*Session, error) {
	g.opening.Add(1)
	defer g.opening.Add(-1)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("prefix of group %s: the group is over: %w", g.Name, sandbox.ErrClosed)
	}
	if len(g.forks) == 0 {
		if g.base == nil {
			if err := g.runPrefix(ctx, cfg); err != nil {
				return nil, err
			}
		}
		if err := g.fork(ctx, int(g.opening.Load())); err != nil {
			return nil, err
		}
	}
	sb := g.forks[0]
	g.forks = g.forks[1:]
	base := g.base
	start := time.Now()
	base.mu.Lock()
	s, err := base.forkOne(g.parent, cfg, sb, start, start.Add(g.left))
	base.mu.Unlock()
	if err != nil {
		sb.Close()
		return nil, &RecordError{EpisodeID: cfg.EpisodeID, Err: err}
	}
	g.opened[cfg.EpisodeID] = true
	if len(g.opened) >= max(1, g.Size) && len(g.forks) == 0 {
		g.endBase(ctx)
	}
	return s, nil
}

// fork makes n forks of the prefix's sandbox (at least 1, at most what the
// group may still need), under g.mu. A fork that fails ends the prefix:
// the episode's next attempt runs it anew.
func (g *PrefixGroup) fork(ctx context.Context, n int) error {
	n = max(1, min(n, max(1, g.Size)-len(g.opened)))
	s := g.base
	s.mu.Lock()
	f, ok := sandbox.Find[sandbox.Forker](s.sb)
	s.mu.Unlock()
	if !ok {
		g.endBaseAs(ctx, "the prefix cannot be forked")
		return fmt.Errorf("prefix %s: the %s backend's sandboxes cannot be forked: %w", s.cfg.EpisodeID, s.backend, ErrForkUnsupported)
	}
	forks, err := f.Fork(ctx, n)
	if err != nil {
		g.endBaseAs(ctx, "its sandbox could not be forked")
		return fmt.Errorf("prefix %s: fork %d: %w", s.cfg.EpisodeID, n, err)
	}
	g.forks = forks
	return nil
}

// runPrefix makes the prefix episode and steps its turns, under g.mu.
func (g *PrefixGroup) runPrefix(ctx context.Context, cfg Config) error {
	turns, err := cfg.Task.prefixTurns()
	if err != nil {
		return err
	}
	g.runs = max(g.runs, g.Ran) + 1
	pcfg := cfg
	// The prefix is an episode of its own: not the member's journal (a
	// cluster worker's stream of the member's lines) nor its hooks.
	pcfg.Prefix, pcfg.Retry, pcfg.OnOpen, pcfg.Journal = nil, Retry{}, nil, nil
	pcfg.EpisodeID = g.Name + ".prefix"
	if g.runs > 1 {
		pcfg.EpisodeID = fmt.Sprintf("%s.prefix.%d", g.Name, g.runs)
	}
	pcfg.Dir, pcfg.GroupIndex, pcfg.Pinned = g.Dir, -1, nil
	s, err := open(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("prefix %s: %w", pcfg.EpisodeID, err)
	}
	// The group's forks follow the prefix: a backend that can make their
	// sandboxes ahead does it while the prefix's turns run.
	if p, ok := sandbox.Find[sandbox.ForkPreparer](s.sb); ok {
		p.PrepareFork(max(1, g.Size))
	}
	for i, turn := range turns {
		if _, ended, err := s.Step(ctx, turn); err != nil || ended {
			s.Cancel(context.WithoutCancel(ctx), trajectory.EndCancelled, "the prefix failed")
			return prefixFailed(pcfg.EpisodeID, i, err, s.Trajectory())
		}
	}
	s.mu.Lock()
	g.base, g.parent, g.left, g.opened = s, s.w.Trajectory(), time.Until(s.deadline), map[string]bool{}
	s.mu.Unlock()
	return nil
}

// endBase ends the prefix's episode, its part done: its sandbox goes, its
// record stays (the forks' forked_from names it). Under g.mu.
func (g *PrefixGroup) endBase(ctx context.Context) {
	if g.base == nil {
		return
	}
	g.endBaseAs(ctx, fmt.Sprintf("prefix done: %d episodes of group %s go on from its %d steps", len(g.opened), g.Name, len(g.parent.Steps)))
}

func (g *PrefixGroup) endBaseAs(ctx context.Context, msg string) {
	g.base.Cancel(context.WithoutCancel(ctx), trajectory.EndCancelled, msg)
	g.base, g.parent, g.opened = nil, nil, nil
}

// prefixFailed says why turn i of a prefix failed: an infrastructure
// failure (a sandbox that broke) stays one, so the episode's open is
// retried; the rest is the task's.
func prefixFailed(id string, i int, err error, tr *trajectory.Trajectory) error {
	if err != nil {
		return fmt.Errorf("prefix %s turn %d: %w", id, i, err)
	}
	reason, msg := "", ""
	if tr.Termination != nil {
		reason, msg = tr.Termination.Reason, tr.Termination.Message
	}
	err = fmt.Errorf("prefix %s ended at turn %d: %s: %s", id, i, reason, msg)
	if reason == trajectory.EndSandboxError {
		return fmt.Errorf("%w: %w", err, sandbox.ErrSandboxFailed)
	}
	return err
}

// Close ends the group: the prefix's sandbox, if still kept, and any fork
// no episode took are closed. Safe to call twice.
func (g *PrefixGroup) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	err := sandbox.CloseAll(g.forks)
	g.forks = nil
	g.endBase(context.Background())
	return err
}
