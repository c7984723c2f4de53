package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// Errors of Session.Fork that are the caller's, not the infrastructure's.
var (
	// ErrForkEnded: the episode has ended; there is nothing to branch.
	ErrForkEnded = errors.New("the episode has ended")
	// ErrForkUnsupported: the episode keeps state outside its sandbox that
	// a fork cannot carry (a search task's context ledger).
	ErrForkUnsupported = errors.New("the episode cannot be forked")
)

// Fork branches the episode into len(ids) new ones, named ids: each gets a
// fork of this episode's sandbox (sandbox.Forker: the same files, none of
// its processes) and a record that starts with this episode's steps and
// context events so far, marked forked_from {episode_id, step} (step: how
// many of its steps are the parent's). Each goes on independently from the
// same conversation; this episode goes on too. The new sessions share the
// parent's deadline: the prefix took part of the episode's time.
//
// Replaying a forked record replays the parent's steps and then its own,
// in one sandbox: that is the prefix recreated.
//
// # Errors
//
// ErrForkEnded, ErrForkUnsupported; the sandbox's fork error (an
// infrastructure error: sandbox.IsInfra) or a *RecordError. All or
// nothing: on an error no session, sandbox or record of the new ids is
// left.
func (s *Session) Fork(ctx context.Context, ids []string) ([]*Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := sandbox.CheckFork(len(ids)); err != nil {
		return nil, err
	}
	if s.ended {
		return nil, fmt.Errorf("fork episode %s: %w", s.cfg.EpisodeID, ErrForkEnded)
	}
	if len(s.env.Extra) > 0 {
		return nil, fmt.Errorf("fork episode %s: its tools keep state outside the sandbox (%s): %w",
			s.cfg.EpisodeID, joinKeys(s.env.Extra), ErrForkUnsupported)
	}
	f, ok := sandbox.Find[sandbox.Forker](s.sb)
	if !ok {
		return nil, fmt.Errorf("fork episode %s: the %s backend's sandboxes cannot be forked: %w", s.cfg.EpisodeID, s.sb.Info().Backend, ErrForkUnsupported)
	}
	sctx, cancel := context.WithDeadline(ctx, s.deadline)
	defer cancel()
	kids, err := f.Fork(sctx, len(ids))
	if err != nil {
		return nil, fmt.Errorf("fork episode %s: %w", s.cfg.EpisodeID, err)
	}
	parent := s.w.Trajectory()
	out := make([]*Session, 0, len(ids))
	fail := func(err error) ([]*Session, error) {
		sandbox.CloseAll(kids)
		for _, c := range out {
			c.w.Discard()
		}
		return nil, err
	}
	for i, id := range ids {
		cfg := s.cfg
		cfg.EpisodeID = id
		c, err := s.forkOne(parent, cfg, kids[i], s.start, s.deadline)
		if err != nil {
			return fail(&RecordError{EpisodeID: id, Err: err})
		}
		out = append(out, c)
	}
	return out, nil
}

// forkOne is one child of Fork (or of a PrefixGroup), under s.mu: the
// episode cfg names, in the sandbox sb, with the clock start and deadline,
// going on from parent (the record of s so far).
func (s *Session) forkOne(parent *trajectory.Trajectory, cfg Config, sb sandbox.Sandbox, start, deadline time.Time) (*Session, error) {
	id := cfg.EpisodeID
	rec := *parent
	rec.EpisodeID, rec.RolloutID, rec.GroupID, rec.GroupIndex, rec.Seed = id, cfg.RolloutID, cfg.GroupID, cfg.GroupIndex, cfg.Seed
	rec.StartedAt = start.UTC()
	rec.Steps, rec.ContextEvents, rec.Segments = nil, nil, nil
	rec.Termination, rec.Reward, rec.EndedAt, rec.Monitors, rec.Group, rec.Rescore = nil, nil, nil, nil, nil, nil
	rec.Stats = trajectory.Stats{}
	rec.ForkedFrom = &trajectory.ForkedFrom{EpisodeID: s.cfg.EpisodeID, Step: len(parent.Steps)}
	rec.Pinned = maps.Clone(parent.Pinned)
	if rec.Pinned != nil {
		rec.Pinned[PinEpisodeID] = id
		if _, ok := rec.Pinned[PinSeed]; ok {
			rec.Pinned[PinSeed] = fmt.Sprint(cfg.Seed)
		}
	}
	sandbox.NameEpisode(sb, id)
	info := sb.Info()
	rec.Sandbox.ID = info.ID
	// A cluster worker's fork streams its journal as any episode's does.
	w, err := trajectory.NewWriterTee(cfg.Dir, &rec, cfg.Journal)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			w.Discard()
		}
	}()
	if err := w.SetSandbox(rec.Sandbox); err != nil {
		return nil, err
	}
	for _, st := range parent.Steps {
		if _, err := w.Step(st); err != nil {
			return nil, err
		}
	}
	for _, ev := range parent.ContextEvents {
		if err := w.Event(ev); err != nil {
			return nil, err
		}
	}
	spec := s.spec
	spec.Labels = sandbox.EpisodeLabels(id, cfg.RolloutID)
	env := *s.env
	env.Sandbox = sb
	env.Extra = map[string]any{}
	stats := s.stats
	stats.ToolErrors = maps.Clone(s.stats.ToolErrors)
	tok := s.tok
	tok.ids = slices.Clone(s.tok.ids)
	c := &Session{
		cfg: cfg, task: s.task, start: start, deadline: deadline, w: w, sb: sb,
		reg: s.reg, env: &env, messages: slices.Clone(s.messages), schemas: s.schemas, turn: s.turn,
		stats: stats, lastUsage: s.lastUsage, lastUsageMsgs: s.lastUsageMsgs, finish: cloneFinish(s.finish),
		taskFiles: s.taskFiles, seenIDs: slices.Clone(s.seenIDs), pruneSizes: slices.Clone(s.pruneSizes),
		backend: s.backend, spec: spec, tok: tok,
	}
	ok = true
	return c, nil
}

func cloneFinish(f *tools.Finish) *tools.Finish {
	if f == nil {
		return nil
	}
	c := *f
	c.IDs = slices.Clone(f.IDs)
	return &c
}

func joinKeys(m map[string]any) string {
	keys := slices.Sorted(maps.Keys(m))
	out := ""
	for i, k := range keys {
		if i > 0 {
			out += ", "
		}
		out += k
	}
	return out
}
