package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/monitor"
	"github.com/rollbox/rollbox/agent/reward"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// RescoreSpec is what `rollbox rescore --rubrics FILE` applies: a reward
// spec (typically a judge, or a composite of the recorded tests and a
// judge) and optionally the monitors' config (else each task's own).
type RescoreSpec struct {
	Reward   reward.Spec     `json:"reward"`
	Monitors *monitor.Config `json:"monitors,omitempty"`
}

// ParseRescoreSpec reads a rescore file: a reward object ({"type": ...})
// or {"reward": {...}, "monitors": {...}}. Unknown fields are refused and
// errors name the field.
func ParseRescoreSpec(b []byte) (*RescoreSpec, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	var rs RescoreSpec
	if _, ok := probe["type"]; ok {
		s, err := reward.ParseSpec(b)
		if err != nil {
			return nil, err
		}
		rs.Reward = s
		return &rs, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rs); err != nil {
		return nil, fmt.Errorf("want a reward object or {\"reward\": ..., \"monitors\": ...}: %v", err)
	}
	if rs.Reward.Type == "" {
		return nil, errors.New("reward: required")
	}
	if err := rs.Reward.Validate("reward"); err != nil {
		return nil, err
	}
	if rs.Monitors != nil {
		if err := rs.Monitors.Validate("monitors"); err != nil {
			return nil, err
		}
	}
	return &rs, nil
}

// RescoreConfig is one rescore of a recorded run.
type RescoreConfig struct {
	// RunDir is a `rollbox run --out` directory (or a service's data
	// directory): its episodes/ are read; a directory of trajectories is
	// taken as is.
	RunDir string
	Spec   *RescoreSpec
	// SpecJSON is the file as given, kept beside the new records.
	SpecJSON []byte
	// ID names the rescore (default a fresh id): the new records go to
	// RunDir/rescores/<ID>/episodes/, beside the old ones, never over.
	ID string
	// Judges asks the judges (nil: a pool of the rescore's own). Each
	// record's own judge answers are put into its cache first, so judging
	// what was judged before asks nothing.
	Judges *judge.Pool
	// Concurrency bounds episodes rescored at once (default 8).
	Concurrency int
	// OnEpisode, if set, sees each new record.
	OnEpisode func(t *trajectory.Trajectory, done, total int)
}

// RescoreResult says what a rescore wrote.
type RescoreResult struct {
	// Dir holds episodes/, summary.json and spec.json.
	Dir      string
	Episodes int
	Summary  *Summary
	// Before is the summary of the records as they were.
	Before *Summary
}

