package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// envPrefix starts the id of every environment-mode episode.
const envPrefix = "e"

// envEpisode is an environment-mode episode: the trainer owns the loop and
// calls step and finish; the session is the same one a rollout runs, so
// the tools, limits and trajectory are the same.
type envEpisode struct {
	id      string
	backend string
	ctx     context.Context
	cancel  context.CancelFunc
	rec     *episodeRecord
	used    atomic.Int64 // unix nanos of the last request

	// mu serialises requests on the episode, and guards the trajectory
	// while it is encoded.
	mu      sync.Mutex
	sess    *agent.Session
	stepped int // tool calls assigned ids
}

func (e *envEpisode) touch() { e.used.Store(time.Now().UnixNano()) }

// OpenAITool is a tool schema in the OpenAI chat-completions format, as
// environment mode hands them out (pass them as "tools" to the model).
type OpenAITool struct {
	Type     string           `json:"type"`
	Function agent.ToolSchema `json:"function"`
}

// EpisodeOpened is the answer to POST /v1/episodes.
type EpisodeOpened struct {
	ID       string          `json:"id"`
	Messages []agent.Message `json:"messages"`
	Tools    []OpenAITool    `json:"tools"`
	Limits   EnvLimits       `json:"limits"`
}

// EnvLimits are the limits the episode runs under.
type EnvLimits struct {
	MaxTurns           int     `json:"max_turns"`
	MaxToolOutputBytes int     `json:"max_tool_output_bytes"`
	MaxContextTokens   int     `json:"max_context_tokens"`
	EpisodeTimeoutS    float64 `json:"episode_timeout_s"`
	IdleCloseS         float64 `json:"idle_close_s"`
}

// StepResult is the answer to POST /v1/episodes/{id}/step.
type StepResult struct {
	Results     []agent.ToolOutcome     `json:"results"`
	Done        bool                    `json:"done"`
	Termination *trajectory.Termination `json:"termination,omitempty"`
}

// FinishResult is the answer to POST /v1/episodes/{id}/finish.
type FinishResult struct {
	Reward      *trajectory.Reward      `json:"reward"`
	Termination *trajectory.Termination `json:"termination"`
}

