package judge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
)

// Spec is a judge reward: the rubrics, the judges and how their scores
// combine. It is the task's "reward" object of type judge, less the type.
type Spec struct {
	Rubrics []Rubric   `json:"rubrics"`
	Judges  []Endpoint `json:"judges"`
	// Aggregate says how judges combine on a rubric (default mean).
	Aggregate *Aggregate `json:"aggregate,omitempty"`
	// Samples is how many times each judge is asked each rubric (self-
	// consistency; default 1); its scores are averaged.
	Samples int `json:"samples,omitempty"`
	// DeadlineS bounds the whole judging of one episode, waiting for
	// endpoint slots included (default 300 s), apart from the episode's
	// own deadline.
	DeadlineS float64 `json:"deadline_s,omitempty"`
}

// Views are what a rubric may let its judges see.
const (
	SeesAnswer      = "answer"
	SeesDiff        = "diff"
	SeesTranscript  = "transcript"
	SeesToolOutputs = "tool_outputs"
)

// SeesValues lists the views a rubric may name.
func SeesValues() []string { return []string{SeesAnswer, SeesDiff, SeesTranscript, SeesToolOutputs} }

// Aggregations of judges.
const (
	AggMean        = "mean"
	AggMedian      = "median"
	AggMin         = "min"
	AggTrimmedMean = "trimmed_mean"
)

// Aggregations lists the ways judges may be combined.
func Aggregations() []string { return []string{AggMean, AggMedian, AggMin, AggTrimmedMean} }

// Defaults.
const (
	DefaultMaxChars    = 12000
	MinMaxChars        = 200
	DefaultSamples     = 1
	MaxSamples         = 16
	DefaultDeadline    = 5 * time.Minute
	DefaultCallTimeout = 60 * time.Second
	DefaultRetries     = 2
	MaxRetries         = 10
	DefaultMaxTokens   = 1024
)

// Rubric is one criterion.
type Rubric struct {
	// Name identifies the rubric in the record and the reward's
	// components (judge.<name>).
	Name string `json:"name"`
	// Instructions tell the judge what to assess.
	Instructions string `json:"instructions"`
	// Scale is [MIN, MAX] or a list of labels with values.
	Scale Scale `json:"scale"`
	// Weight in the weighted mean over rubrics (default 1; 0 records the
	// rubric without counting it).
	Weight *float64 `json:"weight,omitempty"`
	// Sees names the views shown: answer, diff, transcript, tool_outputs.
	Sees []string `json:"sees"`
	// MaxChars bounds each view in bytes (default 12000): a longer one
	// keeps its head and tail, and the cut is recorded.
	MaxChars int `json:"max_chars,omitempty"`
	// Tools, with tool_outputs, shows only these tools' outputs.
	Tools []string `json:"tools,omitempty"`
	// Judges, when set, names the judges that score this rubric (default
	// every judge).
	Judges []string `json:"judges,omitempty"`
}

// weight is the rubric's weight (1 when unset).
func (r *Rubric) weight() float64 {
	if r.Weight == nil {
		return 1
	}
	return *r.Weight
}

// maxChars is the rubric's bound on a view.
func (r *Rubric) maxChars() int {
	if r.MaxChars == 0 {
		return DefaultMaxChars
	}
	return r.MaxChars
}

// Scale is a rubric's score scale: a numeric range, or labels with values.
// Its JSON is [MIN, MAX] or [{"label": L, "value": V}, ...].
type Scale struct {
	Min, Max float64
	Labels   []Label
}

// Label is one point of a labelled scale.
type Label struct {
	Label string  `json:"label"`
	Value float64 `json:"value"`
}

// UnmarshalJSON implements json.Unmarshaler.
func (s *Scale) UnmarshalJSON(b []byte) error {
	var nums []float64
	if err := json.Unmarshal(b, &nums); err == nil {
		if len(nums) != 2 {
			return fmt.Errorf("a numeric scale is [MIN, MAX], got %d numbers", len(nums))
		}
		*s = Scale{Min: nums[0], Max: nums[1]}
		return nil
	}
	var labels []Label
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&labels); err != nil {
		return fmt.Errorf("want [MIN, MAX] or [{\"label\": ..., \"value\": ...}, ...], got %.60s", b)
	}
	*s = Scale{Labels: labels}
	return nil
}

