package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// BatchConfig is one `rollbox run`.
type BatchConfig struct {
	Tasks []*agent.Task
	// Group is the number of episodes per task (a GRPO group); default 1.
	Group int
	// Concurrency bounds episodes in flight; default 4.
	Concurrency int
	// OutDir receives episodes/<episode_id>.json and summary.json.
	OutDir     string
	Backend    string
	NewSandbox agent.SandboxFactory
	Policy     agent.Policy
	PolicyInfo trajectory.Policy
	Sampling   agent.Sampling
	// RolloutID defaults to a fresh id.
	RolloutID string
	// OnEpisode, if set, is called as each episode ends (progress).
	OnEpisode func(t *trajectory.Trajectory, done, total int)
	// OnStep, if set, sees every recorded step (metrics, live summary).
	OnStep func(trajectory.Step)
	// ConfigureEpisode, if set, may adjust each episode's config (extra tools).
	ConfigureEpisode func(cfg *agent.Config) error
	// Judges bounds and caches the judge rewards' requests (nil: a pool of
	// the batch's own, in memory).
	Judges *judge.Pool
	// SubagentPolicy resolves an orchestrator task's sub-agent policy
	// (agent.Subagents.Policy); orchestrator tasks need it.
	SubagentPolicy func(t *agent.Task) (agent.Policy, trajectory.Policy, error)
	// TrainStep is the trainer's step (a parl reward anneals by it).
	TrainStep int64
	// InfraAttempts bounds the attempts of an episode whose sandbox failed
	// for the infrastructure's sake before the policy was asked anything
	// (default 3, as the service); the failed attempts' records go to
	// OutDir/attempts/.
	InfraAttempts int
	// Resume, if set, is what an earlier process of this batch (same
	// RolloutID, Tasks, Group and OutDir) recorded (RecoverBatch): those
	// episodes are counted, not run again.
	Resume *BatchRecord
}

// Summary is summary.json.
type Summary struct {
	Schema    string `json:"schema"`
	RolloutID string `json:"rollout_id"`
	// Planned is the episodes the run was to run (tasks × group) and
	// Started those that began (rollbox run); Episodes those recorded.
	Planned  int `json:"planned,omitempty"`
	Started  int `json:"started,omitempty"`
	Episodes int `json:"episodes"`
	// Interrupted is set when the run stopped (SIGINT, SIGTERM: its
	// context was cancelled) before every planned episode ended.
	Interrupted bool `json:"interrupted,omitempty"`
	// Message says what stopped an interrupted run ("interrupted by
	// SIGINT").
	Message string `json:"message,omitempty"`
	Scored  int    `json:"scored"`
	// RewardMean and PassRate are over the scored episodes: null when none
	// was scored (every one ended policy_error, sandbox_error, ...), never
	// a 0 that reads as the model's. A pass is Reward.Passed: the task's
	// outcome reached 1 (for parl, r_perf, not the shaped total).
	RewardMean *float64                `json:"reward_mean"`
	PassRate   *float64                `json:"pass_rate"`
	Tasks      map[string]*TaskSummary `json:"tasks"`
	Ends       map[string]int          `json:"ends"`
	ToolErrors map[string]int          `json:"tool_errors"`
	// Truncated counts the tool steps whose output the model did not see
	// whole, whatever their error kind (a nonzero_exit step that was cut
	// counts in both).
	Truncated trajectory.Truncations `json:"truncated"`
	Groups    []GroupSummary         `json:"groups"`
	// InfraRetries counts episode attempts restarted after an
	// infrastructure failure before the policy saw anything (the service).
	InfraRetries int `json:"infra_retries,omitempty"`
	// Unrecorded lists the episodes that ended without a readable record
	// (record_error: the disk was full); they count in episodes and ends,
	// unscored, and exports leave them out (the service).
	Unrecorded []string `json:"unrecorded,omitempty"`
	// PolicyVersions counts model turns by the policy version that
	// produced them (the version mix; absent when no turn had one).
	PolicyVersions map[string]int `json:"policy_versions,omitempty"`
	// Monitors counts, per reward-hacking monitor, the episodes that
	// triggered it (a count above 0 or a flag set; agent/monitor).
	Monitors map[string]int `json:"monitors"`
	// Judge totals the judge rewards (absent when no episode had one).
	Judge *JudgeSummary `json:"judge,omitempty"`
	// Parl totals the orchestrator episodes (absent when there was none).
	Parl      *ParlSummary `json:"parl,omitempty"`
	WallTimeS float64      `json:"wall_time_s"`
	StartedAt time.Time    `json:"started_at"`
}