func (s *Server) postEpisode(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, maxRolloutBody)
	if err != nil {
		return err
	}
	var req EpisodeRequest
	if err := decodeStrict(body, &req, ""); err != nil {
		return err
	}
	if len(req.Task) == 0 || string(req.Task) == "null" {
		return badField("task", "required: a task object, or {\"id\": ...} of a task the service knows")
	}
	task, inline, err := s.resolveTask(req.Task, "task")
	if err != nil {
		return err
	}
	if req.TrainStep != nil && *req.TrainStep < 0 {
		return badField("train_step", "%d is negative", *req.TrainStep)
	}
	if task.Prefix != nil {
		return badField("task.prefix", "a prefix runs once per group in rollouts; in environment mode step it and fork the episode (POST /v1/episodes/{id}/fork)")
	}
	if inline {
		if err := s.maxima.checkTask(task, "task"); err != nil {
			return err
		}
	}
	backend := req.Backend
	if backend == "" {
		backend = s.opts.DefaultBackend
	} else if err := sandbox.CheckBackend(backend); err != nil {
		return badField("backend", "%v", err)
	}
	if task.Sandbox.Backend != "" {
		backend = task.Sandbox.Backend
	}
	subagents, err := s.subagentPolicies(r.Context(), []*agent.Task{task}, "task")
	if err != nil {
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
	case len(s.env)+s.envOpening >= s.limits.MaxEnvEpisodes:
		s.mu.Unlock()
		s.metrics.Rejected.WithLabelValues("episode").Inc()
		return &apiError{Status: http.StatusTooManyRequests, Code: codeOverloaded, RetryAfter: 5,
			Message: fmt.Sprintf("%d environment episodes are open (the most this service holds); finish or delete some", s.limits.MaxEnvEpisodes)}
	}
	s.envOpening++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.envOpening--
		s.mu.Unlock()
	}()

	id := NewID(envPrefix)
	ctx, cancel := context.WithCancel(s.ctx)
	ep := &envEpisode{id: id, backend: backend, ctx: ctx, cancel: cancel,
		rec: &episodeRecord{ID: id, Mode: "env", TaskID: task.ID, State: episodeQueued, Tenant: tenantOf(r)}}
	cfg := agent.Config{Task: task, EpisodeID: id, Seed: req.Seed, Dir: s.st.episodesDir, Backend: backend,
		NewSandbox: s.sandboxes.create, PolicyInfo: trajectory.Policy{Kind: "env"},
		Observe: s.metrics.observer(backend), Retry: s.openRetry(id, backend, nil), Judges: s.judges,
		Subagents: s.subagents(task, subagents)}
	if req.TrainStep != nil {
		cfg.TrainStep = *req.TrainStep
	}
	if cfg.Subagents != nil {
		// An environment episode holds no scheduler slot (its trainer
		// drives it), so it has none to give its sub-agents: each takes a
		// slot of its own, counted with the rollouts' episodes, and none
		// waits on its parent.
		cfg.Subagents.Slotless = true
	}
	if s.opts.ConfigureEpisode != nil {
		if err := s.opts.ConfigureEpisode(&cfg); err != nil {
			cancel()
			return err
		}
	}
	s.backends.get(ctx, backend) // the episode's clock starts with its backend open (see runEpisode)
	sess, err := agent.Open(ctx, cfg)
	var oe *agent.OpenError
	if err != nil && !errors.As(err, &oe) {
		if sess != nil { // ended record_error: say so in the index
			ep.sess = sess
			s.recordEnvEnd(ep, sess.Trajectory())
		}
		cancel()
		return err
	}
	ep.sess = sess
	ep.touch()
	if oe != nil {
		t := sess.Trajectory()
		s.recordEnvEnd(ep, t)
		cancel()
		return &apiError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, RetryAfter: 5, Field: "task.sandbox",
			Message: fmt.Sprintf("episode %s could not start: %s (its record is at GET /v1/episodes/%s)", id, t.Termination.Message, id)}
	}
	if err := s.st.putEpisode(ep.rec); err != nil {
		sess.Cancel(context.Background(), trajectory.EndCancelled, "the episode could not be indexed")
		cancel()
		return err
	}
	s.mu.Lock()
	s.env[id] = ep
	s.mu.Unlock()
	s.envOpen.Add(1)
	s.worked.Store(true)
	s.metrics.Episodes.WithLabelValues("env").Inc()
	tools := []OpenAITool{}
	for _, t := range sess.Tools() {
		tools = append(tools, OpenAITool{Type: "function", Function: t})
	}
	l := task.Limits
	writeHTTPJSON(w, http.StatusCreated, EpisodeOpened{ID: id, Messages: sess.Messages(), Tools: tools,
		Limits: EnvLimits{MaxTurns: l.MaxTurns, MaxToolOutputBytes: l.MaxToolOutputBytes, MaxContextTokens: l.MaxContextTokens,
			EpisodeTimeoutS: l.EpisodeTimeoutS, IdleCloseS: s.limits.EnvIdleTimeout.Seconds()}})
	return nil
}

// recordEnvEnd indexes an env episode's end (once).
func (s *Server) recordEnvEnd(ep *envEpisode, t *trajectory.Trajectory) {
	if ep.rec.State == episodeDone || t == nil || t.Termination == nil {
		return
	}
	now := time.Now().UTC()
	ep.rec.State, ep.rec.Reason, ep.rec.EndedAt = episodeDone, t.Termination.Reason, &now
	if t.Termination.Reason == trajectory.EndRecordError {
		ep.rec.Message = t.Termination.Message
		s.storage.kick()
	}
	if v, ok := t.Value(); ok {
		ep.rec.Reward = &v
	}
	if err := s.st.putEpisode(ep.rec); err != nil {
		s.log.Error("store", "episode", ep.id, "err", err)
	}
	s.metrics.EpisodesEnded.WithLabelValues("env", t.Termination.Reason).Inc()
	s.metrics.episodeEnded(t)
}

// envEpisode finds an open env episode of the request's tenant.
func (s *Server) envEpisode(r *http.Request) (*envEpisode, error) {
	id := r.PathValue("id")
	s.mu.Lock()
	ep := s.env[id]
	s.mu.Unlock()
	if ep == nil || !ownedBy(ep.rec.Tenant, tenantOf(r)) {
		return nil, notFound("open episode", id)
	}
	ep.touch()
	return ep, nil
}