// MarshalJSON implements json.Marshaler.
func (s Scale) MarshalJSON() ([]byte, error) {
	if len(s.Labels) > 0 {
		return json.Marshal(s.Labels)
	}
	return json.Marshal([]float64{s.Min, s.Max})
}

// bounds returns the scale's lowest and highest value.
func (s Scale) bounds() (lo, hi float64) {
	if len(s.Labels) == 0 {
		return s.Min, s.Max
	}
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, l := range s.Labels {
		lo, hi = min(lo, l.Value), max(hi, l.Value)
	}
	return lo, hi
}

// Normalize maps a value of the scale to 0..1.
func (s Scale) Normalize(v float64) float64 {
	lo, hi := s.bounds()
	return (v - lo) / (hi - lo)
}

// describe says the scale in the judge's prompt.
func (s Scale) describe() string {
	if len(s.Labels) == 0 {
		return fmt.Sprintf("a number from %s (worst) to %s (best)", fmtNum(s.Min), fmtNum(s.Max))
	}
	var parts []string
	for _, l := range s.Labels {
		parts = append(parts, fmt.Sprintf("%q (%s)", l.Label, fmtNum(l.Value)))
	}
	return "one of the labels " + strings.Join(parts, ", ") + " (higher values are better)"
}

func fmtNum(v float64) string { return fmt.Sprint(v) }

// Endpoint is one judge: an OpenAI-compatible chat endpoint and model.
type Endpoint struct {
	// Name identifies the judge in the record (default its model, with
	// "#N" when two judges share one).
	Name    string `json:"name,omitempty"`
	BaseURL string `json:"base_url"`
	Model   string `json:"model"`
	// APIKeyEnv names the environment variable holding the key sent as a
	// bearer token (read by the command, once).
	APIKeyEnv   string   `json:"api_key_env,omitempty"`
	Temperature *float64 `json:"temperature,omitempty"`
	MaxTokens   int      `json:"max_tokens,omitempty"`
	// MaxConcurrency bounds this endpoint's requests in flight, over every
	// episode of the process (the first spec to use the endpoint sets it;
	// default the pool's).
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// TimeoutS bounds one request (default 60 s); Retries is how many
	// times a failed or unparseable request is retried (default 2).
	TimeoutS float64 `json:"timeout_s,omitempty"`
	Retries  *int    `json:"retries,omitempty"`
}

func (e *Endpoint) timeout() time.Duration {
	if e.TimeoutS <= 0 {
		return DefaultCallTimeout
	}
	return time.Duration(e.TimeoutS * float64(time.Second))
}

func (e *Endpoint) retries() int {
	if e.Retries == nil {
		return DefaultRetries
	}
	return *e.Retries
}

func (e *Endpoint) maxTokens() int {
	if e.MaxTokens <= 0 {
		return DefaultMaxTokens
	}
	return e.MaxTokens
}

// Aggregate says how judges combine.
type Aggregate struct {
	// Judges is mean (default), median, min or trimmed_mean.
	Judges string `json:"judges,omitempty"`
	// Trim is the fraction cut from each end for trimmed_mean (default:
	// the lowest and highest score when there are three judges or more).
	Trim float64 `json:"trim,omitempty"`
}

func (s *Spec) aggregate() Aggregate {
	if s.Aggregate == nil || s.Aggregate.Judges == "" {
		a := Aggregate{Judges: AggMean}
		if s.Aggregate != nil {
			a.Trim = s.Aggregate.Trim
		}
		return a
	}
	return *s.Aggregate
}

func (s *Spec) samples() int {
	if s.Samples <= 0 {
		return DefaultSamples
	}
	return s.Samples
}

