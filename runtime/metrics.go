package runtime

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/proc"
)

// Metrics are the service's Prometheus collectors. They are registered on
// the registry given to NewMetrics (no package globals), so tests and the
// binary each own theirs.
type Metrics struct {
	Episodes        *prometheus.GaugeVec   // state: queued, running, env
	EpisodesEnded   *prometheus.CounterVec // mode, reason
	Turns           prometheus.Counter
	ToolCalls       *prometheus.CounterVec   // tool, backend
	ToolDuration    *prometheus.HistogramVec // tool, backend
	ToolErrors      *prometheus.CounterVec   // tool, kind
	PolicyDuration  *prometheus.HistogramVec // endpoint
	PolicyWait      *prometheus.HistogramVec // endpoint
	PolicyInflight  *prometheus.GaugeVec     // endpoint
	PolicyErrors    *prometheus.CounterVec   // endpoint
	SandboxAcquire  *prometheus.HistogramVec // backend, source (pool, create)
	SandboxFailures *prometheus.CounterVec   // backend
	InfraRetries    *prometheus.CounterVec   // backend
	Rejected        *prometheus.CounterVec   // what: rollout, episode
	Rollouts        *prometheus.CounterVec   // state reached: submitted, done, cancelled, interrupted
	HTTPRequests    *prometheus.CounterVec   // route, code
	Recovered       prometheus.Counter
	Monitors        *prometheus.CounterVec   // monitor
	Unscored        *prometheus.CounterVec   // kind (reward error kind)
	JudgeRequests   *prometheus.CounterVec   // endpoint, outcome
	JudgeDuration   *prometheus.HistogramVec // endpoint
	JudgeWait       *prometheus.HistogramVec // endpoint
	MemoryReclaims  prometheus.Counter
	Imported        prometheus.Counter
	ImportedBytes   prometheus.Counter
	ImportsRefused  prometheus.Counter
	OutcomesScored  prometheus.Counter
}

// latencyBuckets span 100 µs to ~100 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 16)

