package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// Run is an episode from start to end: Open (with cfg.Retry), then Drive
// with cfg.Policy. It is the one episode loop of `rollbox run`, the rollout
// service and replay's live part; environment mode opens the same way and
// lets the trainer step.
//
// The trajectory is returned whenever there is one. The error is a
// *RecordError (the record could not be written: the episode has ended
// record_error), or a failure of rollbox itself: a panic of the episode's
// code is recovered, the episode ended sandbox_error (unscored) and the
// panic returned. Every other failure is recorded as the episode's end.
func Run(ctx context.Context, cfg Config) (t *trajectory.Trajectory, err error) {
	var s *Session
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("episode %s: rollbox failed: %v", cfg.EpisodeID, p)
			if s != nil {
				if cerr := s.Cancel(context.WithoutCancel(ctx), trajectory.EndSandboxError, fmt.Sprintf("rollbox failed: %v", p)); cerr != nil {
					err = errors.Join(err, cerr)
				}
				t = s.Trajectory()
			}
		}
	}()
	s, err = Open(ctx, cfg)
	var oe *OpenError
	switch {
	case errors.As(err, &oe):
		return s.Trajectory(), nil
	case err != nil && s != nil:
		return s.Trajectory(), err
	case err != nil:
		return nil, err
	}
	if cfg.OnOpen != nil {
		cfg.OnOpen(s)
	}
	return s.Drive(ctx, cfg.Policy)
}

// Drive asks p for turns and steps the episode until it ends; replay drives
// a session it has already stepped through recorded turns. An episode ended
// meanwhile by Cancel or Finish ends the loop. The error is a *RecordError,
// returned with the trajectory.
func (s *Session) Drive(ctx context.Context, p Policy) (*trajectory.Trajectory, error) {
	if h := s.cfg.CPU.Hold(); h != nil {
		// A turn at the CPU gate while stepping; the waits are outside it.
		s.mu.Lock()
		s.cpu = h
		s.mu.Unlock()
		s.w.SetOutside(func(wait func()) { h.Outside(ctx, wait) })
		h.Enter(ctx)
		defer func() {
			s.mu.Lock()
			s.cpu = nil
			s.mu.Unlock()
			h.Leave()
		}()
	}
	for !s.Ended() {
		if derr := s.deadlineErr(ctx); derr != nil {
			s.mu.Lock()
			err := s.endCtx(ctx, derr)
			s.mu.Unlock()
			if err != nil {
				return s.Trajectory(), err
			}
			break
		}
		pctx, cancel := context.WithDeadline(ctx, s.deadline)
		req := Request{
			EpisodeID: s.cfg.EpisodeID, TaskID: s.task.ID, Turn: s.Turn(),
			Messages: s.Messages(), Tools: s.Tools(), Sampling: s.cfg.Sampling, Tokens: s.TokenContext(),
		}
		var (
			turn Turn
			err  error
		)
		s.holdOutside(ctx, func() { turn, err = p.Next(pctx, req) })
		cancel()
		if err != nil {
			if err := s.EndPolicy(ctx, err); err != nil {
				return s.Trajectory(), err
			}
			break
		}
		if _, _, err := s.Step(ctx, turn); err != nil && !errors.Is(err, ErrEnded) {
			return s.Trajectory(), err
		}
	}
	return s.Trajectory(), nil
}

// holdOutside runs wait outside the episode's turn at the CPU gate, if
// Drive holds one (Config.CPU).
func (s *Session) holdOutside(ctx context.Context, wait func()) {
	s.mu.Lock()
	h := s.cpu
	s.mu.Unlock()
	h.Outside(ctx, wait)
}
