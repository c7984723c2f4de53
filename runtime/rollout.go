package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"
	"weak"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/openai"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cluster"
	"github.com/rollbox/rollbox/sandbox"
)

// Rollout states. "interrupted" is a rollout that the service stopped
// (crash or shutdown) before all its episodes ended; those episodes are
// recorded as interrupted. The API keeps DESIGN.md's four states: it reports
// an interrupted rollout as "cancelled" with "interrupted": true.
const (
	RolloutQueued      = "queued"
	RolloutRunning     = "running"
	RolloutDone        = "done"
	RolloutCancelled   = "cancelled"
	RolloutInterrupted = "interrupted"
)

func terminalState(s string) bool {
	return s == RolloutDone || s == RolloutCancelled || s == RolloutInterrupted
}

// rollout is a rollout in memory: a live one, or one loaded from the store.
type rollout struct {
	id       string
	tasks    []*agent.Task
	backend  string
	policy   agent.Policy
	info     trajectory.Policy
	sampling agent.Sampling
	endpoint *endpoint
	sem      chan struct{} // the rollout's own policy concurrency cap, or nil
	// subagents are the orchestrator tasks' sub-agent policies; trainStep
	// the request's train_step.
	subagents map[*agent.Task]subagentPolicy
	trainStep int64
	// wire is the policy as a cluster worker calls it; retryInterrupted
	// the request's retry_interrupted (a coordinator's).
	wire             *cluster.Policy
	retryInterrupted bool
	ctx              context.Context
	cancel           context.CancelCauseFunc

	queue []*job // guarded by the scheduler's mu
	// started counts the rollout's episodes the scheduler started and that
	// have not ended (guarded by the scheduler's mu); window, when > 0,
	// bounds it ("schedule": "groups").
	started, window int

	// saveMu orders the writes of the rollout's record: each takes the
	// record as it is when it writes, so the last write has the last state.
	saveMu sync.Mutex

	mu        sync.Mutex
	rec       *rolloutRecord
	episodes  []*episodeState
	byID      map[string]*episodeState
	groups    map[string]*groupState
	finished  []*episodeState // in finish order
	released  []*episodeState // whose group is complete, in release order
	running   int
	scored    int
	rewardSum float64
	ends      map[string]int
	toolErrs  map[string]int
	monitors  map[string]int // monitor → episodes that triggered it
	truncated trajectory.Truncations
	changed   chan struct{} // closed and replaced on every change
	// versions are the policy versions announced to the rollout, oldest
	// first; maxStaleness is its max_staleness (-1: none); versionTurns
	// counts the model turns of ended episodes by version.
	versions     []string
	maxStaleness int
	versionTurns map[string]int
}

type episodeState struct {
	rec     *episodeRecord
	task    *agent.Task
	group   *groupState
	stats   *trajectory.GroupStats // set when the group completes
	session *agent.Session         // while running
	// cancel ends the running episode with a cause (a stale policy
	// version); versionAt is 1 + the index in rollout.versions of the
	// version of its first turn, 0 before it.
	cancel    context.CancelCauseFunc
	versionAt int
}

type groupState struct {
	id      string
	members []*episodeState
	ended   int
	// prefix runs the task's prefix once for the group (nil without one).
	prefix *agent.PrefixGroup
	// waitNoted: logged as waiting for a worker with room for it (a
	// coordinator's group item), once; under the scheduler's mu.
	waitNoted bool
	// redispatch: a coordinator's group item of this group was published
	// before (by this process and taken back, or by an earlier one): the
	// next is published under a msg id of its own (under the coordinator's
	// mu).
	redispatch bool
}

func newRollout(rec *rolloutRecord) *rollout {
	return &rollout{rec: rec, id: rec.ID, byID: map[string]*episodeState{}, groups: map[string]*groupState{},
		ends: map[string]int{}, toolErrs: map[string]int{}, monitors: map[string]int{}, changed: make(chan struct{}), maxStaleness: -1, versionTurns: map[string]int{}}
}

// addEpisode registers an episode (under construction: no lock).
func (r *rollout) addEpisode(e *episodeState) {
	g := r.groups[e.rec.GroupID]
	if g == nil {
		g = &groupState{id: e.rec.GroupID}
		r.groups[e.rec.GroupID] = g
	}
	g.members = append(g.members, e)
	e.group = g
	r.episodes = append(r.episodes, e)
	r.byID[e.rec.ID] = e
}

// notifyLocked wakes every stream waiting on the rollout.
func (r *rollout) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// endLocked records an episode's end in memory; it returns whether the
// rollout has now ended. rec must already carry the outcome.
func (r *rollout) endLocked(e *episodeState) (rolloutEnded bool) {
	rec := e.rec
	r.finished = append(r.finished, e)
	rec.Seq = len(r.finished)
	r.ends[rec.Reason]++
	if rec.Reward != nil {
		r.scored++
		r.rewardSum += *rec.Reward
	}
	for k, v := range rec.ToolErrors {
		r.toolErrs[k] += v
	}
	for _, m := range rec.Monitors {
		r.monitors[m]++
	}
	r.truncated.Add(rec.Truncated)
	g := e.group
	g.ended++
	if g.ended == len(g.members) {
		r.releaseLocked(g)
		if g.prefix != nil {
			g.prefix.Close() // forks no episode took (none, unless some never opened)
		}
	}
	r.notifyLocked()
	return len(r.finished) == len(r.episodes)
}

