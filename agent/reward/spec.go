package reward

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"
)

// Types of reward.
var Types = []string{"tests", "exact", "regex", "fbeta", "judge", "composite"}

// Spec is a task's "reward" object.
type Spec struct {
	Type string `json:"type"`

	// tests
	Command  string   `json:"command,omitempty"`
	TimeoutS float64  `json:"timeout_s,omitempty"`
	Protect  []string `json:"protect,omitempty"`
	// Deny names files (globs on the base name) removed before the verifier
	// runs unless the task itself provided them; default DefaultDeny.
	Deny []string `json:"deny,omitempty"`

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

	// judge
	BaseURL string   `json:"base_url,omitempty"`
	Model   string   `json:"model,omitempty"`
	Rubrics []Rubric `json:"rubrics,omitempty"`

	// composite
	Parts []Part `json:"parts,omitempty"`
}

// Rubric is one criterion a judge scores.
type Rubric struct {
	Name      string  `json:"name"`
	Criterion string  `json:"criterion"`
	Weight    float64 `json:"weight,omitempty"`
}

// Part is one weighted part of a composite reward.
type Part struct {
	Name   string  `json:"name"`
	Weight float64 `json:"weight"`
	Reward Spec    `json:"reward"`
}

// DefaultDeny are files that can change what a test runner reports; an
// agent that creates one does not get to keep it for the verifier. Stale
// bytecode is among them: an edit within the same second as the last import
// keeps the source's mtime and size, and Python would run the old code.
var DefaultDeny = []string{"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py", "usercustomize.py", "*.pth", ".pytest_cache", "__pycache__", "*.pyc"}

// DefaultProtect matches test files: restored from the task before the verifier runs.
var DefaultProtect = []string{"test_*", "*_test.*", "*_tests.*", "tests/*", "test/*", "conftest.py"}

// Validate checks the spec; field is the path to name in errors ("reward").
func (s *Spec) Validate(field string) error {
	switch s.Type {
	case "tests":
		if strings.TrimSpace(s.Command) == "" {
			return fmt.Errorf("%s.command: required for type tests", field)
		}
		if s.TimeoutS < 0 {
			return fmt.Errorf("%s.timeout_s: %v is negative", field, s.TimeoutS)
		}
		for i, g := range append(append([]string{}, s.Protect...), s.Deny...) {
			if _, err := path.Match(g, "x"); err != nil {
				return fmt.Errorf("%s.protect/deny[%d]: bad glob %q", field, i, g)
			}
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
		return fmt.Errorf("%s.type judge: generative reward models are not supported by this build yet", field)
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
			if err := p.Reward.Validate(f + ".reward"); err != nil {
				return err
			}
		}
	case "":
		return fmt.Errorf("%s.type: required (one of %s)", field, strings.Join(Types, ", "))
	default:
		return fmt.Errorf("%s.type %q is not one of %s", field, s.Type, strings.Join(Types, ", "))
	}
	return nil
}

// TestCommand is the command run_tests runs for this spec ("" if none).
func (s *Spec) TestCommand() string {
	if s.Type == "tests" {
		return s.Command
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
