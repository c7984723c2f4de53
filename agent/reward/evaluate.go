package reward

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strings"

	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// Sandbox is what rewards need of the episode's sandbox: its files, read
// through the file API (never by running a command in it).
type Sandbox interface {
	ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error)
	ListFiles(ctx context.Context, dir string) ([]sandbox.FileInfo, error)
}

// Input is what an episode leaves for its reward.
type Input struct {
	Sandbox Sandbox
	Workdir string
	// NewSandbox makes a fresh, empty sandbox of the episode's backend and
	// spec (image, runtime, limits, environment with the pins): where a
	// tests reward runs. Required for tests rewards.
	NewSandbox func(ctx context.Context) (sandbox.Sandbox, error)
	// CloseSandbox closes the episode's sandbox; a tests reward calls it
	// once it has read the agent's files, before anything runs.
	CloseSandbox func()
	// Backend names the sandbox's backend ("docker", "wasm").
	Backend string
	// Env is the sandbox's environment (the task's sandbox.env and the
	// pinned variables), which the verifier's commands also have.
	Env map[string]string
	// TaskFiles are the files the task seeded (path → content).
	TaskFiles map[string][]byte
	// Answer and IDs are what finish was given (Answer nil: never finished).
	Answer *string
	IDs    []string
	// SeenIDs are document ids the agent saw during the episode (search
	// results and reads); PruneSizes has the number of ids of each prune call.
	SeenIDs    []string
	PruneSizes []int
	// VerifierOutputCap caps each stream kept of the verifier.
	VerifierOutputCap int

	// Judge rewards: the task's prompt, how the episode ended and its
	// steps (what rubrics may show), and the pool that bounds and caches
	// judge requests (nil: a pool of this evaluation's own).
	Prompt string
	End    string
	Steps  []trajectory.Step
	Judges *judge.Pool

	// Recorded, when set, evaluates over a record instead of a live
	// sandbox (rollbox rescore): a tests part takes its recorded score
	// (by command; a command without one is unscored, unrecorded) and a
	// judge part is shown the recorded workspace diff.
	Recorded *Recorded

	// Orchestrator episodes (a parl reward): the sub-agents as the
	// orchestrator's record holds them, its critical steps, and the
	// trainer's step the rollout was asked at (annealing).
	Subagents     []trajectory.Subagent
	CriticalSteps int
	TrainStep     int64

	// ws is the agent's workspace, read once for every tests reward of a
	// composite.
	ws *workspace
}

// Recorded is what a recorded episode's reward holds for a rescore.
type Recorded struct {
	// Tests are the tests scores recorded, by the reward's command, with
	// the verifier's record.
	Tests    map[string]float64
	Verifier *trajectory.Verifier
	// Workspace is the recorded workspace diff (nil: none was recorded).
	Workspace *trajectory.WorkspaceDiff
}

// Evaluate computes the reward. An error means the sandbox failed while
// verifying: the episode must end sandbox_error with no score.
func Evaluate(ctx context.Context, s Spec, in Input) (*trajectory.Reward, error) {
	if in.ws == nil {
		in.ws = &workspace{specs: specsOf(s), diff: s.sees(judge.SeesDiff)}
	}
	r := &trajectory.Reward{Components: map[string]float64{}}
	switch s.Type {
	case "composite":
		return composite(ctx, s, in)
	case "parl":
		return parl(ctx, s, in)
	case "tests":
		if in.Recorded != nil {
			return recordedTests(s, in.Recorded), nil
		}
		return tests(ctx, s, in)
	case "judge":
		return judged(ctx, s, in)
	case "exact":
		ok := in.Answer != nil && normalize(*in.Answer, s.CaseInsensitive) == normalize(s.Answer, s.CaseInsensitive)
		r.Total = trajectory.Score(b2f(ok))
		r.Components["exact"] = b2f(ok)
		if in.Answer == nil {
			r.Details = append(r.Details, "no answer was given to finish")
		}
		return r, nil
	case "regex":
		pat := s.Pattern
		if s.CaseInsensitive {
			pat = "(?i)" + pat
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			return nil, fmt.Errorf("reward.pattern: %w", err) // validated before; unreachable
		}
		ok := in.Answer != nil && re.MatchString(strings.TrimSpace(*in.Answer))
		r.Total = trajectory.Score(b2f(ok))
		r.Components["regex"] = b2f(ok)
		return r, nil
	case "fbeta":
		return fbeta(s, in), nil
	}
	return nil, fmt.Errorf("reward.type %q cannot be evaluated", s.Type)
}