// releaseLocked computes a complete group's statistics and makes its
// episodes visible to streams, in group order.
func (r *rollout) releaseLocked(g *groupState) {
	members := append([]*episodeState(nil), g.members...)
	sort.Slice(members, func(i, j int) bool { return members[i].rec.GroupIndex < members[j].rec.GroupIndex })
	ts := make([]*trajectory.Trajectory, len(members))
	for i, m := range members {
		ts[i] = &trajectory.Trajectory{}
		if m.rec.Reward != nil {
			ts[i].Reward = &trajectory.Reward{Total: trajectory.Score(*m.rec.Reward)}
		}
	}
	st := GroupStatistics(ts)
	var monitors map[string]int
	for _, m := range members {
		for _, name := range m.rec.Monitors {
			if monitors == nil {
				monitors = map[string]int{}
			}
			monitors[name]++
		}
	}
	for _, m := range members {
		gs := &trajectory.GroupStats{Size: len(members), RewardMean: st.RewardMean, RewardStd: st.RewardStd, ZeroVariance: st.ZeroVariance, Monitors: monitors}
		if m.rec.Reward != nil {
			gs.Advantage = *m.rec.Reward - st.RewardMean
		}
		m.stats = gs
	}
	r.released = append(r.released, members...)
}

// RolloutStatus is the body of GET /v1/rollouts/{id}.
type RolloutStatus struct {
	ID              string         `json:"id"`
	State           string         `json:"state"`
	EpisodesTotal   int            `json:"episodes_total"`
	EpisodesDone    int            `json:"episodes_done"`
	EpisodesRunning int            `json:"episodes_running"`
	EpisodesQueued  int            `json:"episodes_queued"`
	GroupSize       int            `json:"group_size"`
	GroupsTotal     int            `json:"groups_total"`
	GroupsDone      int            `json:"groups_done"`
	Scored          int            `json:"scored"`
	RewardMean      *float64       `json:"reward_mean"`
	Ends            map[string]int `json:"ends"`
	ToolErrors      map[string]int `json:"tool_errors"`
	Monitors        map[string]int `json:"monitors"` // monitor → ended episodes that triggered it
	InfraRetries    int            `json:"infra_retries"`
	Backend         string         `json:"backend"`
	Schedule        string         `json:"schedule,omitempty"`
	Policy          PolicyStatus   `json:"policy"`
	CreatedAt       time.Time      `json:"created_at"`
	EndedAt         *time.Time     `json:"ended_at,omitempty"`
	Message         string         `json:"message,omitempty"`
	// Interrupted is set (with State "cancelled") when the service stopped
	// before every episode ended.
	Interrupted bool `json:"interrupted,omitempty"`
	// PolicyVersion is the version announced last; PolicyVersions counts
	// the model turns of the episodes ended so far by the version that
	// produced them (the version mix); MaxStaleness is the rollout's.
	PolicyVersion  string         `json:"policy_version,omitempty"`
	PolicyVersions map[string]int `json:"policy_versions,omitempty"`
	MaxStaleness   *int           `json:"max_staleness,omitempty"`

	// Truncated counts, beside the error kinds, the tool steps whose
	// output the model did not see whole (trajectory.Truncations).
	Truncated trajectory.Truncations `json:"truncated"`
}

// PolicyStatus is the policy a rollout runs against.
type PolicyStatus struct {
	BaseURL  string          `json:"base_url"`
	Model    string          `json:"model"`
	Sampling json.RawMessage `json:"sampling,omitempty"`
	// Mode is "tokens" in token mode; Tokenizer the server's tokenizer.
	Mode      string                `json:"mode,omitempty"`
	Tokenizer *trajectory.Tokenizer `json:"tokenizer,omitempty"`
}