// TaskSummary is one task's line of the summary; its means are null when
// none of its episodes was scored.
type TaskSummary struct {
	Episodes   int            `json:"episodes"`
	Scored     int            `json:"scored"`
	RewardMean *float64       `json:"reward_mean"`
	PassRate   *float64       `json:"pass_rate"`
	Monitors   map[string]int `json:"monitors,omitempty"`
}

// JudgeSummary totals the judge rewards of a run.
type JudgeSummary struct {
	// Episodes had a judge reward; Unscored of them are unscored
	// (judge_error).
	Episodes int `json:"episodes"`
	Unscored int `json:"unscored"`
	// Requests counts the answers asked of judges (samples), CacheHits
	// those the cache answered; Tokens the tokens the judges reported.
	Requests  int   `json:"requests"`
	CacheHits int   `json:"cache_hits"`
	Tokens    int64 `json:"tokens"`
	// MeanMS and MaxMS are the time spent judging an episode.
	MeanMS float64 `json:"mean_ms"`
	MaxMS  float64 `json:"max_ms"`
}

// ParlSummary totals a run's orchestrator episodes (PARL).
type ParlSummary struct {
	// Episodes are the orchestrator episodes; Subagents the sub-agents
	// they spawned.
	Episodes  int `json:"episodes"`
	Subagents int `json:"subagents"`
	// SerialCollapseRate is the fraction of the episodes that spawned at
	// most one sub-agent.
	SerialCollapseRate float64 `json:"serial_collapse_rate"`
	// SpuriousParallelismRate is the fraction of the sub-agents that ended
	// without useful output (not finished with a non-empty answer); null
	// when none was spawned.
	SpuriousParallelismRate *float64 `json:"spurious_parallelism_rate"`
	// CriticalStepsMean and TotalStepsMean are the episodes' means of
	// stats.critical_steps and stats.total_steps.
	CriticalStepsMean float64 `json:"critical_steps_mean"`
	TotalStepsMean    float64 `json:"total_steps_mean"`
}

// summarizeParl totals the orchestrator episodes of ts (nil: none).
func summarizeParl(ts []*trajectory.Trajectory) *ParlSummary {
	var p ParlSummary
	var collapsed, spurious, crit, total int
	for _, t := range ts {
		if t.Stats.CriticalSteps == nil {
			continue
		}
		p.Episodes++
		crit += *t.Stats.CriticalSteps
		if t.Stats.TotalSteps != nil {
			total += *t.Stats.TotalSteps
		}
		if len(t.Subagents) <= 1 {
			collapsed++
		}
		for _, sa := range t.Subagents {
			p.Subagents++
			if !sa.Finished {
				spurious++
			}
		}
	}
	if p.Episodes == 0 {
		return nil
	}
	n := float64(p.Episodes)
	p.SerialCollapseRate = float64(collapsed) / n
	p.SpuriousParallelismRate = mean(float64(spurious), p.Subagents)
	p.CriticalStepsMean, p.TotalStepsMean = float64(crit)/n, float64(total)/n
	return &p
}