// composite is the weighted mean of its parts. It is scored only when
// every part is: a part without a total (a judge that failed) leaves the
// composite without one, with that part's error kind; the parts that did
// score are still recorded as components.
func composite(ctx context.Context, s Spec, in Input) (*trajectory.Reward, error) {
	r := &trajectory.Reward{Components: map[string]float64{}}
	var total, wsum float64
	for _, p := range s.Parts {
		sub, err := Evaluate(ctx, p.Reward, in)
		if err != nil {
			return nil, fmt.Errorf("reward part %s: %w", p.Name, err)
		}
		v, scored := sub.Value()
		if scored {
			r.Components[p.Name] = v
		} else if r.ErrorKind == "" {
			r.ErrorKind = sub.ErrorKind
			r.Details = append(r.Details, fmt.Sprintf("part %s is unscored (%s): the composite is unscored", p.Name, sub.ErrorKind))
		}
		for k, v := range sub.Components {
			if k != p.Reward.Type {
				r.Components[p.Name+"."+strings.TrimPrefix(k, p.Reward.Type+".")] = v
			}
		}
		total += p.Weight * v
		wsum += p.Weight
		if sub.Verifier != nil {
			r.Verifier = sub.Verifier
		}
		if sub.Judge != nil {
			r.Judge = sub.Judge
		}
		if sub.Workspace != nil {
			r.Workspace = sub.Workspace
		}
		for _, d := range sub.Details {
			r.Details = append(r.Details, p.Name+": "+d)
		}
	}
	if r.ErrorKind != "" {
		return r, nil
	}
	if wsum > 0 {
		total /= wsum
	}
	r.Total = trajectory.Score(total)
	return r, nil
}

func normalize(s string, fold bool) string {
	s = strings.Join(strings.Fields(s), " ")
	if fold {
		s = strings.ToLower(s)
	}
	return s
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// fbeta scores retrieval: F-beta of the final ids against the relevant ones
// (beta 4 by default: recall weighs 16× precision), plus an optional
// trajectory-recall term and a penalty for one-at-a-time pruning.
func fbeta(s Spec, in Input) *trajectory.Reward {
	beta := s.Beta
	if beta == 0 {
		beta = 4
	}
	rel := map[string]bool{}
	for _, id := range s.Relevant {
		rel[id] = true
	}
	final := map[string]bool{}
	for _, id := range in.IDs {
		final[relevantID(rel, id)] = true
	}
	hit := 0
	for id := range final {
		if rel[id] {
			hit++
		}
	}
	var precision, recall, f float64
	if len(final) > 0 {
		precision = float64(hit) / float64(len(final))
	}
	recall = float64(hit) / float64(len(rel))
	if precision+recall > 0 {
		b2 := beta * beta
		f = (1 + b2) * precision * recall / (b2*precision + recall)
	}
	// Every component is recorded, weighted or not, so that trainers can
	// see the process terms of runs that did not reward them.
	seen := map[string]bool{}
	for _, id := range in.SeenIDs {
		if id = relevantID(rel, id); rel[id] {
			seen[id] = true
		}
	}
	tr := float64(len(seen)) / float64(len(rel))
	singles := 0
	for _, n := range in.PruneSizes {
		if n == 1 {
			singles++
		}
	}
	pen := s.PrunePenalty * float64(max(0, singles-s.PruneFree))
	r := &trajectory.Reward{Components: map[string]float64{
		"fbeta": f, "precision": precision, "recall": recall,
		"trajectory_recall": tr, "prune_penalty": 0,
	}}
	if pen > 0 {
		r.Components["prune_penalty"] = -pen
	}
	total := f + s.TrajectoryRecallWeight*tr - pen
	r.Total = trajectory.Score(math.Round(total*1e9) / 1e9)
	return r
}

// relevantID maps a chunk id ("<doc-id>#<n>", as the retriever names the
// parts of a chunked document) to its document's id when that document is
// relevant and the chunk id itself is not; any other id is itself.
func relevantID(rel map[string]bool, id string) string {
	if rel[id] {
		return id
	}
	i := strings.LastIndexByte(id, '#')
	if i <= 0 || i == len(id)-1 {
		return id
	}
	for _, c := range id[i+1:] {
		if c < '0' || c > '9' {
			return id
		}
	}
	if rel[id[:i]] {
		return id[:i]
	}
	return id
}