func (r *rollout) status() RolloutStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.rec
	st := RolloutStatus{ID: r.id, State: rec.State, EpisodesTotal: len(r.episodes), EpisodesDone: len(r.finished),
		EpisodesRunning: r.running, GroupSize: rec.GroupSize, GroupsTotal: len(r.groups),
		Scored: r.scored, Ends: copyCounts(r.ends), ToolErrors: copyCounts(r.toolErrs), Monitors: copyCounts(r.monitors),
		Truncated: trajectory.Truncations{Total: r.truncated.Total, Tools: copyCounts(r.truncated.Tools)}, InfraRetries: rec.InfraRetries,
		Backend: rec.Backend, Schedule: rec.Schedule, CreatedAt: rec.CreatedAt, EndedAt: rec.EndedAt, Message: rec.Message,
		Policy: PolicyStatus{BaseURL: rec.Policy.Endpoint, Model: rec.Policy.Model, Sampling: rec.Policy.Sampling, Mode: rec.Policy.Mode, Tokenizer: rec.Policy.Tokenizer}}
	r.versionStatusLocked(&st)
	st.EpisodesQueued = st.EpisodesTotal - st.EpisodesDone - st.EpisodesRunning
	if st.State == RolloutInterrupted {
		st.State, st.Interrupted = RolloutCancelled, true
	}
	for _, g := range r.groups {
		if g.ended == len(g.members) {
			st.GroupsDone++
		}
	}
	if r.scored > 0 {
		m := r.rewardSum / float64(r.scored)
		st.RewardMean = &m
	}
	return st
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// parseRollout validates a POST /v1/rollouts body into a rollout ready to
// queue. Every error is a 4xx naming the field.
func (s *Server) parseRollout(ctx context.Context, body []byte) (*rollout, []*job, error) {
	var req RolloutRequest
	if err := decodeStrict(body, &req, ""); err != nil {
		return nil, nil, err
	}
	if req.Tasks == nil {
		return nil, nil, badField("tasks", "required: a non-empty array of tasks (inline, or {\"id\": ...} of a task the service knows)")
	}
	if len(req.Tasks) == 0 {
		return nil, nil, badField("tasks", "is empty")
	}
	if req.GroupSize == 0 {
		req.GroupSize = 1
	}
	if req.GroupSize < 1 || req.GroupSize > s.maxima.GroupSize {
		return nil, nil, badField("group_size", "%d is outside 1..%d (rollbox serve --max-limits group_size=...)", req.GroupSize, s.maxima.GroupSize)
	}
	// What the rollout costs is known now, before any task is parsed or any
	// episode allocated: refuse it cheaply.
	if len(req.Tasks) > s.maxima.Tasks {
		return nil, nil, overMax("tasks", fmt.Sprintf("%d tasks", len(req.Tasks)), s.maxima.Tasks, "tasks")
	}
	n := len(req.Tasks) * req.GroupSize
	if n > s.maxima.Episodes && n <= s.limits.MaxRunning+s.limits.MaxQueued {
		return nil, nil, overMax("group_size", fmt.Sprintf("%d tasks × group_size %d = %d episodes", len(req.Tasks), req.GroupSize, n), s.maxima.Episodes, "episodes")
	}
	if err := s.sched.fits(n); err != nil {
		if ae, ok := err.(*apiError); ok && ae.Status == http.StatusTooManyRequests {
			s.metrics.Rejected.WithLabelValues("rollout").Inc()
		}
		return nil, nil, err
	}
	backend := req.Backend
	if backend == "" {
		backend = s.opts.DefaultBackend
	} else if err := sandbox.CheckBackend(backend); err != nil {
		return nil, nil, badField("backend", "%v", err)
	}
	if len(req.Policy) == 0 || string(req.Policy) == "null" {
		return nil, nil, badField("policy", "required: {\"base_url\": URL, \"model\": NAME, \"sampling\": {...}}")
	}
	var pr PolicyRequest
	if err := decodeStrict(req.Policy, &pr, "policy"); err != nil {
		return nil, nil, err
	}
	if pr.BaseURL == "" {
		return nil, nil, badField("policy.base_url", "required: the OpenAI-compatible server's API root, e.g. http://127.0.0.1:8000/v1")
	}
	if u, err := url.Parse(pr.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, nil, badField("policy.base_url", "%q is not an http or https URL", pr.BaseURL)
	}
	if pr.Model == "" {
		return nil, nil, badField("policy.model", "required: the model name the server serves")
	}
	if pr.MaxRetries != nil && (*pr.MaxRetries < 0 || *pr.MaxRetries > 20) {
		return nil, nil, badField("policy.max_retries", "%d is outside 0..20", *pr.MaxRetries)
	}
	if pr.TimeoutS < 0 {
		return nil, nil, badField("policy.timeout_s", "%v is negative", pr.TimeoutS)
	}
	if pr.TimeoutS > s.maxima.PolicyTimeoutS {
		return nil, nil, overMax("policy.timeout_s", pr.TimeoutS, s.maxima.PolicyTimeoutS, "policy_timeout_s")
	}
	if pr.MaxConcurrency < 0 {
		return nil, nil, badField("policy.max_concurrency", "%d is negative", pr.MaxConcurrency)
	}
	switch pr.Mode {
	case "", trajectory.ModeChat, trajectory.ModeTokens:
	default:
		return nil, nil, badField("policy.mode", "%q is not one of chat, tokens", pr.Mode)
	}
	if pr.TokenizeURL != "" && pr.Mode != trajectory.ModeTokens {
		return nil, nil, badField("policy.tokenize_url", "only with \"mode\": \"tokens\"")
	}
	switch req.Schedule {
	case "":
		req.Schedule = ScheduleEpisodes
		if req.GroupSize > 1 {
			req.Schedule = ScheduleGroups
		}
	case ScheduleGroups, ScheduleEpisodes:
	default:
		return nil, nil, badField("schedule", "%q is not one of groups, episodes", req.Schedule)
	}
	if req.MaxStaleness != nil && *req.MaxStaleness < 0 {
		return nil, nil, badField("max_staleness", "%d is negative", *req.MaxStaleness)
	}
	if req.TrainStep != nil && *req.TrainStep < 0 {
		return nil, nil, badField("train_step", "%d is negative", *req.TrainStep)
	}
	var sampling agent.Sampling
	if len(pr.Sampling) > 0 {
		if err := decodeStrict(pr.Sampling, &sampling, "policy.sampling"); err != nil {
			return nil, nil, err
		}
	}
	if t := sampling.Temperature; t != nil && (*t < 0 || *t > 10) {
		return nil, nil, badField("policy.sampling.temperature", "%v is outside 0..10", *t)
	}
	if p := sampling.TopP; p != nil && (*p <= 0 || *p > 1) {
		return nil, nil, badField("policy.sampling.top_p", "%v is outside (0, 1]", *p)
	}
	if m := sampling.MaxTokens; m != nil && *m <= 0 {
		return nil, nil, badField("policy.sampling.max_tokens", "%d is not positive", *m)
	}
	if m := sampling.MaxTokens; m != nil && *m > int64(s.maxima.PolicyMaxTokens) {
		return nil, nil, overMax("policy.sampling.max_tokens", *m, s.maxima.PolicyMaxTokens, "policy_max_tokens")
	}
	var ov Overrides
	var limits agent.EpisodeLimits
	if len(req.Overrides) > 0 {
		if err := decodeStrict(req.Overrides, &ov, "overrides"); err != nil {
			return nil, nil, err
		}
		if len(ov.Limits) > 0 {
			if err := decodeStrict(ov.Limits, &limits, "overrides.limits"); err != nil {
				return nil, nil, err
			}
			if err := limits.Validate(); err != nil {
				return nil, nil, taskError(err, "overrides")
			}
			probe := &agent.Task{Limits: limits}
			if err := s.maxima.checkTask(probe, "overrides"); err != nil {
				return nil, nil, err
			}
		}
	}
	tasks := make([]*agent.Task, len(req.Tasks))
	seen := map[string]int{}
	for i, raw := range req.Tasks {
		field := fmt.Sprintf("tasks[%d]", i)
		t, inline, err := s.resolveTask(raw, field)
		if err != nil {
			return nil, nil, err
		}
		if inline {
			if err := s.maxima.checkTask(t, field); err != nil {
				return nil, nil, err
			}
		}
		if limits != (agent.EpisodeLimits{}) {
			cp := *t
			applyLimits(&cp.Limits, limits)
			if err := cp.Validate(s.opts.KnownTool); err != nil {
				return nil, nil, taskError(err, field)
			}
			t = &cp
		}
		if j, dup := seen[t.ID]; dup {
			return nil, nil, badField(field+".id", "task %q is also tasks[%d]; use group_size for repeats", t.ID, j)
		}
		if err := agent.CheckJudges(t, trajectory.Policy{Endpoint: pr.BaseURL, Model: pr.Model}); err != nil {
			return nil, nil, taskError(err, field)
		}
		seen[t.ID] = i
		tasks[i] = t
	}

	if err := s.clusterRefuses(&req, tasks); err != nil {
		return nil, nil, err
	}
	subagents, err := s.subagentPolicies(ctx, tasks, "tasks")
	if err != nil {
		return nil, nil, err
	}
	id := NewID("r")
	maxRetries := openai.DefaultMaxRetries
	if pr.MaxRetries != nil {
		maxRetries = *pr.MaxRetries
		if maxRetries == 0 {
			maxRetries = -1 // the client's "none"
		}
	}
	ep := s.endpoints.get(pr.BaseURL)
	pcfg := openai.Config{BaseURL: pr.BaseURL, Model: pr.Model, APIKey: s.opts.PolicyAPIKey, MaxRetries: maxRetries,
		Timeout: time.Duration(pr.TimeoutS * float64(time.Second)), HTTPClient: ep.client, TokenizeURL: pr.TokenizeURL}
	info := trajectory.Policy{Kind: "openai", Endpoint: pr.BaseURL, Model: pr.Model}
	var pol agent.Policy
	if pr.Mode == trajectory.ModeTokens {
		// Admission: a server that cannot serve token mode refuses the
		// rollout here, not each episode.
		tp, err := s.tokenPolicy(ctx, pcfg, "policy")
		if err != nil {
			return nil, nil, err
		}
		tok := tp.Tokenizer()
		pol, info.Mode, info.Tokenizer = tp, trajectory.ModeTokens, &tok
	} else {
		p, err := openai.New(pcfg)
		if err != nil {
			return nil, nil, badField("policy", "%v", err)
		}
		pol = p
	}
	samplingJSON, _ := json.Marshal(sampling)
	recPolicy := info
	recPolicy.Sampling = samplingJSON
	rec := &rolloutRecord{ID: id, State: RolloutQueued, CreatedAt: time.Now().UTC(), GroupSize: req.GroupSize, Tenant: tenantFrom(ctx),
		EpisodesTotal: len(tasks) * req.GroupSize, Backend: backend, Policy: recPolicy}
	r := newRollout(rec)
	r.tasks, r.backend, r.policy, r.sampling, r.endpoint = tasks, backend, pol, sampling, ep
	r.subagents = subagents
	r.retryInterrupted = req.RetryInterrupted
	r.wire = &cluster.Policy{BaseURL: pr.BaseURL, Model: pr.Model, Mode: pr.Mode, TokenizeURL: pr.TokenizeURL, Sampling: samplingJSON,
		MaxRetries: maxRetries, TimeoutS: pr.TimeoutS, MaxConcurrency: pr.MaxConcurrency, Info: info}
	if req.TrainStep != nil {
		r.trainStep = *req.TrainStep
	}
	if s.coord != nil {
		ctasks, err := s.clusterTasks(tasks)
		if err != nil {
			return nil, nil, err
		}
		rec.Cluster = &clusterRollout{Policy: *r.wire, RetryInterrupted: r.retryInterrupted, TrainStep: r.trainStep, MaxStaleness: req.MaxStaleness, Tasks: ctasks}
	}
	r.info = info
	if v := s.initialVersion(req.PolicyVersion, tenantFrom(ctx)); v != "" {
		r.versions = []string{v}
	}
	if rec.Cluster != nil {
		rec.Cluster.Versions = slices.Clone(r.versions)
	}
	if req.MaxStaleness != nil {
		r.maxStaleness = *req.MaxStaleness
	}
	concurrency := s.limits.PolicyConcurrency
	if pr.MaxConcurrency > 0 && pr.MaxConcurrency < s.limits.PolicyConcurrency {
		r.sem = make(chan struct{}, pr.MaxConcurrency)
		concurrency = pr.MaxConcurrency
	}
	rec.Schedule = req.Schedule
	if req.Schedule == ScheduleGroups {
		r.window = groupWindow(concurrency, req.GroupSize)
	}
	var jobs []*job
	for ti, t := range tasks {
		b, _ := json.Marshal(t)
		rec.Tasks = append(rec.Tasks, b)
		pl := newPlan(t, backend, s.limits.WarmPool)
		for g := range req.GroupSize {
			e := &episodeState{task: t, rec: &episodeRecord{
				ID: episodeID(id, t.ID, g), Mode: "rollout", RolloutID: id, GroupID: groupID(id, t.ID),
				GroupIndex: g, TaskIndex: ti, TaskID: t.ID, State: episodeQueued}}
			r.addEpisode(e)
			jobs = append(jobs, &job{r: r, ep: e, plan: pl})
		}
		if t.Prefix != nil {
			gid := groupID(id, t.ID)
			r.groups[gid].prefix = &agent.PrefixGroup{Name: gid, Size: req.GroupSize, Dir: filepath.Join(s.st.dir, "prefixes")}
		}
	}
	return r, jobs, nil
}