// Rescore applies a new reward to every recorded episode of a run without
// running anything again: judge parts ask the judges (cached), a tests part
// takes the score the episode recorded for its command, exact, regex and
// fbeta parts recompute from the recorded answer, ids and context events;
// the monitors are recomputed. Episodes that ended for the infrastructure's
// reasons stay unscored; one that broke its sandbox keeps its 0. The new
// records are written to RunDir/rescores/<id>/episodes/ with a summary.
func Rescore(ctx context.Context, cfg RescoreConfig) (*RescoreResult, error) {
	if cfg.Spec == nil {
		return nil, errors.New("rescore: no spec")
	}
	src := filepath.Join(cfg.RunDir, "episodes")
	if st, err := os.Stat(src); err != nil || !st.IsDir() {
		src = cfg.RunDir
	}
	eps, err := loadEnded(src)
	if err != nil {
		return nil, err
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("%s holds no ended episode", src)
	}
	if cfg.ID == "" {
		cfg.ID = NewID("s")
	}
	if cfg.Judges == nil {
		cfg.Judges = judge.NewPool(judge.Options{})
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	dir := filepath.Join(cfg.RunDir, "rescores", cfg.ID)
	outEps := filepath.Join(dir, "episodes")
	if _, err := os.Stat(dir); err == nil {
		return nil, fmt.Errorf("%s exists: a rescore never writes over another", dir)
	}
	if err := os.MkdirAll(outEps, 0o755); err != nil {
		return nil, err
	}
	specJSON := cfg.SpecJSON
	if specJSON == nil {
		specJSON, _ = json.MarshalIndent(cfg.Spec, "", "  ")
	}
	if err := os.WriteFile(filepath.Join(dir, "spec.json"), specJSON, 0o644); err != nil {
		return nil, err
	}
	h := sha256.Sum256(specJSON)
	specHash := hex.EncodeToString(h[:])
	rel, _ := filepath.Rel(cfg.RunDir, src)

	out := make([]*trajectory.Trajectory, len(eps))
	errs := make([]error, len(eps))
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for range min(cfg.Concurrency, len(eps)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t := eps[i]
				nt, err := rescoreOne(ctx, cfg, t)
				if err == nil {
					nt.Rescore = &trajectory.Rescore{ID: cfg.ID, Source: filepath.ToSlash(filepath.Join(rel, t.EpisodeID+".json")),
						SpecHash: specHash, At: time.Now().UTC()}
					if v, ok := t.Value(); ok {
						nt.Rescore.Previous = &v
					}
					err = trajectory.WriteFile(filepath.Join(outEps, t.EpisodeID+".json"), nt)
				}
				mu.Lock()
				out[i], errs[i] = nt, err
				done++
				n := done
				mu.Unlock()
				if err == nil && cfg.OnEpisode != nil {
					cfg.OnEpisode(nt, n, len(eps))
				}
			}
		}()
	}
feed:
	for i := range eps {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	var written []*trajectory.Trajectory
	var failed []error
	for i, t := range out {
		if errs[i] != nil {
			failed = append(failed, fmt.Errorf("episode %s: %w", eps[i].EpisodeID, errs[i]))
			continue
		}
		if t != nil {
			written = append(written, t)
		}
	}
	rolloutID := ""
	if len(eps) > 0 {
		rolloutID = eps[0].RolloutID
	}
	for _, t := range written {
		t.Group = nil
	}
	sum := Summarize(rolloutID, written)
	sum.StartedAt = time.Now().UTC()
	if err := writeJSON(filepath.Join(dir, "summary.json"), sum); err != nil {
		failed = append(failed, err)
	}
	if err := ctx.Err(); err != nil && len(written) < len(eps) {
		failed = append(failed, fmt.Errorf("cancelled with %d of %d episodes rescored: %w", len(written), len(eps), err))
	}
	if len(failed) > 3 {
		failed = append(failed[:3], fmt.Errorf("and %d more", len(failed)-3))
	}
	return &RescoreResult{Dir: dir, Episodes: len(written), Summary: sum, Before: Summarize(rolloutID, eps)}, errors.Join(failed...)
}

// recordedTask is what a rescore reads of a recorded task.
type recordedTask struct {
	Prompt   string          `json:"prompt"`
	Reward   reward.Spec     `json:"reward"`
	Monitors *monitor.Config `json:"monitors"`
}

