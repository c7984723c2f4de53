package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/rollbox/rollbox/agent/monitor"
	"github.com/rollbox/rollbox/agent/reward"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

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

// isTimeout reports whether a context error is the episode's deadline (a
// timeout) rather than a cancellation.
func isTimeout(err error) bool {
	return errors.Is(err, errEpisodeTimeout) || errors.Is(err, context.DeadlineExceeded)
}

// endCtx ends the episode for a context error or the deadline. A context
// cancelled with a *StopCause ends the episode for the cause's reason
// (interrupted, when the service stops or a run gets SIGINT/SIGTERM),
// whichever of the episode's steps notices first.
func (s *Session) endCtx(ctx context.Context, err error) error {
	var sc *StopCause
	switch {
	case isTimeout(err):
		return s.end(ctx, trajectory.EndEpisodeTimeout, fmt.Sprintf("episode_timeout_s %v passed", s.task.Limits.EpisodeTimeoutS))
	case errors.As(context.Cause(ctx), &sc):
		return s.end(ctx, sc.Reason, sc.Message)
	default:
		msg := err.Error()
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			msg = cause.Error() // why the caller cancelled (a stale policy version, ...)
		}
		return s.end(ctx, trajectory.EndCancelled, "cancelled: "+msg)
	}
}

// StopCause is the cause (context.WithCancelCause) of stopping episodes
// from outside: an episode whose context ends with it ends Reason
// (trajectory.EndCancelled or EndInterrupted) with Message, instead of the
// generic "cancelled".
type StopCause struct {
	Reason, Message string
}

func (c *StopCause) Error() string { return c.Reason + ": " + c.Message }

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
// and writes the final record. Cleanup runs even if ctx was cancelled. The
// error is a *RecordError: the record could not be written, and the episode
// has ended record_error instead.
func (s *Session) end(ctx context.Context, reason, message string) error {
	if s.ended {
		return nil
	}
	var serr error
	s.cpu.Outside(ctx, func() { serr = s.stopSubagents(true) })
	if err := serr; err != nil {
		return s.failRecord(err)
	}
	s.ended = true
	s.orchestratorStats()
	term := &trajectory.Termination{Reason: reason, Message: message, Step: s.w.Steps() - 1}
	if s.finish != nil {
		term.Answer, term.IDs = s.finish.Answer, s.finish.IDs
	}
	var rw *trajectory.Reward
	switch {
	case reason == trajectory.EndSandboxAbuse:
		// The agent broke its own sandbox: a failure, scored 0 without a
		// verifier (nothing it left can be trusted), never dropped.
		rw = abuseReward("the episode's own commands broke its sandbox: " + message)
	case s.cfg.Parent != nil:
		// A sub-episode is frozen: its outcome is its orchestrator's
		// observation, never scored.
	case trajectory.Scored(reason) && s.sb != nil:
		// The verifier waits on the sandbox: outside the CPU gate.
		s.cpu.Outside(ctx, func() { term, rw = s.verify(context.WithoutCancel(ctx), term) })
	}
	s.cpu.Outside(ctx, s.closeSandbox)
	s.monitor(term, rw)
	if s.closeErr != nil {
		// The sandbox is gone (the backend verifies it) before the episode
		// is recorded ended; one that could not be removed is recorded.
		info := s.w.Trajectory().Sandbox
		info.CloseError = s.closeErr.Error()
		s.w.SetSandbox(info) // a journal that fails here fails End too: record_error
	}
	return s.writeEnd(term, rw)
}

// monitor computes the episode's monitors over its record as it ends, and
// applies the penalties the task asks for to its reward (not to the 0 of
// an episode that broke its sandbox: that stands as it is, as in a
// rescore).
func (s *Session) monitor(term *trajectory.Termination, rw *trajectory.Reward) {
	t := *s.w.Trajectory()
	t.Termination, t.Reward = term, rw
	m := monitor.Compute(&t, s.task.Monitors)
	if term.Reason != trajectory.EndSandboxAbuse {
		monitor.Penalize(rw, m, s.task.Monitors)
	}
	s.w.SetMonitors(m)
}

