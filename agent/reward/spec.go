package reward

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/reward/testreport"
)

// Types of reward.
var Types = []string{"tests", "exact", "regex", "fbeta", "judge", "composite", "parl"}

// Spec is a task's "reward" object.
type Spec struct {
	Type string `json:"type"`

	// tests: the command runs in a fresh sandbox of the task's image and
	// spec holding the task's files, the agent's changes (see Editable,
	// Protect, Deny) and HiddenTests; see the package documentation.
	Command  string  `json:"command,omitempty"`
	TimeoutS float64 `json:"timeout_s,omitempty"`
	// Protect names the task's test files (globs, see glob.go; default
	// DefaultProtect): never taken from the agent, whatever it did to them;
	// a glob naming a directory protects everything under it.
	Protect []string `json:"protect,omitempty"`
	// Deny names files that configure or steer a test runner (globs on the
	// base name; default DefaultDeny): taken from the task, never from the
	// agent, unless Editable names them.
	Deny []string `json:"deny,omitempty"`
	// Editable, when set, names the only paths the agent's versions of are
	// verified (globs relative to the workdir, "**" for any depth); every
	// other path is the task's.
	Editable []string `json:"editable,omitempty"`
	// HiddenTests are files (absolute path → content) added to the
	// verifier's sandbox only: tests the agent never saw.
	HiddenTests map[string]string `json:"hidden_tests,omitempty"`
	// Report names the runner's report of named test results; without
	// one the reward is the command's exit status (weaker: anything that
	// makes the process exit 0 passes). Format harbor reads the score a
	// Harbor test script writes (reward.json or reward.txt in Path).
	Report *Report `json:"report,omitempty"`
	// MustPass names the tests that must be reported passed (e.g.
	// SWE-bench's FAIL_TO_PASS + PASS_TO_PASS); one missing from the
	// report scores 0. Needs Report.
	MustPass []string `json:"must_pass,omitempty"`
	// MustFail names canary tests whose real outcome is a failure (hidden
	// tests the agent never saw, e.g. `assert 3 == 4`): a report that says
	// one passed was forged by code running in the test process (an
	// agent's module patching the runner's reports) and scores 0, blamed.
	// One missing from the report is not counted (a runner configuration
	// may not collect it). Needs MustPass.
	MustFail []string `json:"must_fail,omitempty"`
	// Score is "all" (default: 1 when every test named, or every test
	// reported, passed) or "fraction" (the fraction that passed).
	Score string `json:"score,omitempty"`

	// exact, regex
	Answer          string `json:"answer,omitempty"`
	Pattern         string `json:"pattern,omitempty"`
	CaseInsensitive bool   `json:"case_insensitive,omitempty"`

	// fbeta: F-beta of the ids given to finish against Relevant (beta
	// default 4: recall weighs 16 times precision). A chunk id
	// "<doc-id>#<n>" counts as its document when that document is relevant.
	// Components fbeta, precision, recall, trajectory_recall and
	// prune_penalty are always recorded; only weighted ones change the total.
	Beta     float64  `json:"beta,omitempty"`
	Relevant []string `json:"relevant,omitempty"`
	// TrajectoryRecallWeight weights the recall of relevant ids seen at any
	// point in the episode (a process term).
	TrajectoryRecallWeight float64 `json:"trajectory_recall_weight,omitempty"`
	// PrunePenalty is subtracted per prune call beyond PruneFree that removes
	// a single id.
	PrunePenalty float64 `json:"prune_penalty,omitempty"`
	PruneFree    int     `json:"prune_free,omitempty"`

	// judge: generative reward models score rubrics (package agent/judge:
	// what each rubric sees, how judges and rubrics combine). A judge that
	// fails after its retries leaves the reward unscored (judge_error).
	Rubrics   []judge.Rubric   `json:"rubrics,omitempty"`
	Judges    []judge.Endpoint `json:"judges,omitempty"`
	Aggregate *judge.Aggregate `json:"aggregate,omitempty"`
	Samples   int              `json:"samples,omitempty"`
	DeadlineS float64          `json:"deadline_s,omitempty"`

	// composite
	Parts []Part `json:"parts,omitempty"`

	// parl (orchestrator tasks): Perf is the outcome reward (any type
	// but parl); LambdaParallel and LambdaFinish weigh r_parallel and
	// r_finish at train step 0, annealed to 0 by Anneal (constant without
	// it); ParallelCap is where r_parallel saturates (default 4); Latency
	// is an optional term on critical steps. See parl.go.
	Perf           *Spec    `json:"perf,omitempty"`
	LambdaParallel float64  `json:"lambda_parallel,omitempty"`
	LambdaFinish   float64  `json:"lambda_finish,omitempty"`
	Anneal         *Anneal  `json:"anneal,omitempty"`
	ParallelCap    int      `json:"parallel_cap,omitempty"`
	Latency        *Latency `json:"latency,omitempty"`
}