// NewMetrics makes the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Episodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rollbox_episodes",
			Help: "Episodes by state: queued (admitted, not started), running (rollout mode), env (environment mode, open)."}, []string{"state"}),
		EpisodesEnded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_episodes_ended_total",
			Help: "Episodes that ended, by mode (rollout, env) and termination reason."}, []string{"mode", "reason"}),
		Turns: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_turns_total", Help: "Model turns recorded."}),
		ToolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_tool_calls_total",
			Help: "Tool calls, by tool and sandbox backend."}, []string{"tool", "backend"}),
		ToolDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rollbox_tool_duration_seconds",
			Help: "Wall time of one tool call, by tool and sandbox backend.", Buckets: latencyBuckets}, []string{"tool", "backend"}),
		ToolErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_tool_errors_total",
			Help: "Tool calls that failed, by tool and error kind (the trajectory's closed list)."}, []string{"tool", "kind"}),
		PolicyDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rollbox_policy_request_duration_seconds",
			Help: "Wall time of one policy call (retries included), by endpoint.", Buckets: latencyBuckets}, []string{"endpoint"}),
		PolicyWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rollbox_policy_wait_seconds",
			Help: "Time an episode waited for one of the endpoint's concurrency slots.", Buckets: latencyBuckets}, []string{"endpoint"}),
		PolicyInflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rollbox_policy_inflight",
			Help: "Policy calls in flight, by endpoint."}, []string{"endpoint"}),
		PolicyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_policy_errors_total",
			Help: "Policy calls that failed after the client's retries, by endpoint."}, []string{"endpoint"}),
		SandboxAcquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rollbox_sandbox_acquire_seconds",
			Help: "Time to get a ready sandbox, by backend and source (pool: a warm pool was consulted; create: created on demand).", Buckets: latencyBuckets}, []string{"backend", "source"}),
		SandboxFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_sandbox_create_failures_total",
			Help: "Sandbox creations that failed, by backend."}, []string{"backend"}),
		InfraRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_infra_retries_total",
			Help: "Episodes restarted after an infrastructure failure before the policy was asked anything, by backend."}, []string{"backend"}),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_admission_rejected_total",
			Help: "Requests refused with 429 because the service was full, by kind (rollout, episode)."}, []string{"kind"}),
		Rollouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_rollouts_total",
			Help: "Rollouts submitted and ended, by state reached."}, []string{"state"}),
		HTTPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_http_requests_total",
			Help: "HTTP requests served, by route pattern and status code."}, []string{"route", "code"}),
		Recovered: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_recovered_episodes_total",
			Help: "Episodes found in flight at start-up and marked interrupted."}),
		Monitors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_monitor_episodes_total",
			Help: "Episodes that triggered a reward-hacking monitor (a count above 0 or a flag set), by monitor."}, []string{"monitor"}),
		Unscored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_rewards_unscored_total",
			Help: "Episodes that ended for the model's reasons whose reward could not be computed (null total), by error kind (judge_error)."}, []string{"kind"}),
		JudgeRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_judge_requests_total",
			Help: "Judge requests by endpoint and outcome: ok, cached (answered from the cache, no request), retry (a failed attempt retried), error (failed after the retries)."}, []string{"endpoint", "outcome"}),
		JudgeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rollbox_judge_request_duration_seconds",
			Help: "Wall time of one judge request that answered, by endpoint.", Buckets: latencyBuckets}, []string{"endpoint"}),
		JudgeWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rollbox_judge_wait_seconds",
			Help: "Time a judge request waited for one of its endpoint's slots.", Buckets: latencyBuckets}, []string{"endpoint"}),
		MemoryReclaims: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_memory_reclaims_total",
			Help: "Times the idle service closed its idle policy connections and returned its free memory to the system."}),
		Imported: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_imported_episodes_total",
			Help: "Episodes stored by POST /v1/imports (duplicates and refused lines not counted)."}),
		ImportedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_import_bytes_total",
			Help: "Bytes of NDJSON read by imports that completed."}),
		ImportsRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_imports_refused_total",
			Help: "Imports refused with 429 because --max-imports were running."}),
		OutcomesScored: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_outcomes_scored_total",
			Help: "Imported episodes scored when their outcome window closed."}),
	}
	reg.MustRegister(m.Episodes, m.EpisodesEnded, m.Turns, m.ToolCalls, m.ToolDuration, m.ToolErrors,
		m.PolicyDuration, m.PolicyWait, m.PolicyInflight, m.PolicyErrors, m.SandboxAcquire, m.SandboxFailures,
		m.InfraRetries, m.Rejected, m.Rollouts, m.HTTPRequests, m.Recovered,
		m.Monitors, m.Unscored, m.JudgeRequests, m.JudgeDuration, m.JudgeWait, m.MemoryReclaims,
		m.Imported, m.ImportedBytes, m.ImportsRefused, m.OutcomesScored,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rollbox_process_peak_rss_bytes",
			Help: "Peak resident set size of this process (VmHWM)."}, func() float64 { return float64(PeakRSS()) }))
	return m
}

// observer returns the agent.Config.Observe hook of one episode.
func (m *Metrics) observer(backend string) func(trajectory.Step) {
	return func(s trajectory.Step) {
		if s.Type == trajectory.StepModel {
			m.Turns.Inc()
			return
		}
		m.ToolCalls.WithLabelValues(s.Name, backend).Inc()
		m.ToolDuration.WithLabelValues(s.Name, backend).Observe(s.DurationMS / 1000)
		if s.ErrorKind != nil {
			m.ToolErrors.WithLabelValues(s.Name, *s.ErrorKind).Inc()
		}
	}
}

// episodeEnded counts an ended episode's monitors and an unscored reward.
func (m *Metrics) episodeEnded(t *trajectory.Trajectory) {
	if t == nil {
		return
	}
	for _, name := range t.Monitors.Triggered() {
		m.Monitors.WithLabelValues(name).Inc()
	}
	if t.Reward != nil && t.Reward.ErrorKind != "" {
		m.Unscored.WithLabelValues(t.Reward.ErrorKind).Inc()
	}
}

// judgeObserver is the judge pool's Observe hook.
func (m *Metrics) judgeObserver() func(judge.Event) {
	return func(e judge.Event) {
		m.JudgeRequests.WithLabelValues(e.BaseURL, e.Outcome).Inc()
		if e.Outcome == "ok" {
			m.JudgeDuration.WithLabelValues(e.BaseURL).Observe(e.Latency.Seconds())
			m.JudgeWait.WithLabelValues(e.BaseURL).Observe(e.Wait.Seconds())
		}
	}
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// PeakRSS is this process's peak resident set size in bytes (VmHWM from
// /proc/self/status), or 0 where that is not available.
func PeakRSS() int64 { return proc.PeakRSS("self") }
