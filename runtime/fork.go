package runtime

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// ForkRequest is the body of POST /v1/episodes/{id}/fork.
type ForkRequest struct {
	// N is how many episodes to branch (1..sandbox.MaxFork).
	N int `json:"n"`
}

// ForkResult is the answer to POST /v1/episodes/{id}/fork: the new
// episodes' ids, each an open environment-mode episode.
type ForkResult struct {
	IDs []string `json:"ids"`
}

// postFork branches an open environment-mode episode into n new ones
// (agent.Session.Fork): each has the parent's steps so far and a fork of
// its sandbox, and goes on independently through step and finish; the
// parent goes on too.
//
// Unknown (or another tenant's) episode: 404; ended: 409 naming it and how
// it ended; files in its sandbox a fork cannot carry (on Docker a file
// over sandbox.MaxFileBytes): 409 naming the file; n out of range: 400; more than the open-episode capacity left:
// 429, nothing made; a sandbox backend failing midway: 503, nothing made
// (all or nothing), counted as an infrastructure failure.
func (s *Server) postFork(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, maxEnvRequestBody)
	if err != nil {
		return err
	}
	var req ForkRequest
	if err := decodeStrict(body, &req, ""); err != nil {
		return err
	}
	if err := sandbox.CheckFork(req.N); err != nil {
		return badField("n", "%d is not between 1 and %d", req.N, sandbox.MaxFork)
	}
	id := r.PathValue("id")
	ep, err := s.envEpisode(r)
	if err != nil {
		// An episode that ended and was closed (finished, deleted, idle)
		// is a conflict, not an unknown id.
		if rec, serr := s.st.episode(id); serr == nil && rec != nil && rec.Mode == "env" && ownedBy(rec.Tenant, tenantOf(r)) {
			return &apiError{Status: http.StatusConflict, Code: codeConflict, Field: "id",
				Message: fmt.Sprintf("episode %s has ended (%s): only an open episode can be forked", id, rec.Reason)}
		}
		return err
	}
	if err := s.refuseNewWork(); err != nil {
		return err
	}
	s.mu.Lock()
	switch {
	case s.closing:
		s.mu.Unlock()
		return &apiError{Status: 503, Code: codeShuttingDown, Message: "the service is shutting down", RetryAfter: 5}
	case len(s.env)+s.envOpening+req.N > s.limits.MaxEnvEpisodes:
		left := max(0, s.limits.MaxEnvEpisodes-len(s.env)-s.envOpening)
		s.mu.Unlock()
		s.metrics.Rejected.WithLabelValues("episode").Inc()
		return &apiError{Status: http.StatusTooManyRequests, Code: codeOverloaded, RetryAfter: 5, Field: "n",
			Message: fmt.Sprintf("a fork of %d episodes does not fit: %d more environment episodes can be open (the most is %d); nothing was made", req.N, left, s.limits.MaxEnvEpisodes)}
	}
	s.envOpening += req.N
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.envOpening -= req.N
		s.mu.Unlock()
	}()

	ep.mu.Lock()
	if ep.sess.Ended() {
		reason := ep.sess.Trajectory().Termination.Reason
		ep.mu.Unlock()
		return &apiError{Status: http.StatusConflict, Code: codeConflict, Field: "id",
			Message: fmt.Sprintf("episode %s has ended (%s): only an open episode can be forked", ep.id, reason)}
	}
	ids := make([]string, req.N)
	for i := range ids {
		ids[i] = NewID(envPrefix)
	}
	kids, err := ep.sess.Fork(ep.ctx, ids)
	ep.mu.Unlock()
	if err != nil {
		switch {
		case errors.Is(err, agent.ErrForkEnded):
			return &apiError{Status: http.StatusConflict, Code: codeConflict, Field: "id", Message: err.Error()}
		case errors.Is(err, agent.ErrForkUnsupported):
			return &apiError{Status: http.StatusConflict, Code: codeConflict, Field: "id", Message: err.Error()}
		case errors.Is(err, sandbox.ErrTooLarge) || (errors.Is(err, sandbox.ErrInvalidSpec) && !sandbox.IsInfra(err)):
			// What the episode's own commands left cannot be carried (a
			// file over what a copying fork reads): the episode's doing,
			// not the infrastructure's.
			return &apiError{Status: http.StatusConflict, Code: codeConflict, Field: "id",
				Message: fmt.Sprintf("episode %s cannot be forked, because of the files in its sandbox; nothing was made: %v", ep.id, err)}
		case sandbox.IsAbuse(err):
			// The episode's own commands broke its sandbox (its guest
			// OOM-killed copying what they left): no retry can fork it,
			// and the episode is the one to score (its next step ends it
			// sandbox_abuse), not a failure of the service's.
			return &apiError{Status: http.StatusConflict, Code: codeConflict, Field: "id",
				Message: fmt.Sprintf("episode %s cannot be forked: its own commands broke its sandbox; nothing was made: %v", ep.id, err)}
		case sandbox.IsInfra(err):
			s.metrics.SandboxFailures.WithLabelValues(ep.backend).Inc()
			s.log.Warn("fork failed: nothing was made", "episode", ep.id, "n", req.N, "err", err)
			return &apiError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, RetryAfter: 5,
				Message: fmt.Sprintf("fork of episode %s into %d failed, nothing was made: %v", ep.id, req.N, err)}
		}
		return err
	}
	made := make([]*envEpisode, 0, len(kids))
	for i, sess := range kids {
		ctx, cancel := context.WithCancel(s.ctx)
		child := &envEpisode{id: ids[i], backend: ep.backend, ctx: ctx, cancel: cancel, sess: sess,
			rec: &episodeRecord{ID: ids[i], Mode: "env", TaskID: ep.rec.TaskID, State: ep.rec.State, Tenant: ep.rec.Tenant}}
		child.touch()
		if err := s.st.putEpisode(child.rec); err != nil {
			// All or nothing: the ones indexed are ended, the rest closed.
			for _, c := range made {
				s.endEnv(c, trajectory.EndCancelled, "a fork sibling could not be indexed")
			}
			for _, k := range kids[i:] {
				k.Cancel(context.Background(), trajectory.EndCancelled, "the fork could not be indexed")
			}
			cancel()
			return err
		}
		s.mu.Lock()
		s.env[child.id] = child
		s.mu.Unlock()
		s.envOpen.Add(1)
		s.worked.Store(true)
		s.metrics.Episodes.WithLabelValues("env").Inc()
		made = append(made, child)
	}
	writeHTTPJSON(w, http.StatusCreated, ForkResult{IDs: ids})
	return nil
}