func (s *Spec) deadline() time.Duration {
	if s.DeadlineS <= 0 {
		return DefaultDeadline
	}
	return time.Duration(s.DeadlineS * float64(time.Second))
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Names fills in the judges' default names (their model, "#N" when two
// share one).
func (s *Spec) Names() {
	count := map[string]int{}
	for _, e := range s.Judges {
		if e.Name == "" {
			count[e.Model]++
		}
	}
	seen := map[string]int{}
	for i := range s.Judges {
		e := &s.Judges[i]
		if e.Name != "" {
			continue
		}
		e.Name = e.Model
		if count[e.Model] > 1 {
			seen[e.Model]++
			e.Name = fmt.Sprintf("%s#%d", e.Model, seen[e.Model])
		}
	}
}

// Validate checks the spec; field is the path to name in errors
// ("reward"). It fills in the judges' default names.
func (s *Spec) Validate(field string) error {
	if len(s.Judges) == 0 {
		return fmt.Errorf("%s.judges: at least one judge is required ({\"base_url\": URL, \"model\": NAME})", field)
	}
	s.Names()
	judges := map[string]int{}
	for i, e := range s.Judges {
		f := fmt.Sprintf("%s.judges[%d]", field, i)
		u, err := url.Parse(e.BaseURL)
		if e.BaseURL == "" {
			return fmt.Errorf("%s.base_url: required (the judge's OpenAI-compatible API root, e.g. http://127.0.0.1:8001/v1)", f)
		}
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%s.base_url: %q is not an http or https URL", f, e.BaseURL)
		}
		if strings.TrimSpace(e.Model) == "" {
			return fmt.Errorf("%s.model: required", f)
		}
		if len(e.Name) > 128 || strings.IndexFunc(e.Name, unicode.IsControl) >= 0 {
			return fmt.Errorf("%s.name: %q: at most 128 characters, no control characters", f, e.Name)
		}
		if j, dup := judges[e.Name]; dup {
			return fmt.Errorf("%s.name: %q is also judges[%d]'s name", f, e.Name, j)
		}
		judges[e.Name] = i
		switch {
		case e.Temperature != nil && (*e.Temperature < 0 || *e.Temperature > 10):
			return fmt.Errorf("%s.temperature: %v is outside 0..10", f, *e.Temperature)
		case e.MaxTokens < 0:
			return fmt.Errorf("%s.max_tokens: %d is negative", f, e.MaxTokens)
		case e.MaxConcurrency < 0:
			return fmt.Errorf("%s.max_concurrency: %d is negative", f, e.MaxConcurrency)
		case e.TimeoutS < 0:
			return fmt.Errorf("%s.timeout_s: %v is negative", f, e.TimeoutS)
		case e.Retries != nil && (*e.Retries < 0 || *e.Retries > MaxRetries):
			return fmt.Errorf("%s.retries: %d is outside 0..%d", f, *e.Retries, MaxRetries)
		}
	}
	if len(s.Rubrics) == 0 {
		return fmt.Errorf("%s.rubrics: at least one rubric is required", field)
	}
	rubrics := map[string]int{}
	var wsum float64
	for i := range s.Rubrics {
		r := &s.Rubrics[i]
		f := fmt.Sprintf("%s.rubrics[%d]", field, i)
		if !nameRe.MatchString(r.Name) {
			return fmt.Errorf("%s.name: %q: use letters, digits, '.', '_' and '-' (at most 64, not starting with a symbol)", f, r.Name)
		}
		if j, dup := rubrics[r.Name]; dup {
			return fmt.Errorf("%s.name: %q is also rubrics[%d]'s name", f, r.Name, j)
		}
		rubrics[r.Name] = i
		if strings.TrimSpace(r.Instructions) == "" {
			return fmt.Errorf("%s.instructions: required (what the judge assesses)", f)
		}
		if err := r.Scale.validate(); err != nil {
			return fmt.Errorf("%s.scale: %v", f, err)
		}
		if w := r.weight(); w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return fmt.Errorf("%s.weight: %v is not a non-negative number", f, w)
		}
		wsum += r.weight()
		if len(r.Sees) == 0 {
			return fmt.Errorf("%s.sees: required: one or more of %s", f, strings.Join(SeesValues(), ", "))
		}
		seen := map[string]bool{}
		for j, v := range r.Sees {
			if !slices.Contains(SeesValues(), v) {
				return fmt.Errorf("%s.sees[%d]: %q is not one of %s", f, j, v, strings.Join(SeesValues(), ", "))
			}
			if seen[v] {
				return fmt.Errorf("%s.sees[%d]: %q named twice", f, j, v)
			}
			seen[v] = true
		}
		if r.MaxChars != 0 && r.MaxChars < MinMaxChars {
			return fmt.Errorf("%s.max_chars: %d is below the minimum of %d", f, r.MaxChars, MinMaxChars)
		}
		if len(r.Tools) > 0 && !seen[SeesToolOutputs] {
			return fmt.Errorf("%s.tools: only with sees tool_outputs (it selects which tools' outputs are shown)", f)
		}
		for j, name := range r.Judges {
			if _, ok := judges[name]; !ok {
				return fmt.Errorf("%s.judges[%d]: no judge is named %q", f, j, name)
			}
		}
	}
	if wsum <= 0 {
		return fmt.Errorf("%s.rubrics: the weights sum to 0: give at least one rubric a positive weight", field)
	}
	a := s.aggregate()
	if !slices.Contains(Aggregations(), a.Judges) {
		return fmt.Errorf("%s.aggregate.judges: %q is not one of %s", field, a.Judges, strings.Join(Aggregations(), ", "))
	}
	if a.Trim < 0 || a.Trim >= 0.5 {
		return fmt.Errorf("%s.aggregate.trim: %v is outside [0, 0.5)", field, a.Trim)
	}
	if a.Trim != 0 && a.Judges != AggTrimmedMean {
		return fmt.Errorf("%s.aggregate.trim: only with judges trimmed_mean", field)
	}
	if s.Samples < 0 || s.Samples > MaxSamples {
		return fmt.Errorf("%s.samples: %d is outside 1..%d", field, s.Samples, MaxSamples)
	}
	if s.DeadlineS < 0 {
		return fmt.Errorf("%s.deadline_s: %v is negative", field, s.DeadlineS)
	}
	return nil
}