// groupWindow is how many episodes of a "groups" rollout run at once: twice
// the policy calls it may have in flight (an episode spends part of its time
// in its tools, so the policy stays busy), in whole groups, at least one.
func groupWindow(policyConcurrency, groupSize int) int {
	groups := (2*policyConcurrency + groupSize - 1) / groupSize
	return max(1, groups) * groupSize
}

// applyLimits sets every non-zero field of o on l.
func applyLimits(l *agent.EpisodeLimits, o agent.EpisodeLimits) {
	if o.MaxTurns != 0 {
		l.MaxTurns = o.MaxTurns
	}
	if o.MaxToolOutputBytes != 0 {
		l.MaxToolOutputBytes = o.MaxToolOutputBytes
	}
	if o.MaxContextTokens != 0 {
		l.MaxContextTokens = o.MaxContextTokens
	}
	if o.ContextOverflow != "" {
		l.ContextOverflow = o.ContextOverflow
	}
	if o.EpisodeTimeoutS != 0 {
		l.EpisodeTimeoutS = o.EpisodeTimeoutS
	}
	if o.IdleTimeoutS != 0 {
		l.IdleTimeoutS = o.IdleTimeoutS
	}
	if o.MaxStoredOutputBytes != 0 {
		l.MaxStoredOutputBytes = o.MaxStoredOutputBytes
	}
}