// GroupSummary has a group's GRPO statistics.
type GroupSummary struct {
	GroupID      string    `json:"group_id"`
	TaskID       string    `json:"task_id"`
	RewardMean   float64   `json:"reward_mean"`
	RewardStd    float64   `json:"reward_std"`
	ZeroVariance bool      `json:"zero_variance"`
	Advantages   []float64 `json:"advantages"`
	// Unscored counts episodes that ended for infrastructure reasons and are
	// left out of the statistics.
	Unscored int `json:"unscored"`
	// Monitors counts, per monitor, the group's episodes that triggered it.
	Monitors map[string]int `json:"monitors,omitempty"`
}

// NewID returns a short random id with a prefix.
func NewID(prefix string) string {
	var b [6]byte
	rand.Read(b[:])
	return prefix + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

// RunBatch runs every task × group and writes the trajectories and the
// summary. Each episode runs as the service runs one (agent.Run, the same
// retry of a failed open). It returns an error when records could not be
// written (those episodes end record_error, counted in the summary, which
// is written all the same) or when ctx ended before every episode started.
func RunBatch(ctx context.Context, cfg BatchConfig) (*Summary, error) {
	if cfg.Group <= 0 {
		cfg.Group = 1
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.InfraAttempts <= 0 {
		cfg.InfraAttempts = 3
	}
	if cfg.RolloutID == "" {
		cfg.RolloutID = NewID("r")
	}
	if cfg.Judges == nil {
		cfg.Judges = judge.NewPool(judge.Options{})
	}
	dir := filepath.Join(cfg.OutDir, "episodes")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	start := time.Now()
	type job struct {
		plan   *plan
		index  int
		prefix *agent.PrefixGroup
	}
	total := len(cfg.Tasks) * cfg.Group
	jobs := make(chan job)
	results := make([]*trajectory.Trajectory, 0, total)
	var mu sync.Mutex
	var errs []error
	var retries, started int
	var wg sync.WaitGroup
	// Sub-agents run within the same bound as the episodes (Concurrency).
	slots := newSlotPool(cfg.Concurrency)
	for range min(cfg.Concurrency, total) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				mu.Lock()
				started++
				mu.Unlock()
				ecfg := j.plan.config(cfg.RolloutID, j.index, dir)
				ecfg.NewSandbox, ecfg.Policy, ecfg.PolicyInfo, ecfg.Sampling, ecfg.Observe, ecfg.Judges, ecfg.Prefix =
					cfg.NewSandbox, cfg.Policy, cfg.PolicyInfo, cfg.Sampling, cfg.OnStep, cfg.Judges, j.prefix
				ecfg.TrainStep = cfg.TrainStep
				if j.plan.task.Orchestrator != nil {
					ecfg.Subagents = &agent.Subagents{Policy: cfg.SubagentPolicy, Slots: subagentSlots{slots}}
				}
				ecfg.Retry = openRetry(cfg.InfraAttempts, filepath.Join(cfg.OutDir, "attempts"), nil, ecfg.EpisodeID, func(*agent.OpenError) {
					mu.Lock()
					retries++
					mu.Unlock()
				})
				var t *trajectory.Trajectory
				err := func() error {
					if cfg.ConfigureEpisode != nil {
						if err := cfg.ConfigureEpisode(&ecfg); err != nil {
							return err
						}
					}
					// A run interrupted meanwhile still records the
					// episode (it ends interrupted at once).
					if err := slots.acquire(ctx, false); err == nil {
						defer slots.release()
					}
					var err error
					t, err = agent.Run(ctx, ecfg)
					return err
				}()
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("episode %s: %w", ecfg.EpisodeID, err))
				}
				if t != nil {
					results = append(results, t)
				}
				done := len(results)
				mu.Unlock()
				if t != nil && cfg.OnEpisode != nil {
					cfg.OnEpisode(t, done, total)
				}
			}
		}()
	}
	// A task with a prefix runs it once per group; its episodes fork from it.
	var prefixes []*agent.PrefixGroup