// closeEnv removes an env episode from the open set.
func (s *Server) closeEnv(ep *envEpisode) {
	s.mu.Lock()
	_, open := s.env[ep.id]
	delete(s.env, ep.id)
	s.mu.Unlock()
	if open {
		s.envOpen.Add(-1)
		s.metrics.Episodes.WithLabelValues("env").Dec()
	}
	ep.cancel()
}

func (s *Server) postStep(w http.ResponseWriter, r *http.Request) error {
	ep, err := s.envEpisode(r)
	if err != nil {
		return err
	}
	body, err := readBody(w, r, maxEnvRequestBody)
	if err != nil {
		return err
	}
	var req StepRequest
	if err := decodeStrict(body, &req, ""); err != nil {
		return err
	}
	if req.ToolCalls == nil && req.Content == "" {
		return badField("tool_calls", "required: the assistant message's tool calls (an empty array and content for a turn without calls)")
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.touch()
	defer ep.touch()
	if ep.sess.Ended() {
		return &apiError{Status: http.StatusConflict, Code: codeConflict, Field: "id",
			Message: fmt.Sprintf("episode %s has ended (%s); call finish for its reward", ep.id, ep.sess.Trajectory().Termination.Reason)}
	}
	turn := agent.Turn{Content: req.Content, FinishReason: req.FinishReason, Model: req.Model, Usage: req.Usage,
		PromptTokenIDs: req.PromptTokenIDs, CompletionTokenIDs: req.CompletionTokenIDs,
		Latency: time.Duration(req.LatencyMS * float64(time.Millisecond)), Attempts: 1, PolicyVersion: req.PolicyVersion}
	for i, c := range req.ToolCalls {
		field := fmt.Sprintf("tool_calls[%d]", i)
		if c.Name == "" {
			return badField(field+".name", "required")
		}
		args, err := argumentsText(c.Arguments)
		if err != nil {
			return badField(field+".arguments", "%v", err)
		}
		id := c.ID
		if id == "" {
			ep.stepped++
			id = fmt.Sprintf("call_%d", ep.stepped)
		}
		turn.ToolCalls = append(turn.ToolCalls, agent.ToolCall{ID: id, Name: c.Name, Arguments: args})
	}
	if turn.FinishReason == "" {
		turn.FinishReason = "stop"
		if len(turn.ToolCalls) > 0 {
			turn.FinishReason = "tool_calls"
		}
	}
	outs, done, err := ep.sess.Step(ep.ctx, turn)
	if err != nil {
		if ep.sess.Ended() { // the record failed: the episode ended record_error
			s.recordEnvEnd(ep, ep.sess.Trajectory())
		}
		return err
	}
	res := StepResult{Results: outs, Done: done}
	if res.Results == nil {
		res.Results = []agent.ToolOutcome{}
	}
	if done {
		t := ep.sess.Trajectory()
		res.Termination = t.Termination
		s.recordEnvEnd(ep, t)
	}
	writeHTTPJSON(w, http.StatusOK, res)
	return nil
}

// argumentsText accepts a call's arguments as the raw text (a JSON string,
// as OpenAI returns it) or as a JSON object, and returns the text.
func argumentsText(raw json.RawMessage) (string, error) {
	s := strings.TrimSpace(string(raw))
	switch {
	case s == "" || s == "null":
		return "{}", nil
	case s[0] == '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return "", err
		}
		return text, nil
	case s[0] == '{':
		return s, nil
	}
	return "", errors.New("want the arguments as a JSON string (as the model wrote them) or an object")
}

func (s *Server) postFinish(w http.ResponseWriter, r *http.Request) error {
	ep, err := s.envEpisode(r)
	if err != nil {
		return err
	}
	body, err := readBody(w, r, maxEnvRequestBody)
	if err != nil {
		return err
	}
	var req FinishRequest
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := decodeStrict(body, &req, ""); err != nil {
			return err
		}
	}
	ep.mu.Lock()
	t, err := ep.sess.Finish(ep.ctx, req.Answer, req.IDs)
	if err == nil {
		s.recordEnvEnd(ep, t)
	}
	ep.mu.Unlock()
	if err != nil {
		return err
	}
	s.closeEnv(ep)
	writeHTTPJSON(w, http.StatusOK, FinishResult{Reward: t.Reward, Termination: t.Termination})
	return nil
}