// resolveTask reads one task: {"id": ID} of a task the service was started
// with, or an inline task (validated like a task file's line). Inline tasks
// may not name host paths (workspace, retriever).
func (s *Server) resolveTask(raw json.RawMessage, field string) (t *agent.Task, inline bool, err error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, false, badField(field, "want a task object, got %.60s", raw)
	}
	if idRaw, ok := probe["id"]; ok && len(probe) == 1 {
		var id string
		if err := json.Unmarshal(idRaw, &id); err != nil {
			return nil, false, badField(field+".id", "want a string")
		}
		t = s.catalog[id]
		if t == nil {
			return nil, false, badField(field+".id", "no task %q is known to the service (known: %d tasks from --tasks); send the task inline", id, len(s.catalog))
		}
		return t, false, nil
	}
	if _, ok := probe["workspace"]; ok {
		return nil, false, badField(field+".workspace", "host paths are not accepted over HTTP; send files or files_base64, or start the service with --tasks")
	}
	if _, ok := probe["retriever"]; ok {
		return nil, false, badField(field+".retriever", "search tasks name a host index; start the service with --tasks and refer to them by id")
	}
	t, err = agent.ParseTask(raw, "", s.opts.KnownTool)
	if err != nil {
		return nil, false, taskError(err, field)
	}
	if f := agent.JudgeKeyField(t); f != "" {
		// The service's environment is the operator's: a request must not
		// have a key of it sent to a URL the request names.
		return nil, false, badField(field+"."+f, "judge API keys are not accepted over HTTP (api_key_env would send the service's environment to the judge's URL); start the service with --tasks and refer to the task by id")
	}
	return t, true, nil
}

// refuseNewWork is the error new work (a rollout, an environment episode)
// gets while the service cannot take it: shutting down, or a data
// directory that cannot take more records. (New work is taken while what a
// previous process left is recovered: it concerns other ids.)
func (s *Server) refuseNewWork() error {
	if s.closingFlag.Load() {
		return &apiError{Status: http.StatusServiceUnavailable, Code: codeShuttingDown, Message: "the service is shutting down", RetryAfter: 5}
	}
	return s.storage.refusal()
}

func errRecovering() error {
	return &apiError{Status: http.StatusServiceUnavailable, Code: codeRecovering, RetryAfter: 2,
		Message: "the service is recovering what its previous process left in the data directory; retry shortly"}
}

// submit admits a parsed rollout: indexed in the store, then queued.
func (s *Server) submit(r *rollout, jobs []*job) error {
	if err := s.refuseNewWork(); err != nil {
		return err
	}
	r.ctx, r.cancel = context.WithCancelCause(s.ctx)
	recs := make([]*episodeRecord, len(r.episodes))
	for i, e := range r.episodes {
		recs[i] = e.rec
	}
	// Admission first (cheap, in memory), so a full service writes nothing.
	if err := s.sched.admit(r, jobs); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == 429 {
			s.metrics.Rejected.WithLabelValues("rollout").Inc()
		}
		return err
	}
	s.mu.Lock()
	s.rollouts[r.id] = r
	s.mu.Unlock()
	r.mu.Lock()
	err := s.st.createRollout(r.rec, recs)
	r.mu.Unlock()
	if err != nil {
		s.cancelRollout(r, "the rollout could not be recorded: "+err.Error())
		return err
	}
	s.metrics.Episodes.WithLabelValues("queued").Add(float64(len(jobs)))
	s.metrics.Rollouts.WithLabelValues("submitted").Inc()
	s.log.Info("rollout submitted", "rollout", r.id, "episodes", len(jobs), "tasks", len(r.tasks),
		"group_size", r.rec.GroupSize, "policy", r.info.Endpoint, "model", r.info.Model)
	return nil
}

// startJob runs a job the scheduler started.
func (s *Server) startJob(j *job) {
	s.metrics.Episodes.WithLabelValues("queued").Dec()
	s.metrics.Episodes.WithLabelValues("running").Inc()
	s.wg.Add(1)
	run := func(openHeld bool) {
		defer s.wg.Done()
		defer s.sched.done(j)
		r := j.r
		r.mu.Lock()
		r.running++
		first := r.rec.State == RolloutQueued
		if first {
			r.rec.State = RolloutRunning
		}
		r.mu.Unlock()
		if first {
			s.saveRollout(r)
		}
		t, err := s.runEpisode(r.ctx, j, openHeld)
		s.metrics.Episodes.WithLabelValues("running").Dec()
		r.mu.Lock()
		r.running--
		r.mu.Unlock()
		if err != nil {
			// The record could not be written (record_error), or rollbox
			// failed (sandbox_error): said in the index, not dropped.
			s.log.Error("episode failed", "episode", j.ep.rec.ID, "err", err)
		}
		s.endEpisode(r, j.ep, t, err)
	}
	if j.plan.backend == "wasm" { // in-process, CPU-bound: see openingAtOnce
		// Its goroutine starts with its turn to open (opens).
		s.opens.start(j.r.ctx, run)
		return
	}
	go run(false)
}

// runEpisode runs one rollout episode (agent.Run: the open, retried as
// the service retries, then the loop) with the rollout's policy behind the
// endpoint's and the rollout's concurrency caps. The session is kept on the
// episode while it runs, so a cancellation can end it.
func (s *Server) runEpisode(ctx context.Context, j *job, openHeld bool) (t *trajectory.Trajectory, err error) {
	// A bug that panics fails the episode, not the service.
	defer func() {
		if p := recover(); p != nil {
			t, err = nil, fmt.Errorf("episode %s: %v", j.ep.rec.ID, p)
		}
	}()
	// The turn to open it was started with (opens) is given back once it
	// has opened, at the latest now.
	releaseOpen := func() {}
	if openHeld {
		var once sync.Once
		releaseOpen = func() { once.Do(s.opens.release) }
	}
	defer releaseOpen()
	r, e := j.r, j.ep
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.mu.Lock()
	e.cancel = cancel
	r.mu.Unlock()
	cfg, err := s.episodeConfig(j)
	if err != nil {
		return nil, err
	}
	// The episode's clock starts once its backend is open: a first-use
	// build and compile is the service's, not the episode's (its duration
	// and deadline never count it). A backend that does not open fails
	// the episode's open as before, with its retries.
	s.backends.get(ctx, j.plan.backend)
	if openHeld {
		openGate(releaseOpen, cfg)
	}
	t, err = agent.Run(ctx, *cfg)
	r.mu.Lock()
	e.session = nil
	r.mu.Unlock()
	return t, err
}

// episodeConfig is a rollout episode's agent.Config (runEpisode), built
// apart and on the heap: the episode's goroutine holds its stack for the
// whole episode, sized by its deepest point while it waits in a tool, so
// what runEpisode's frame holds is held by every running episode.
//
//go:noinline
func (s *Server) episodeConfig(j *job) (*agent.Config, error) {
	r, e := j.r, j.ep
	cfg := j.plan.config(r.id, e.rec.GroupIndex, s.st.episodesDir)
	cfg.NewSandbox = s.sandboxes.create
	cfg.Prefix = e.group.prefix
	cfg.Policy = &gatedPolicy{inner: r.policy, ep: r.endpoint, rolloutSem: r.sem, metrics: s.metrics, versions: episodeVersions{r, e}, cpu: s.cpu}
	cfg.CPU = s.cpu
	cfg.PolicyInfo, cfg.Sampling = r.info, r.sampling
	cfg.Observe = s.metrics.observer(j.plan.backend)
	cfg.Judges = s.judges
	cfg.TrainStep, cfg.Subagents = r.trainStep, s.subagents(j.plan.task, r.subagents)
	cfg.Retry = s.openRetry(e.rec.ID, j.plan.backend, func() {
		r.mu.Lock()
		r.rec.InfraRetries++
		r.mu.Unlock()
	})
	cfg.OnOpen = func(sess *agent.Session) {
		r.mu.Lock()
		e.session = sess
		r.mu.Unlock()
	}
	if s.opts.ConfigureEpisode != nil {
		if err := s.opts.ConfigureEpisode(&cfg); err != nil {
			return nil, err
		}
	}
	return &cfg, nil
}

// openRetry is the service's retry of an episode's open (rollout and
// environment mode): Limits.InfraAttempts attempts, the failed ones' records
// in DATA/attempts/, each retry counted in rollbox_infra_retries_total and
// by counted.
func (s *Server) openRetry(episode, backend string, counted func()) agent.Retry {
	return openRetry(s.limits.InfraAttempts, s.st.attemptsDir, s.log, episode, func(*agent.OpenError) {
		s.metrics.InfraRetries.WithLabelValues(backend).Inc()
		if counted != nil {
			counted()
		}
	})
}

// saveRollout writes the rollout's record as it is now.
func (s *Server) saveRollout(r *rollout) {
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	r.mu.Lock()
	cp := *r.rec
	if cp.Cluster != nil {
		cc := *cp.Cluster // its versions change under r.mu
		cp.Cluster = &cc
	}
	r.mu.Unlock()
	if err := s.st.putRollout(&cp); err != nil {
		s.log.Error("store", "rollout", r.id, "err", err)
	}
}

// endedEpisode is an episode's end to record: its trajectory (nil when
// there is none) and the error that came with it.
type endedEpisode struct {
	e   *episodeState
	t   *trajectory.Trajectory
	err error
}

// endEpisode records an episode's end: the index, the rollout's counts and
// groups, metrics; the rollout's own end when it was the last.
func (s *Server) endEpisode(r *rollout, e *episodeState, t *trajectory.Trajectory, recordErr error) {
	s.recordEnds(r, []endedEpisode{{e, t, recordErr}})
}

