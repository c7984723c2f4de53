package reward

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// Sandbox is what rewards need of the episode's sandbox.
type Sandbox interface {
	Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Result, error)
	WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error
	ListFiles(ctx context.Context, dir string) ([]sandbox.FileInfo, error)
}

// Input is what an episode leaves for its reward.
type Input struct {
	Sandbox Sandbox
	Workdir string
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
}

// Evaluate computes the reward. An error means the sandbox failed while
// verifying: the episode must end sandbox_error with no score.
func Evaluate(ctx context.Context, s Spec, in Input) (*trajectory.Reward, error) {
	r := &trajectory.Reward{Components: map[string]float64{}}
	switch s.Type {
	case "composite":
		var wsum float64
		for _, p := range s.Parts {
			sub, err := Evaluate(ctx, p.Reward, in)
			if err != nil {
				return nil, fmt.Errorf("reward part %s: %w", p.Name, err)
			}
			r.Components[p.Name] = sub.Total
			for k, v := range sub.Components {
				if k != p.Reward.Type {
					r.Components[p.Name+"."+k] = v
				}
			}
			r.Total += p.Weight * sub.Total
			wsum += p.Weight
			if sub.Verifier != nil {
				r.Verifier = sub.Verifier
			}
			for _, d := range sub.Details {
				r.Details = append(r.Details, p.Name+": "+d)
			}
		}
		if wsum > 0 {
			r.Total /= wsum
		}
		return r, nil
	case "tests":
		return tests(ctx, s, in)
	case "exact":
		ok := in.Answer != nil && normalize(*in.Answer, s.CaseInsensitive) == normalize(s.Answer, s.CaseInsensitive)
		r.Total = b2f(ok)
		r.Components["exact"] = r.Total
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
		r.Total = b2f(ok)
		r.Components["regex"] = r.Total
		return r, nil
	case "fbeta":
		return fbeta(s, in), nil
	}
	return nil, fmt.Errorf("reward.type %q cannot be evaluated", s.Type)
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

// tests restores the protected task files, removes files that could rig the
// runner, then runs the verifier: exit 0 is success.
func tests(ctx context.Context, s Spec, in Input) (*trajectory.Reward, error) {
	v := &trajectory.Verifier{Command: s.Command}
	protect := s.Protect
	if len(protect) == 0 {
		protect = DefaultProtect
	}
	var paths []string
	for p := range in.TaskFiles {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if matchAny(protect, p, in.Workdir) {
			if err := in.Sandbox.WriteFile(ctx, p, in.TaskFiles[p], 0o644); err != nil {
				return nil, fmt.Errorf("restore %s before the verifier: %w", p, err)
			}
			v.Restored = append(v.Restored, p)
		}
	}
	deny := s.Deny
	if deny == nil {
		deny = DefaultDeny
	}
	if len(deny) > 0 {
		planted, err := findDenied(ctx, in.Sandbox, in.Workdir, deny, in.TaskFiles)
		if err != nil {
			return nil, err
		}
		for _, p := range planted {
			res, err := in.Sandbox.Exec(ctx, sandbox.ExecRequest{Shell: "rm -rf -- " + shellQuote(p), Timeout: 30 * time.Second})
			if err != nil {
				return nil, fmt.Errorf("remove %s before the verifier: %w", p, err)
			}
			if res.ExitCode != 0 {
				return nil, fmt.Errorf("remove %s before the verifier: exit %d: %s: %w", p, res.ExitCode, res.Stderr, sandbox.ErrSandboxFailed)
			}
			v.Removed = append(v.Removed, p)
		}
	}
	timeout := time.Duration(s.TimeoutS * float64(time.Second))
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	res, err := in.Sandbox.Exec(ctx, sandbox.ExecRequest{
		Shell:     s.Command,
		Timeout:   timeout,
		OutputCap: in.VerifierOutputCap,
		Env:       map[string]string{"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": "", "PYTEST_ADDOPTS": "-p no:cacheprovider"},
	})
	if err != nil {
		return nil, fmt.Errorf("verifier: %w", err)
	}
	v.ExitCode, v.TimedOut = res.ExitCode, res.TimedOut
	v.Stdout, v.Stderr = trajectory.NewBytes(res.Stdout), trajectory.NewBytes(res.Stderr)
	v.DurationMS = float64(res.Duration) / float64(time.Millisecond)
	pass := res.ExitCode == 0 && !res.TimedOut && !res.OOMKilled
	r := &trajectory.Reward{Total: b2f(pass), Components: map[string]float64{"tests": b2f(pass)}, Verifier: v}
	if res.TimedOut {
		r.Details = append(r.Details, fmt.Sprintf("the verifier timed out after %v", timeout))
	}
	return r, nil
}

// matchAny matches globs against the path relative to the workdir and
// against its base name.
func matchAny(globs []string, p, workdir string) bool {
	rel := strings.TrimPrefix(strings.TrimPrefix(p, workdir), "/")
	base := path.Base(p)
	for _, g := range globs {
		if ok, _ := path.Match(g, rel); ok {
			return true
		}
		if ok, _ := path.Match(g, base); ok {
			return true
		}
		if ok, _ := path.Match(g, p); ok {
			return true
		}
	}
	return false
}

// findDenied walks the workdir (bounded) for entries matching deny that the
// task did not provide.
func findDenied(ctx context.Context, sb Sandbox, root string, deny []string, task map[string][]byte) ([]string, error) {
	var out []string
	queue := []string{root}
	seen := 0
	for len(queue) > 0 && seen < 20000 {
		dir := queue[0]
		queue = queue[1:]
		fis, err := sb.ListFiles(ctx, dir)
		if errors.Is(err, sandbox.ErrNotFound) {
			continue
		}
		if err != nil {
			if sandbox.IsInfra(err) || ctx.Err() != nil {
				return nil, fmt.Errorf("list %s before the verifier: %w", dir, err)
			}
			continue // unreadable directory: the verifier can't see it either
		}
		for _, fi := range fis {
			seen++
			p := path.Join(dir, fi.Name)
			if _, fromTask := task[p]; !fromTask && matchBase(deny, fi.Name) {
				out = append(out, p)
				continue
			}
			if fi.IsDir && fi.Link == "" {
				queue = append(queue, p)
			}
		}
	}
	return out, nil
}

func matchBase(globs []string, name string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

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
	r.Total = math.Round(total*1e9) / 1e9
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