func (s *Server) getEpisode(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	tenant := tenantOf(r)
	s.mu.Lock()
	ep := s.env[id]
	s.mu.Unlock()
	if ep != nil && ownedBy(ep.rec.Tenant, tenant) {
		ep.mu.Lock()
		b, err := json.Marshal(ep.sess.Trajectory())
		ep.mu.Unlock()
		if err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(b, '\n'))
		return nil
	}
	rec, err := s.st.episode(id)
	if err != nil {
		return err
	}
	if rec == nil || rec.Mode != "rollout" && !ownedBy(rec.Tenant, tenant) {
		return notFound("episode", id)
	}
	var ro *rollout
	if rec.Mode == "rollout" {
		if ro, err = s.lookupRollout(rec.RolloutID, tenant); err != nil {
			var ae *apiError
			if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
				return notFound("episode", id)
			}
			return err // recovering: 503
		}
	} else if rec.State != episodeDone && s.recoveringAny.Load() {
		return errRecovering()
	}
	if rec.Mode == modeImport && rec.Outcome == trajectory.OutcomePending && rec.MaturesAt != nil && !s.now().Before(*rec.MaturesAt) {
		// Its window has closed: scored before it is read.
		if err := s.matureDue(s.now()); err != nil {
			return err
		}
	}
	t, err := trajectory.Read(s.st.trajectoryPath(id))
	if errors.Is(err, os.ErrNotExist) && rec.State != episodeDone {
		// Running: its journal so far (read at line boundaries, so never
		// torn), with no end yet.
		if t, err = trajectory.Recover(filepath.Join(s.st.episodesDir, id+trajectory.PartialSuffix)); err == nil {
			t.Termination, t.Reward, t.EndedAt = nil, nil, nil
		} else if errors.Is(err, os.ErrNotExist) {
			return notFound("episode record (queued, not started)", id)
		}
	}
	if err != nil && rec.State == episodeDone {
		// Ended without a readable record (record_error: the disk was
		// full): what the index knows, as a record.
		t = unreadableTrajectory(rec, nil, nil, "", trajectory.Policy{}, err)
		if ro != nil {
			ro.mu.Lock()
			if e := ro.byID[id]; e != nil {
				t = unreadableTrajectory(rec, e.task, nil, ro.rec.Backend, ro.rec.Policy, err)
			}
			ro.mu.Unlock()
		}
		err = nil
	}
	if err != nil {
		return err
	}
	if ro != nil {
		ro.mu.Lock()
		if e := ro.byID[id]; e != nil {
			t.Group = e.stats
		}
		ro.mu.Unlock()
	}
	writeHTTPJSON(w, http.StatusOK, t)
	return nil
}

func (s *Server) deleteEpisode(w http.ResponseWriter, r *http.Request) error {
	ep, err := s.envEpisode(r)
	if err != nil {
		return err
	}
	s.endEnv(ep, trajectory.EndCancelled, "closed by the caller (DELETE)")
	writeHTTPJSON(w, http.StatusOK, map[string]any{"id": ep.id, "termination": ep.sess.Trajectory().Termination})
	return nil
}

// endEnv ends an open env episode for reason and closes it.
func (s *Server) endEnv(ep *envEpisode, reason, message string) {
	ep.cancel() // a step in flight stops
	ep.mu.Lock()
	if err := ep.sess.Cancel(context.Background(), reason, message); err != nil {
		s.log.Error("episode record failed", "episode", ep.id, "err", err)
	}
	s.recordEnvEnd(ep, ep.sess.Trajectory())
	ep.mu.Unlock()
	s.closeEnv(ep)
}

// reapIdle closes env episodes nobody touched for the idle timeout, until
// ctx ends.
func (s *Server) reapIdle(ctx context.Context) {
	every := min(s.limits.EnvIdleTimeout/4, 30*time.Second)
	tick := time.NewTicker(max(every, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cut := time.Now().Add(-s.limits.EnvIdleTimeout).UnixNano()
		s.mu.Lock()
		var idle []*envEpisode
		for _, ep := range s.env {
			if ep.used.Load() < cut {
				idle = append(idle, ep)
			}
		}
		s.mu.Unlock()
		for _, ep := range idle {
			if !ep.mu.TryLock() { // a step is running: not idle
				continue
			}
			ep.mu.Unlock()
			s.log.Info("closing an idle environment episode", "episode", ep.id, "idle_timeout", s.limits.EnvIdleTimeout)
			s.endEnv(ep, trajectory.EndCancelled, fmt.Sprintf("closed after %s without a request (the service's idle timeout)", s.limits.EnvIdleTimeout))
		}
	}
}