// recordEnds records many episodes' ends at once: in memory under one lock,
// in the index in one transaction (a single end joins concurrent ones in a
// batch). Their records are already durable (written, synced).
func (s *Server) recordEnds(r *rollout, ends []endedEpisode) {
	now := time.Now().UTC()
	recs := make([]*episodeRecord, 0, len(ends))
	recordErrors := 0
	r.mu.Lock()
	ended := false
	for _, it := range ends {
		rec := it.e.rec
		rec.State, rec.EndedAt = episodeDone, &now
		switch {
		case it.t != nil && it.t.Termination != nil:
			rec.Reason = it.t.Termination.Reason
			if v, ok := it.t.Value(); ok {
				rec.Reward = &v
			}
			if len(it.t.Stats.ToolErrors) > 0 {
				rec.ToolErrors = copyCounts(it.t.Stats.ToolErrors)
			}
			rec.Monitors = it.t.Monitors.Triggered()
			rec.Truncated = it.t.Stats.Truncated
			for v, n := range it.t.Stats.PolicyVersions {
				r.versionTurns[v] += n
			}
			if rec.Reason == trajectory.EndRecordError {
				rec.Message = it.t.Termination.Message
			}
		case it.err != nil && (errors.As(it.err, new(*agent.RecordError)) || it.t == nil && isWriteError(it.err)):
			rec.Reason, rec.Message = trajectory.EndRecordError, "the record could not be written: "+it.err.Error()
		default:
			rec.Reason = trajectory.EndSandboxError
		}
		if rec.Reason == trajectory.EndRecordError {
			recordErrors++
		}
		s.metrics.EpisodesEnded.WithLabelValues("rollout", rec.Reason).Inc()
		s.metrics.episodeEnded(it.t)
		if len(r.finished)+1 == len(r.episodes) {
			switch {
			case r.rec.State == RolloutCancelled || r.rec.State == RolloutInterrupted:
			default:
				r.rec.State = RolloutDone
			}
			r.rec.EndedAt = &now
			s.metrics.Rollouts.WithLabelValues(r.rec.State).Inc()
		}
		ended = r.endLocked(it.e)
		cp := *rec
		recs = append(recs, &cp)
	}
	r.mu.Unlock()
	if recordErrors > 0 {
		s.storage.kick()
	}
	var err error
	switch {
	case len(recs) == 1 && !ended:
		err = s.st.putEpisode(recs[0])
	default:
		r.saveMu.Lock()
		var rolloutRec []*rolloutRecord
		if ended {
			r.mu.Lock()
			cp := *r.rec
			r.mu.Unlock()
			rolloutRec = append(rolloutRec, &cp)
		}
		err = s.st.putEnds(recs, rolloutRec...)
		r.saveMu.Unlock()
	}
	if err != nil {
		// The records are on disk (or the ends are record_error): the index
		// learns them when it can be written again.
		s.log.Error("store: indexing episode ends failed; retried when the data directory takes writes", "rollout", r.id, "episodes", len(recs), "err", err)
		s.keepUnindexed(recs, r, ended)
		s.storage.kick()
	} else {
		s.flushUnindexed()
	}
	if ended {
		st := r.status()
		s.log.Info("rollout ended", "rollout", r.id, "state", st.State, "interrupted", st.Interrupted, "episodes", st.EpisodesTotal,
			"scored", st.Scored, "ends", st.Ends, "infra_retries", st.InfraRetries)
		r.cancel(errors.New("the rollout ended"))
		s.forgetLater(r)
	}
}

// keepUnindexed keeps episode ends (and the rollout's record when it ended)
// that the index could not take, for flushUnindexed.
func (s *Server) keepUnindexed(recs []*episodeRecord, r *rollout, ended bool) {
	s.unindexedMu.Lock()
	defer s.unindexedMu.Unlock()
	s.unindexed = append(s.unindexed, recs...)
	if ended {
		s.unindexedRollouts = append(s.unindexedRollouts, r)
	}
	s.unindexedAny.Store(true)
}

// flushUnindexed writes the ends the index could not take before, in one
// transaction; what still fails stays for the next try.
func (s *Server) flushUnindexed() {
	if !s.unindexedAny.Load() {
		return
	}
	s.unindexedMu.Lock()
	defer s.unindexedMu.Unlock()
	if len(s.unindexed) == 0 && len(s.unindexedRollouts) == 0 {
		return
	}
	var rollouts []*rolloutRecord
	for _, r := range s.unindexedRollouts {
		r.mu.Lock()
		cp := *r.rec
		r.mu.Unlock()
		rollouts = append(rollouts, &cp)
	}
	if err := s.st.putEnds(s.unindexed, rollouts...); err != nil {
		s.log.Warn("store: the index still cannot take the ends kept for it", "episodes", len(s.unindexed), "err", err)
		return
	}
	s.log.Info("store: indexed the episode ends kept while the data directory could not take them", "episodes", len(s.unindexed))
	s.unindexed, s.unindexedRollouts = nil, nil
	s.unindexedAny.Store(false)
}

// isWriteError reports whether err is a failure to write to the disk.
func isWriteError(err error) bool {
	var pe *os.PathError
	return errors.As(err, &pe) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EIO)
}

// forgetLater drops an ended rollout from memory after Limits.KeepEnded;
// the store has it. The timer holds it weakly: a rollout forgotten sooner
// (forgetEnded) is not kept alive by its timer.
func (s *Server) forgetLater(r *rollout) {
	id, w := r.id, weak.Make(r)
	time.AfterFunc(s.limits.KeepEnded, func() {
		s.mu.Lock()
		if cur := s.rollouts[id]; cur != nil && cur == w.Value() {
			delete(s.rollouts, id)
		}
		s.mu.Unlock()
	})
}

// cancelRollout stops a rollout: queued episodes end "cancelled" without
// starting; running ones are cancelled (their sandboxes stopped) and end
// "cancelled" as their loops notice. reason goes in the record.
func (s *Server) cancelRollout(r *rollout, reason string) {
	s.stopRollout(r, RolloutCancelled, trajectory.EndCancelled, reason)
}