// Part is one weighted part of a composite reward.
type Part struct {
	Name   string  `json:"name"`
	Weight float64 `json:"weight"`
	Reward Spec    `json:"reward"`
}

// Report names a runner's report of named test results.
type Report struct {
	// Format is one of testreport.Formats: "junit" (a JUnit XML file the
	// command writes at Path), "pytest" (the verifier asks pytest for its
	// JUnit XML itself), "go-test-json" (`go test -json` events) or "tap".
	Format string `json:"format"`
	// Path is where the command writes the report (required for junit;
	// for go-test-json and tap the command's stdout is read without it;
	// for harbor the directory of reward.json and reward.txt).
	Path string `json:"path,omitempty"`
}

// DefaultDeny are files that configure or steer a test runner (pytest,
// Python's start-up, Go modules, npm and make), version control and
// caches: the verifier takes them from the task, never from the agent. Stale bytecode is among them: an
// edit within the same second as the last import keeps the source's mtime
// and size, and Python would run the old code.
var DefaultDeny = []string{
	"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py",
	"sitecustomize.py", "usercustomize.py", "*.pth", ".pytest_cache", "__pycache__", "*.pyc", "*.pyo",
	"go.mod", "go.sum", "go.work", "go.work.sum",
	"package.json", ".npmrc", "jest.config.*", "vitest.config.*", ".mocharc*",
	"Makefile", "makefile", "GNUmakefile",
	// Not runner files, but never the agent's to hand to the verifier:
	// version control and caches (HOME is the workdir), often thousands of
	// files.
	".git", ".cache",
}

// DefaultProtect matches test files and test directories: the verifier
// takes them from the task (or not at all), never from the agent.
var DefaultProtect = []string{"test_*", "*_test.*", "*_tests.*", "tests", "test", "testdata", "conftest.py"}

// Scores of a tests reward.
const (
	ScoreAll      = "all"
	ScoreFraction = "fraction"
)

// MaxTimeoutS bounds a verifier's timeout_s (a day): past it the duration
// would not be one anybody means, and past ~292 years it overflows.
const MaxTimeoutS = 86400