// rescoreOne computes one episode's new reward and monitors, on a copy.
func rescoreOne(ctx context.Context, cfg RescoreConfig, t *trajectory.Trajectory) (*trajectory.Trajectory, error) {
	var task recordedTask
	if err := json.Unmarshal(t.Task, &task); err != nil {
		return nil, fmt.Errorf("the recorded task: %w", err)
	}
	nt := *t
	nt.Group = nil
	mcfg := cfg.Spec.Monitors
	if mcfg == nil {
		mcfg = task.Monitors
	}
	reason := t.Termination.Reason
	switch {
	case reason == trajectory.EndSandboxAbuse:
		// the agent broke its sandbox: its 0 stands, whatever the reward
	case !trajectory.Scored(reason):
		nt.Reward = nil
	default:
		if t.Reward != nil && t.Reward.Judge != nil {
			judge.Seed(cfg.Judges.Cache(), t.Reward.Judge)
		}
		in := reward.Input{Prompt: task.Prompt, End: reason, Steps: t.Steps, Judges: cfg.Judges,
			Answer: t.Termination.Answer, IDs: t.Termination.IDs, Recorded: recorded(&task.Reward, t.Reward),
			Subagents: t.Subagents}
		if t.Stats.CriticalSteps != nil {
			in.CriticalSteps = *t.Stats.CriticalSteps
		}
		// A parl reward anneals at the train step the episode ran at (a
		// record older than its train_step field has it in its parl
		// reward's components).
		in.TrainStep = t.TrainStep
		if in.TrainStep == 0 && t.Reward != nil {
			in.TrainStep = int64(t.Reward.Components["train_step"])
		}
		for _, e := range t.ContextEvents {
			switch e.Kind {
			case "seen":
				in.SeenIDs = append(in.SeenIDs, e.IDs...)
			case "pruned":
				in.PruneSizes = append(in.PruneSizes, len(e.IDs))
			}
		}
		r, err := reward.Evaluate(ctx, cfg.Spec.Reward, in)
		if err != nil {
			return nil, err
		}
		nt.Reward = r
	}
	// The monitors read the episode: what its verifier undid stays the
	// episode's when the new reward runs none (a judge alone).
	mt := nt
	if nt.Reward != nil && nt.Reward.Verifier == nil && t.Reward != nil && t.Reward.Verifier != nil {
		r := *nt.Reward
		r.Verifier = t.Reward.Verifier
		mt.Reward = &r
	}
	nt.Monitors = monitor.Compute(&mt, mcfg)
	if reason != trajectory.EndSandboxAbuse {
		monitor.Penalize(nt.Reward, nt.Monitors, mcfg)
	}
	return &nt, nil
}

// recorded is what a record's reward holds for a rescore: the tests scores
// by command (from the task's reward spec: a tests reward's component, or
// a composite's part), the verifier, the workspace diff.
func recorded(spec *reward.Spec, r *trajectory.Reward) *reward.Recorded {
	rec := &reward.Recorded{Tests: map[string]float64{}}
	if r == nil {
		return rec
	}
	rec.Verifier, rec.Workspace = r.Verifier, r.Workspace
	switch spec.Type {
	case "tests":
		if v, ok := r.Components["tests"]; ok {
			rec.Tests[spec.Command] = v
		}
	case "parl":
		// The perf reward's total is r_perf; a composite perf's parts are
		// perf.<name>.
		switch p := spec.Perf; {
		case p == nil:
		case p.Type == "tests":
			if v, ok := r.Components[trajectory.PerfComponent]; ok {
				rec.Tests[p.Command] = v
			}
		case p.Type == "composite":
			recordedParts(p, r.Components, "perf.", rec.Tests)
		}
	case "composite":
		recordedParts(spec, r.Components, "", rec.Tests)
	}
	return rec
}

// recordedParts takes the tests scores of a composite's parts from the
// components they were recorded as (prefix + the part's name).
func recordedParts(spec *reward.Spec, c map[string]float64, prefix string, tests map[string]float64) {
	for _, p := range spec.Parts {
		name := p.Name
		if name == "" {
			name = p.Reward.Type
		}
		if v, ok := c[prefix+name]; ok && p.Reward.Type == "tests" {
			tests[p.Reward.Command] = v
		}
	}
}

// loadEnded reads the ended episodes of dir (journals of episodes in
// flight and other JSON files are left out), by group.
func loadEnded(dir string) ([]*trajectory.Trajectory, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []*trajectory.Trajectory
	for _, p := range paths {
		switch filepath.Base(p) {
		case "summary.json", "spec.json":
			continue
		}
		t, err := trajectory.Read(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if t.EpisodeID != "" && t.Termination != nil {
			t.Group = nil
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GroupID != out[j].GroupID {
			return out[i].GroupID < out[j].GroupID
		}
		return out[i].GroupIndex < out[j].GroupIndex
	})
	return out, nil
}