feed:
	for _, t := range cfg.Tasks {
		p := newPlan(t, cfg.Backend, nil)
		var todo []int
		for g := range cfg.Group {
			if r := cfg.Resume.recorded(episodeID(cfg.RolloutID, t.ID, g)); r != nil {
				mu.Lock()
				results = append(results, r)
				started++
				mu.Unlock()
				continue
			}
			todo = append(todo, g)
		}
		var pg *agent.PrefixGroup
		if t.Prefix != nil && len(todo) > 0 {
			pg = &agent.PrefixGroup{Name: groupID(cfg.RolloutID, t.ID), Size: len(todo), Dir: filepath.Join(cfg.OutDir, "prefixes")}
			if cfg.Resume != nil {
				pg.Ran = cfg.Resume.PrefixRuns[pg.Name]
			}
			prefixes = append(prefixes, pg)
		}
		for _, g := range todo {
			select {
			case jobs <- job{p, g, pg}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	for _, pg := range prefixes {
		if err := pg.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	sum := Summarize(cfg.RolloutID, results)
	sum.StartedAt = start.UTC()
	sum.WallTimeS = time.Since(start).Seconds()
	sum.InfraRetries = retries
	sum.Planned, sum.Started = total, started
	if ctx.Err() != nil && (started < total || sum.Ends[trajectory.EndInterrupted]+sum.Ends[trajectory.EndCancelled] > 0) {
		sum.Interrupted, sum.Message = true, context.Cause(ctx).Error()
		var sc *agent.StopCause
		if errors.As(context.Cause(ctx), &sc) {
			sum.Message = sc.Message
		}
	}
	if err := writeJSON(filepath.Join(cfg.OutDir, "summary.json"), sum); err != nil {
		errs = append(errs, err)
	}
	if sum.Interrupted {
		errs = append(errs, fmt.Errorf("%s with %d of %d episodes started: %w", sum.Message, started, total, ctx.Err()))
	}
	if len(errs) > 3 {
		errs = append(errs[:3], fmt.Errorf("and %d more", len(errs)-3))
	}
	return sum, errors.Join(errs...)
}

// Summarize computes a summary over trajectories.
func Summarize(rolloutID string, ts []*trajectory.Trajectory) *Summary {
	s := &Summary{Schema: "rollbox.summary/v1", RolloutID: rolloutID, Tasks: map[string]*TaskSummary{},
		Ends: map[string]int{}, ToolErrors: map[string]int{}, Truncated: trajectory.Truncations{Tools: map[string]int{}},
		Groups: []GroupSummary{}, Monitors: map[string]int{}}
	var judged JudgeSummary
	var judgeMS float64
	type sums struct{ reward, pass float64 }
	var all sums
	perTask := map[string]*sums{}
	groups := map[string][]*trajectory.Trajectory{}
	for _, t := range ts {
		s.Episodes++
		ts := s.Tasks[t.TaskID]
		if ts == nil {
			ts = &TaskSummary{}
			s.Tasks[t.TaskID] = ts
			perTask[t.TaskID] = &sums{}
		}
		ts.Episodes++
		if t.Termination != nil {
			s.Ends[t.Termination.Reason]++
		}
		for k, v := range t.Stats.ToolErrors {
			s.ToolErrors[k] += v
		}
		s.Truncated.Add(t.Stats.Truncated)
		for v, n := range t.Stats.PolicyVersions {
			if s.PolicyVersions == nil {
				s.PolicyVersions = map[string]int{}
			}
			s.PolicyVersions[v] += n
		}
		for _, name := range t.Monitors.Triggered() {
			s.Monitors[name]++
			if ts.Monitors == nil {
				ts.Monitors = map[string]int{}
			}
			ts.Monitors[name]++
		}
		if t.Reward != nil && t.Reward.Judge != nil {
			j := t.Reward.Judge
			judged.Episodes++
			if t.Reward.Total == nil {
				judged.Unscored++
			}
			judged.Requests += j.Calls
			judged.CacheHits += j.CacheHits
			for _, js := range j.Judges {
				for _, rs := range js.Rubrics {
					for _, smp := range rs.Samples {
						if smp.Usage != nil && !smp.Cached {
							judged.Tokens += smp.Usage.TotalTokens
						}
					}
				}
			}
			judgeMS += j.DurationMS
			judged.MaxMS = max(judged.MaxMS, j.DurationMS)
		}
		if v, ok := t.Value(); ok {
			s.Scored++
			ts.Scored++
			all.reward += v
			perTask[t.TaskID].reward += v
			if t.Reward.Passed() {
				all.pass++
				perTask[t.TaskID].pass++
			}
		}
		groups[t.GroupID] = append(groups[t.GroupID], t)
	}
	s.RewardMean, s.PassRate = mean(all.reward, s.Scored), mean(all.pass, s.Scored)
	if judged.Episodes > 0 {
		judged.MeanMS = judgeMS / float64(judged.Episodes)
		s.Judge = &judged
	}
	s.Parl = summarizeParl(ts)
	for id, ts := range s.Tasks {
		ts.RewardMean, ts.PassRate = mean(perTask[id].reward, ts.Scored), mean(perTask[id].pass, ts.Scored)
	}
	ids := make([]string, 0, len(groups))
	for id := range groups {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		g := groups[id]
		sort.Slice(g, func(i, j int) bool { return g[i].GroupIndex < g[j].GroupIndex })
		st := GroupStatistics(g)
		gs := GroupSummary{GroupID: id, TaskID: g[0].TaskID, RewardMean: st.RewardMean, RewardStd: st.RewardStd, ZeroVariance: st.ZeroVariance, Monitors: st.Monitors}
		for _, t := range g {
			if v, ok := t.Value(); ok {
				gs.Advantages = append(gs.Advantages, v-st.RewardMean)
			} else {
				gs.Unscored++
				gs.Advantages = append(gs.Advantages, 0)
			}
		}
		s.Groups = append(s.Groups, gs)
	}
	return s
}

// mean is sum/n, or nil when n is 0.
func mean(sum float64, n int) *float64 {
	if n == 0 {
		return nil
	}
	m := sum / float64(n)
	return &m
}

// GroupStats are a group's GRPO statistics over its scored episodes:
// the advantage of an episode is its reward minus the group mean (no
// division by the std, as Dr. GRPO and CISPO-style trainers use), and a
// group whose rewards are all equal is flagged zero-variance (it carries no
// learning signal and a trainer may drop it).
type GroupStats struct {
	RewardMean   float64
	RewardStd    float64
	ZeroVariance bool
	Scored       int
	// Monitors counts, per monitor, the episodes that triggered it (nil
	// when none did).
	Monitors map[string]int
}

// GroupStatistics computes GroupStats; unscored (infrastructure-ended)
// episodes are left out.
func GroupStatistics(g []*trajectory.Trajectory) GroupStats {
	var st GroupStats
	var rs []float64
	for _, t := range g {
		if v, ok := t.Value(); ok {
			rs = append(rs, v)
		}
		for _, name := range t.Monitors.Triggered() {
			if st.Monitors == nil {
				st.Monitors = map[string]int{}
			}
			st.Monitors[name]++
		}
	}
	st.Scored = len(rs)
	if len(rs) == 0 {
		st.ZeroVariance = true
		return st
	}
	for _, r := range rs {
		st.RewardMean += r
	}
	st.RewardMean /= float64(len(rs))
	for _, r := range rs {
		st.RewardStd += (r - st.RewardMean) * (r - st.RewardMean)
	}
	st.RewardStd = math.Sqrt(st.RewardStd / float64(len(rs)))
	st.ZeroVariance = st.RewardStd < 1e-12
	return st
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