// verify runs the task's reward over an episode that ended for the model's
// reasons: the one place the verifier is called. A verifier that meets a
// failed sandbox turns the end into sandbox_error (unscored); one that meets
// a sandbox the agent's own commands broke, into sandbox_abuse (scored 0).
func (s *Session) verify(ctx context.Context, term *trajectory.Termination) (*trajectory.Termination, *trajectory.Reward) {
	in := reward.Input{Sandbox: s.sb, Workdir: s.sb.Info().Workdir, TaskFiles: s.taskFiles,
		SeenIDs: s.seenIDs, PruneSizes: s.pruneSizes, VerifierOutputCap: s.task.Limits.MaxStoredOutputBytes,
		NewSandbox: s.newVerifierSandbox, CloseSandbox: s.closeSandbox,
		Backend: s.sb.Info().Backend, Env: s.spec.Env,
		Prompt: s.task.Prompt, End: term.Reason, Steps: s.w.Trajectory().Steps, Judges: s.cfg.Judges,
		Subagents: s.w.Trajectory().Subagents, TrainStep: s.cfg.TrainStep}
	if s.stats.CriticalSteps != nil {
		in.CriticalSteps = *s.stats.CriticalSteps
	}
	if s.finish != nil {
		in.Answer, in.IDs = s.finish.Answer, s.finish.IDs
	}
	r, err := reward.Evaluate(ctx, s.task.Reward, in)
	switch {
	case err != nil && sandbox.IsAbuse(err):
		msg := fmt.Sprintf("the episode's sandbox, broken by its own commands, could not verify (episode had ended %s): %v", term.Reason, err)
		return &trajectory.Termination{Reason: trajectory.EndSandboxAbuse, Step: term.Step, Answer: term.Answer, IDs: term.IDs, Message: msg}, abuseReward(msg)
	case err != nil:
		return &trajectory.Termination{Reason: trajectory.EndSandboxError, Step: term.Step, Answer: term.Answer, IDs: term.IDs,
			Message: fmt.Sprintf("the sandbox failed while computing the reward (episode had ended %s): %v", term.Reason, err)}, nil
	}
	return term, r
}

// newVerifierSandbox makes a fresh sandbox of the episode's backend and
// spec for its verifier (clean-room verification), labelled as such.
func (s *Session) newVerifierSandbox(ctx context.Context) (sandbox.Sandbox, error) {
	spec := s.spec
	spec.Labels = maps.Clone(spec.Labels)
	if spec.Labels == nil {
		spec.Labels = map[string]string{}
	}
	spec.Labels[sandbox.LabelRole] = sandbox.RoleVerifier
	sb, err := s.cfg.NewSandbox(ctx, s.backend, spec)
	if err != nil {
		return nil, err
	}
	return &verifierSandbox{Sandbox: sb, s: s}, nil
}

// verifierSandbox records a failure to remove the verifier's sandbox as
// the episode's sandbox.close_error, like its own sandbox's. The verifier
// closes it before the episode is recorded ended, in end's goroutine.
type verifierSandbox struct {
	sandbox.Sandbox
	s *Session
}

func (v *verifierSandbox) Close() error {
	err := v.Sandbox.Close()
	if err != nil && v.s.closeErr == nil {
		v.s.closeErr = fmt.Errorf("the verifier's sandbox: %w", err)
	}
	return err
}

func abuseReward(detail string) *trajectory.Reward {
	return &trajectory.Reward{Total: trajectory.Score(0), Components: map[string]float64{trajectory.AbuseComponent: 0}, Details: []string{detail}}
}

// closeSandbox closes the episode's sandbox (idempotent) and keeps the
// first error: a container the engine would not remove.
func (s *Session) closeSandbox() {
	if s.sb != nil {
		if err := s.sb.Close(); err != nil && s.closeErr == nil {
			s.closeErr = err
		}
	}
}

// writeEnd writes the final record. One that cannot be written ends the
// episode record_error (unscored) in memory, and returns a *RecordError.
func (s *Session) writeEnd(term *trajectory.Termination, rw *trajectory.Reward) error {
	s.orchestratorStats()
	s.stats.DurationMS = ms(time.Since(s.start))
	err := s.w.End(term, rw, s.stats)
	tr := s.w.Trajectory()
	s.tr = tr
	if err == nil {
		return nil
	}
	if term.Reason != trajectory.EndRecordError {
		tr.Termination = &trajectory.Termination{Reason: trajectory.EndRecordError, Step: term.Step, Answer: term.Answer, IDs: term.IDs,
			Message: fmt.Sprintf("the record could not be written (the episode had ended %s): %v", term.Reason, err)}
		tr.Reward = nil
	}
	return &RecordError{EpisodeID: s.cfg.EpisodeID, Err: err}
}

// failRecord ends the episode record_error after a write of its record
// failed: the sandbox is closed, the end is written if the disk still takes
// it, and the *RecordError is returned.
func (s *Session) failRecord(err error) error {
	re := &RecordError{EpisodeID: s.cfg.EpisodeID, Err: err}
	if s.ended {
		return re
	}
	s.ended = true
	s.stopSubagents(false)
	s.closeSandbox()
	term := &trajectory.Termination{Reason: trajectory.EndRecordError, Step: s.w.Steps() - 1,
		Message: "the record could not be written: " + err.Error()}
	if werr := s.writeEnd(term, nil); werr != nil {
		re.Err = errors.Join(err, werr.(*RecordError).Err)
	}
	return re
}

// RecordError is an episode whose trajectory could not be written (a full
// or failing disk). The episode has ended record_error: unscored, its
// sandbox closed; Session.Trajectory holds what is known of it.
type RecordError struct {
	EpisodeID string
	Err       error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("episode %s: its record could not be written: %v", e.EpisodeID, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }
