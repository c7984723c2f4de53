package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cpugate"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// SandboxFactory makes the episode's sandbox for a spec on a backend.
type SandboxFactory func(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error)

// Config is one episode.
type Config struct {
	Task       *Task
	EpisodeID  string
	RolloutID  string
	GroupID    string
	GroupIndex int
	Seed       int64
	// Dir receives the trajectory (<episode_id>.json).
	Dir string
	// Backend is used when the task names none.
	Backend    string
	NewSandbox SandboxFactory
	// Policy is the decider for Run; PolicyInfo describes it.
	Policy     Policy
	PolicyInfo trajectory.Policy
	Sampling   Sampling
	// Retry, if set, retries an open that failed for the infrastructure's
	// sake (see OpenError.Infra).
	Retry Retry
	// OnOpen, if set, is called by Run with the session once it is open,
	// before the policy is asked anything (the service keeps it to cancel).
	OnOpen func(*Session)
	// ExtraTools add to the builtins (search, read, prune).
	ExtraTools map[string]tools.Tool
	// ToolEnv, if set, is called to add to each episode's tool Env (the
	// retriever's ledger).
	ToolEnv func(env *tools.Env) error
	// Observe, if set, sees every step as it is recorded (metrics).
	Observe func(trajectory.Step)
	// ReplayOf, set by replay, names the episode this one replays.
	ReplayOf *trajectory.ReplayOf
	// Judges bounds and caches the requests of judge rewards, shared by
	// the episodes of a process (nil: the episode's own, uncached).
	Judges *judge.Pool
	// Pinned, if set, is pinned instead of fresh values (seed, episode id,
	// hostname, env; see PinnedEnv): replay passes a trajectory's own.
	Pinned map[string]string
	// Prefix, if set, runs the task's prefix once for the episode's group
	// and opens the episode in a fork of it (see PrefixGroup); ignored
	// for a task without one.
	Prefix *PrefixGroup
	// BeforeCall, if set, is asked before each tool call runs; false stops
	// the turn there and leaves the episode open (replay stops at a step).
	BeforeCall func(call ToolCall) bool
	// Subagents runs the sub-agents of an orchestrator task (a task with
	// "orchestrator"); such a task does not open without it.
	Subagents *Subagents
	// Parent is set on a sub-episode (by its orchestrator): it is recorded
	// and the episode is not rewarded.
	Parent *trajectory.Parent
	// TrainStep is the trainer's step the rollout was asked at: a parl
	// reward anneals its auxiliary weights by it.
	TrainStep int64
	// Journal, if set, is given every line of the episode's journal as it
	// is written (trajectory.NewWriterTee): a cluster worker streams it to
	// its coordinator. Its error is the record's.
	Journal func(line []byte) error
	// CPU, if set, bounds the episodes doing CPU-bound work at once
	// (internal/cpugate): Drive holds a turn while it steps the episode
	// and gives it back while it waits (the policy's answer, a tool call,
	// the disk), so that episodes woken by the thousand wait parked in the
	// gate's queue rather than in Go's run queues, where a /healthz probe
	// would wait behind them. Time waited for a turn is counted in no tool
	// call's or policy call's duration.
	CPU *cpugate.Gate
}

// backend is the episode's sandbox backend: the task's, else the config's.
func (cfg *Config) backend() string {
	if b := cfg.Task.Sandbox.Backend; b != "" {
		return b
	}
	return cfg.Backend
}

// Stages of opening an episode, as an OpenError names them.
const (
	// StageCreate: the sandbox could not be made.
	StageCreate = "create"
	// StageSeed: the task's files could not be read or written into the sandbox.
	StageSeed = "seed"
	// StageAttach: the tools could not be attached to the episode (the tool
	// set, a tool's environment such as a search index).
	StageAttach = "attach"
	// StagePrefix: the task's prefix could not be run or forked for the
	// episode (Config.Prefix).
	StagePrefix = "prefix"
)

// OpenError says why an episode could not open: which stage failed, and
// whether the infrastructure failed (a retry may pass) or the task did.
// The episode has ended sandbox_error (or cancelled, episode_timeout when
// the context ended first) with its record written, and nothing of it is
// left open.
type OpenError struct {
	Stage string
	Err   error
}

func (e *OpenError) Error() string {
	switch e.Stage {
	case StageCreate:
		return "create sandbox: " + e.Err.Error()
	case StageSeed:
		return "seed files: " + e.Err.Error()
	case StagePrefix:
		return "run the prefix: " + e.Err.Error()
	}
	return "attach tools: " + e.Err.Error()
}

func (e *OpenError) Unwrap() error { return e.Err }

// Infra reports whether the stage failed for the infrastructure's sake: a
// sandbox or an engine that failed, a sandbox closed under the open. Not
// when the task is at fault (an invalid spec, a missing image, files that
// do not fit, a tool set that does not resolve), nor when the context ended:
// those fail again.
func (e *OpenError) Infra() bool {
	err := e.Err
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, errEpisodeTimeout),
		errors.Is(err, sandbox.ErrInvalidSpec), errors.Is(err, sandbox.ErrImageNotFound), sandbox.IsAbuse(err):
		return false
	}
	return errors.Is(err, sandbox.ErrSandboxFailed) || errors.Is(err, sandbox.ErrEngineUnavailable) || errors.Is(err, sandbox.ErrClosed)
}

// Retry is how Open retries an episode whose open failed for the
// infrastructure's sake (OpenError.Infra) before the policy saw anything.
// The zero value makes one attempt.
type Retry struct {
	// Attempts bounds the attempts (0 or 1: no retry).
	Attempts int
	// Dir receives each failed attempt's record as <episode_id>.<n>.json, so
	// the episode's own record is its last attempt's. Required with Attempts > 1.
	Dir string
	// Backoff is the pause before attempt n+1 (default n × 200 ms). A
	// context that ends during it ends the retries at once.
	Backoff func(attempt int) time.Duration
	// OnRetry, if set, is told of each failed attempt that is retried
	// (metrics, logs).
	OnRetry func(attempt int, err *OpenError)
}

func (r Retry) backoff(attempt int) time.Duration {
	if r.Backoff != nil {
		return r.Backoff(attempt)
	}
	return time.Duration(attempt) * 200 * time.Millisecond
}

// Open starts an episode: it records the header, creates the sandbox, seeds
// the task's files and attaches the tools, retrying as cfg.Retry says.
//
// # Errors
//
// An *OpenError when the episode could not open: the session returned has
// ended (its record written, its sandbox closed). A *RecordError when the
// record could not be written: the session, if any, has ended record_error
// and nothing of it is left open. Either way the caller owns nothing.
func Open(ctx context.Context, cfg Config) (*Session, error) {
	for attempt := 1; ; attempt++ {
		s, err := open(ctx, cfg)
		var oe *OpenError
		if !errors.As(err, &oe) || !oe.Infra() || attempt >= cfg.Retry.Attempts {
			return s, err
		}
		t := time.NewTimer(cfg.Retry.backoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return s, err // the failed attempt is the episode's record
		case <-t.C:
		}
		if err := keepAttempt(cfg, attempt); err != nil {
			return s, &RecordError{EpisodeID: cfg.EpisodeID, Err: err}
		}
		if cfg.Retry.OnRetry != nil {
			cfg.Retry.OnRetry(attempt, oe)
		}
	}
}

// keepAttempt moves a failed attempt's record out of the episodes directory
// (it is not the episode's record), numbered.
func keepAttempt(cfg Config, attempt int) error {
	if cfg.Retry.Dir == "" {
		return errors.New("agent: Retry.Dir is required to retry an open")
	}
	if err := os.MkdirAll(cfg.Retry.Dir, 0o755); err != nil {
		return err
	}
	return os.Rename(filepath.Join(cfg.Dir, cfg.EpisodeID+".json"), filepath.Join(cfg.Retry.Dir, fmt.Sprintf("%s.%d.json", cfg.EpisodeID, attempt)))
}

// open is one attempt of Open.
func open(ctx context.Context, cfg Config) (_ *Session, err error) {
	t := cfg.Task
	var prefixErr error
	if cfg.Prefix != nil && t.Prefix != nil {
		s, err := cfg.Prefix.branch(ctx, cfg)
		var re *RecordError
		switch {
		case err == nil:
			return s, nil
		case errors.As(err, &re):
			return nil, err
		}
		prefixErr = err // recorded below, as the episode's end
	}
	taskJSON, _ := json.Marshal(t)
	if t.Seed != nil && cfg.Sampling.Seed == nil {
		cfg.Sampling.Seed = t.Seed
	}
	samplingJSON, _ := json.Marshal(cfg.Sampling)
	pi := cfg.PolicyInfo
	pi.Sampling = samplingJSON
	pinned := maps.Clone(cfg.Pinned)
	if pinned == nil {
		pinned = Pins(t, cfg.Seed, cfg.EpisodeID)
	}
	s := &Session{cfg: cfg, task: t, start: time.Now()}
	s.tok = tokenState{on: pi.Mode == trajectory.ModeTokens, segment: -1, restart: trajectory.SegmentStart}
	s.deadline = s.start.Add(time.Duration(t.Limits.EpisodeTimeoutS * float64(time.Second)))
	s.stats.ToolErrors = map[string]int{}
	rec := &trajectory.Trajectory{
		EpisodeID: cfg.EpisodeID, RolloutID: cfg.RolloutID, GroupID: cfg.GroupID, GroupIndex: cfg.GroupIndex,
		TaskID: t.ID, TaskHash: t.Hash(), Seed: cfg.Seed, Task: taskJSON, TaskDir: t.Dir(), ReplayOf: cfg.ReplayOf, Parent: cfg.Parent, TrainStep: cfg.TrainStep, StartedAt: s.start.UTC(),
		Sandbox: trajectory.Sandbox{Backend: cfg.backend()},
		Policy:  pi,
		Pinned:  pinned,
	}
	w, err := trajectory.NewWriterTee(cfg.Dir, rec, cfg.Journal)
	if err != nil {
		return nil, &RecordError{EpisodeID: cfg.EpisodeID, Err: err}
	}
	s.w = w
	// Whatever ends the open early ends the episode: nothing stays open.
	defer func() {
		if err != nil && !s.ended {
			err = s.failRecord(err)
		}
	}()
	if prefixErr != nil {
		return s, s.openFailed(ctx, StagePrefix, prefixErr)
	}
	extra := cfg.ExtraTools
	if t.Orchestrator != nil {
		if err := s.openOrchestration(ctx); err != nil {
			return s, s.openFailed(ctx, StageAttach, err)
		}
		extra = maps.Clone(extra)
		if extra == nil {
			extra = map[string]tools.Tool{}
		}
		extra[NameSpawnSubagents] = spawnTool{s}
		if s.orch.async != nil {
			extra[NameWait], extra[NameCollect] = waitTool{s}, collectTool{s}
		}
	}
	reg, err := tools.Select(t.Tools, extra)
	if err != nil { // validated at load; a tool set that changed since is the task's error
		return s, s.openFailed(ctx, StageAttach, err)
	}
	s.reg = reg
	for _, sc := range reg.Schemas() {
		s.schemas = append(s.schemas, ToolSchema{Name: sc.Name, Description: sc.Description, Parameters: sc.Parameters})
	}
	spec := EpisodeSpec(t, pinned)
	spec.Labels = sandbox.EpisodeLabels(cfg.EpisodeID, cfg.RolloutID)
	s.backend, s.spec = cfg.backend(), spec
	sctx, cancel := context.WithDeadline(ctx, s.deadline)
	defer cancel()
	sb, err := cfg.NewSandbox(sctx, cfg.backend(), spec)
	if err != nil {
		return s, s.openFailed(ctx, StageCreate, err)
	}
	s.sb = sb
	info := sb.Info()
	limits, _ := json.Marshal(info.Limits)
	if err := w.SetSandbox(trajectory.Sandbox{
		Backend: info.Backend, ID: info.ID, Image: info.Image, ImageDigest: info.ImageDigest, Runtime: info.Runtime,
		Network: info.Network, Workdir: info.Workdir, Limits: limits, Loosened: spec.Loosened(),
	}); err != nil {
		return s, err
	}
	files, err := t.SeedFiles(info.Workdir)
	if err != nil {
		return s, s.openFailed(ctx, StageSeed, err)
	}
	s.taskFiles = make(map[string][]byte, len(files))
	for _, f := range files {
		s.taskFiles[f.Path] = f.Data
	}
	if err := sandbox.Seed(sctx, sb, files); err != nil {
		return s, s.openFailed(ctx, StageSeed, err)
	}
	python := []string{"python3"}
	if info.Backend == sandbox.BackendWASM {
		python = []string{"python"}
	}
	s.env = &tools.Env{
		Sandbox: sb, Workdir: info.Workdir,
		ExecTimeout: info.Limits.ExecTimeout,
		IdleTimeout: time.Duration(t.Limits.IdleTimeoutS * float64(time.Second)),
		StoreCap:    t.Limits.MaxStoredOutputBytes,
		TestCommand: t.Reward.TestCommand(),
		TestTimeout: time.Duration(t.Reward.TimeoutS * float64(time.Second)),
		PythonArgv:  python,
		Extra:       map[string]any{},
	}
	if s.orch != nil {
		// Its sub-agents' state is outside the sandbox: it is not forked.
		s.env.Extra[NameSpawnSubagents] = true
	}
	if cfg.ToolEnv != nil {
		if err := cfg.ToolEnv(s.env); err != nil {
			return s, s.openFailed(ctx, StageAttach, err)
		}
	}
	system := t.System
	if system == "" {
		system = defaultSystemPrompt(info.Workdir, reg.Names())
	}
	s.messages = []Message{{Role: RoleSystem, Content: system}, {Role: RoleUser, Content: t.Prompt}}
	return s, nil
}