// Validate checks the spec; field is the path to name in errors ("reward").
func (s *Spec) Validate(field string) error {
	switch s.Type {
	case "tests":
		if strings.TrimSpace(s.Command) == "" {
			return fmt.Errorf("%s.command: required for type tests", field)
		}
		if s.TimeoutS < 0 || s.TimeoutS > MaxTimeoutS {
			return fmt.Errorf("%s.timeout_s: %v is outside 0..%d (a day)", field, s.TimeoutS, MaxTimeoutS)
		}
		for _, list := range []struct {
			name  string
			globs []string
		}{{"protect", s.Protect}, {"deny", s.Deny}, {"editable", s.Editable}} {
			name := list.name
			for i, g := range list.globs {
				if !validGlob(g) {
					return fmt.Errorf("%s.%s[%d]: %q is not a glob (path.Match patterns joined by /, ** for any depth)", field, name, i, g)
				}
			}
		}
		for _, p := range sortedKeys(s.HiddenTests) {
			if !path.IsAbs(p) || path.Clean(p) != p {
				return fmt.Errorf("%s.hidden_tests[%q]: not a clean absolute path", field, p)
			}
		}
		if err := s.validateReport(field); err != nil {
			return err
		}
	case "exact":
		if s.Answer == "" {
			return fmt.Errorf("%s.answer: required for type exact", field)
		}
	case "regex":
		if s.Pattern == "" {
			return fmt.Errorf("%s.pattern: required for type regex", field)
		}
		if _, err := regexp.Compile(s.Pattern); err != nil {
			return fmt.Errorf("%s.pattern: %v", field, err)
		}
	case "fbeta":
		if len(s.Relevant) == 0 {
			return fmt.Errorf("%s.relevant: required for type fbeta (the relevant document ids)", field)
		}
		if s.Beta < 0 {
			return fmt.Errorf("%s.beta: %v is negative", field, s.Beta)
		}
		if s.TrajectoryRecallWeight < 0 || s.PrunePenalty < 0 || s.PruneFree < 0 {
			return fmt.Errorf("%s: weights and penalties must not be negative", field)
		}
	case "judge":
		js := s.JudgeSpec()
		if err := js.Validate(field); err != nil {
			return err
		}
		s.Judges = js.Judges // with their default names
	case "composite":
		if len(s.Parts) == 0 {
			return fmt.Errorf("%s.parts: a composite needs at least one part", field)
		}
		names := map[string]bool{}
		for i := range s.Parts {
			p := &s.Parts[i]
			f := fmt.Sprintf("%s.parts[%d]", field, i)
			if p.Name == "" {
				p.Name = p.Reward.Type
			}
			if names[p.Name] {
				return fmt.Errorf("%s.name: %q used twice", f, p.Name)
			}
			names[p.Name] = true
			if p.Weight < 0 {
				return fmt.Errorf("%s.weight: %v is negative", f, p.Weight)
			}
			if p.Reward.Type == "composite" {
				return fmt.Errorf("%s.reward.type: composites do not nest", f)
			}
			if p.Reward.Type == "parl" {
				return fmt.Errorf("%s.reward.type: parl is a whole reward (its perf may be a composite), not a part", f)
			}
			if err := p.Reward.Validate(f + ".reward"); err != nil {
				return err
			}
		}
	case "parl":
		return s.validateParl(field)
	case "":
		return fmt.Errorf("%s.type: required (one of %s)", field, strings.Join(Types, ", "))
	default:
		return fmt.Errorf("%s.type %q is not one of %s", field, s.Type, strings.Join(Types, ", "))
	}
	return nil
}

func (s *Spec) validateReport(field string) error {
	switch s.Score {
	case "", ScoreAll:
	case ScoreFraction:
		if s.Report == nil {
			return fmt.Errorf("%s.score: %q needs reward.report (the fraction is of named test results)", field, s.Score)
		}
	default:
		return fmt.Errorf("%s.score %q is not one of all, fraction", field, s.Score)
	}
	if len(s.MustPass) > 0 && s.Report == nil {
		return fmt.Errorf("%s.must_pass: needs reward.report (the names are read from the runner's report)", field)
	}
	seen := map[string]int{}
	for i, n := range s.MustPass {
		if strings.TrimSpace(n) == "" {
			return fmt.Errorf("%s.must_pass[%d]: empty test name", field, i)
		}
		if j, dup := seen[n]; dup {
			return fmt.Errorf("%s.must_pass[%d]: %q already named at must_pass[%d]", field, i, n, j)
		}
		seen[n] = i
	}
	if len(s.MustFail) > 0 && len(s.MustPass) == 0 {
		return fmt.Errorf("%s.must_fail: needs must_pass (the canaries guard the tests that must pass)", field)
	}
	for i, n := range s.MustFail {
		if strings.TrimSpace(n) == "" {
			return fmt.Errorf("%s.must_fail[%d]: empty test name", field, i)
		}
		if j, dup := seen[n]; dup {
			return fmt.Errorf("%s.must_fail[%d]: %q is also must_pass[%d]", field, i, n, j)
		}
	}
	if s.Report == nil {
		return nil
	}
	switch s.Report.Format {
	case testreport.JUnit:
		if s.Report.Path == "" {
			return fmt.Errorf("%s.report.path: required for format junit (where the command writes the XML)", field)
		}
	case testreport.Harbor:
		if s.Report.Path == "" {
			return fmt.Errorf("%s.report.path: required for format harbor (the directory the test script writes reward.json or reward.txt to)", field)
		}
		if len(s.MustPass) > 0 {
			return fmt.Errorf("%s.must_pass: format harbor names no test (the score is the reward file's)", field)
		}
		if s.Score == ScoreFraction {
			return fmt.Errorf("%s.score: format harbor names no test to take a fraction of (the score is the reward file's)", field)
		}
	case testreport.Pytest, testreport.GoTestJSON, testreport.TAP:
	case "":
		return fmt.Errorf("%s.report.format: required (one of %s)", field, strings.Join(testreport.Formats, ", "))
	default:
		return fmt.Errorf("%s.report.format %q is not one of %s", field, s.Report.Format, strings.Join(testreport.Formats, ", "))
	}
	if p := s.Report.Path; p != "" {
		if !path.IsAbs(p) || path.Clean(p) != p {
			return fmt.Errorf("%s.report.path: %q is not a clean absolute path", field, p)
		}
		if s.Report.Format == testreport.Pytest {
			return fmt.Errorf("%s.report.path: format pytest takes no path (the verifier chooses it)", field)
		}
		if _, ok := s.HiddenTests[p]; ok {
			return fmt.Errorf("%s.report.path: %q is also a hidden test", field, p)
		}
	}
	return nil
}