// stopRollout stops a rollout in O(1) for its caller: the new state is
// recorded, the queued episodes leave the scheduler, the running ones are
// cancelled with an agent.StopCause (so whatever they are doing ends for
// endReason), and the queued ones' records are written in the background,
// in bulk (WriteFiles: one sync; recordEnds: one transaction).
func (s *Server) stopRollout(r *rollout, state, endReason, message string) {
	r.mu.Lock()
	if terminalState(r.rec.State) {
		r.mu.Unlock()
		return
	}
	r.rec.State, r.rec.Message = state, message
	r.mu.Unlock()
	s.saveRollout(r)
	jobs := s.sched.withdraw(r)
	s.metrics.Episodes.WithLabelValues("queued").Sub(float64(len(jobs)))
	if r.cancel != nil {
		r.cancel(&agent.StopCause{Reason: endReason, Message: message})
	}
	if s.coord != nil {
		s.coord.cancelRollout(r, endReason, message)
	}
	if len(jobs) == 0 {
		return
	}
	s.wg.Add(1)
	s.unstartedEnding.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.unstartedEnding.Add(-1)
		s.endUnstarted(r, jobs, endReason, message+" (before the episode started)")
	}()
}

// endUnstarted records episodes that never started, ended for reason: their
// records written together (one sync), then indexed together.
func (s *Server) endUnstarted(r *rollout, jobs []*job, reason, message string) {
	ts := make([]*trajectory.Trajectory, len(jobs))
	unstarted := unstartedRecords{}
	for i, j := range jobs {
		ts[i] = unstarted.record(j.ep.rec, j.ep.task, r.backend, r.rec.Policy, reason, message)
	}
	errs := trajectory.WriteFiles(s.st.episodesDir, ts)
	ends := make([]endedEpisode, len(jobs))
	for i, j := range jobs {
		ends[i] = endedEpisode{e: j.ep, t: ts[i]}
		if errs[i] != nil {
			ends[i] = endedEpisode{e: j.ep, err: &agent.RecordError{EpisodeID: j.ep.rec.ID, Err: errs[i]}}
		}
	}
	s.recordEnds(r, ends)
}

// readEpisode reads a finished episode's record with its group statistics.
func (s *Server) readEpisode(e *episodeState, stats *trajectory.GroupStats) (*trajectory.Trajectory, error) {
	t, err := trajectory.Read(s.st.trajectoryPath(e.rec.ID))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("episode %s: its record is missing (%s)", e.rec.ID, e.rec.Reason)
		}
		return nil, err
	}
	t.Group = stats
	return t, nil
}

// loadRollout rebuilds a rollout from the store (one this process did not
// start, or that ended before a restart).
func (s *Server) loadRollout(id string) (*rollout, error) {
	rec, err := s.st.rollout(id)
	if err != nil || rec == nil {
		return nil, err
	}
	eps, err := s.st.rolloutEpisodes(id)
	if err != nil {
		return nil, err
	}
	r := newRollout(rec)
	r.backend = rec.Backend
	tasks := make([]*agent.Task, len(rec.Tasks))
	for i, b := range rec.Tasks {
		t := &agent.Task{}
		if err := json.Unmarshal(b, t); err != nil {
			return nil, fmt.Errorf("rollout %s task %d: %w", id, i, err)
		}
		tasks[i] = t
	}
	r.tasks = tasks
	sort.Slice(eps, func(i, j int) bool {
		if eps[i].TaskIndex != eps[j].TaskIndex {
			return eps[i].TaskIndex < eps[j].TaskIndex
		}
		return eps[i].GroupIndex < eps[j].GroupIndex
	})
	for _, er := range eps {
		var task *agent.Task
		if er.TaskIndex < len(tasks) {
			task = tasks[er.TaskIndex]
		}
		r.addEpisode(&episodeState{rec: er, task: task})
	}
	// An ended rollout whose index lost some ends (the disk was full when
	// they were written, and the process stopped before it could retry):
	// each is what its record says, or record_error without one.
	if rec.EndedAt != nil {
		seq := 0
		for _, e := range eps {
			seq = max(seq, e.Seq)
		}
		var fixed []*episodeRecord
		for _, e := range eps {
			if e.State == episodeDone {
				continue
			}
			seq++
			e.State, e.Seq, e.EndedAt = episodeDone, seq, rec.EndedAt
			if o, err := readOutcome(s.st.trajectoryPath(e.ID)); err == nil {
				setOutcome(e, o)
			} else {
				e.Reason, e.Message = trajectory.EndRecordError, "the index lost this episode's end and it has no readable record: "+err.Error()
			}
			fixed = append(fixed, e)
		}
		if len(fixed) > 0 {
			if err := s.st.putEnds(fixed); err != nil {
				s.log.Error("store: repairing an ended rollout's index", "rollout", id, "err", err)
			}
		}
	}
	// Replay the ends in their order.
	done := []*episodeState{}
	for _, e := range r.episodes {
		if e.rec.State == episodeDone {
			done = append(done, e)
		}
	}
	sort.SliceStable(done, func(i, j int) bool { return done[i].rec.Seq < done[j].rec.Seq })
	r.mu.Lock()
	for _, e := range done {
		r.endLocked(e)
	}
	r.mu.Unlock()
	return r, nil
}

// lookupRollout finds a rollout of tenant in memory or in the store; one
// being recovered is a 503 "recovering", another tenant's a 404.
func (s *Server) lookupRollout(id, tenant string) (*rollout, error) {
	r, err := s.findRollout(id)
	if err != nil {
		return nil, err
	}
	if !ownedBy(r.rec.Tenant, tenant) {
		return nil, notFound("rollout", id)
	}
	return r, nil
}

// findRollout finds a rollout in memory or in the store, whoever owns it.
func (s *Server) findRollout(id string) (*rollout, error) {
	s.mu.Lock()
	r, recovering := s.rollouts[id], s.recovering[id]
	s.mu.Unlock()
	if recovering {
		return nil, errRecovering()
	}
	if r != nil {
		return r, nil
	}
	r, err := s.loadRollout(id)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, notFound("rollout", id)
	}
	s.mu.Lock()
	if cur := s.rollouts[id]; cur != nil {
		r = cur
	} else {
		s.rollouts[id] = r
		defer s.forgetLater(r)
	}
	s.mu.Unlock()
	return r, nil
}