func (s Scale) validate() error {
	if len(s.Labels) == 0 {
		if math.IsNaN(s.Min) || math.IsNaN(s.Max) || math.IsInf(s.Min, 0) || math.IsInf(s.Max, 0) || s.Max <= s.Min {
			return fmt.Errorf("[%v, %v]: MAX must be above MIN", s.Min, s.Max)
		}
		return nil
	}
	if len(s.Labels) < 2 {
		return fmt.Errorf("a labelled scale needs at least two labels")
	}
	seen := map[string]bool{}
	for i, l := range s.Labels {
		k := strings.ToLower(strings.TrimSpace(l.Label))
		if k == "" {
			return fmt.Errorf("[%d].label: empty", i)
		}
		if seen[k] {
			return fmt.Errorf("[%d].label: %q named twice", i, l.Label)
		}
		seen[k] = true
		if math.IsNaN(l.Value) || math.IsInf(l.Value, 0) {
			return fmt.Errorf("[%d].value: not a number", i)
		}
	}
	if lo, hi := s.bounds(); hi <= lo {
		return fmt.Errorf("every label has the value %v: a scale needs two different values", lo)
	}
	return nil
}

// JudgesOf returns the judges that score rubric r.
func (s *Spec) JudgesOf(r *Rubric) []*Endpoint {
	var out []*Endpoint
	for i := range s.Judges {
		if len(r.Judges) == 0 || slices.Contains(r.Judges, s.Judges[i].Name) {
			out = append(out, &s.Judges[i])
		}
	}
	return out
}

// Sees reports whether any rubric shows view v.
func (s *Spec) Sees(v string) bool {
	for _, r := range s.Rubrics {
		if slices.Contains(r.Sees, v) {
			return true
		}
	}
	return false
}

// APIKeyEnvs lists the environment variables the judges' keys are in.
func (s *Spec) APIKeyEnvs() []string {
	var out []string
	for _, e := range s.Judges {
		if e.APIKeyEnv != "" && !slices.Contains(out, e.APIKeyEnv) {
			out = append(out, e.APIKeyEnv)
		}
	}
	return out
}