// openFailed ends an episode that could not open: sandbox_error, or the
// context's end when it ended first. It returns the *OpenError, or the
// *RecordError when even that end could not be written.
func (s *Session) openFailed(ctx context.Context, stage string, err error) error {
	oe := &OpenError{Stage: stage, Err: err}
	var rerr error
	if cerr := s.deadlineErr(ctx); cerr != nil {
		oe.Err = errors.Join(err, cerr)
		rerr = s.endCtx(ctx, cerr)
	} else {
		rerr = s.end(ctx, trajectory.EndSandboxError, oe.Error())
	}
	if rerr != nil {
		return rerr
	}
	return oe
}

// EpisodeSpec is the sandbox an episode of t asks for under pinned values
// (Pins): the task's spec with the pinned host name and environment. It is a
// pure function of its arguments and carries no labels, so the service
// computes it when it admits the episode (its warm pools are sized by it)
// and the episode asks for exactly that sandbox.
func EpisodeSpec(t *Task, pinned map[string]string) sandbox.Spec {
	spec := t.SandboxSpec()
	applyPins(&spec, pinned)
	return spec
}

func defaultSystemPrompt(workdir string, names []string) string {
	return fmt.Sprintf("You are an agent working in a sandboxed Linux environment. Your working directory is %s. "+
		"Use the tools (%s) to act; call finish when you are done.", workdir, strings.Join(names, ", "))
}