// CheckPaths checks the paths a tests reward writes into the verifier's
// sandbox against the sandbox and the task: hidden tests and the report
// must lie under the workdir or /tmp (where a sandbox takes files), and
// the report must not be one of the task's files (it would be there before
// the runner wrote it). field is the path to name in errors ("reward").
func (s *Spec) CheckPaths(field, workdir string, taskFile func(string) bool) error {
	writable := func(p string) bool {
		return strings.HasPrefix(p, workdir+"/") || strings.HasPrefix(p, "/tmp/")
	}
	switch s.Type {
	case "tests":
		for _, p := range sortedKeys(s.HiddenTests) {
			if !writable(p) {
				return fmt.Errorf("%s.hidden_tests[%q]: not under the workdir %s or /tmp", field, p, workdir)
			}
		}
		if s.Report != nil && s.Report.Path != "" {
			if !writable(s.Report.Path) {
				return fmt.Errorf("%s.report.path: %q is not under the workdir %s or /tmp", field, s.Report.Path, workdir)
			}
			if taskFile(s.Report.Path) {
				return fmt.Errorf("%s.report.path: %q is one of the task's files", field, s.Report.Path)
			}
		}
	case "parl":
		return s.Perf.CheckPaths(field+".perf", workdir, taskFile)
	case "composite":
		for i := range s.Parts {
			if err := s.Parts[i].Reward.CheckPaths(fmt.Sprintf("%s.parts[%d].reward", field, i), workdir, taskFile); err != nil {
				return err
			}
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// JudgeSpec is a judge reward's spec.
func (s *Spec) JudgeSpec() judge.Spec {
	return judge.Spec{Rubrics: s.Rubrics, Judges: s.Judges, Aggregate: s.Aggregate, Samples: s.Samples, DeadlineS: s.DeadlineS}
}

// JudgeSpecs lists the judge rewards of s (itself or its parts).
func (s *Spec) JudgeSpecs() []judge.Spec {
	if s.Type == "judge" {
		return []judge.Spec{s.JudgeSpec()}
	}
	if s.Perf != nil {
		return s.Perf.JudgeSpecs()
	}
	var out []judge.Spec
	for i := range s.Parts {
		out = append(out, s.Parts[i].Reward.JudgeSpecs()...)
	}
	return out
}

// TestCommand is the command run_tests runs for this spec ("" if none).
func (s *Spec) TestCommand() string {
	if s.Type == "tests" {
		return s.Command
	}
	if s.Perf != nil {
		return s.Perf.TestCommand()
	}
	for _, p := range s.Parts {
		if p.Reward.Type == "tests" {
			return p.Reward.Command
		}
	}
	return ""
}

// ParseSpec decodes and validates a reward object, refusing unknown fields.
func ParseSpec(raw json.RawMessage) (Spec, error) {
	var s Spec
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("reward: %v", err)
	}
	return s, s.Validate("reward")
}
