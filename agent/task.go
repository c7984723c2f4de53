package agent

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/rollbox/rollbox/agent/monitor"
	"github.com/rollbox/rollbox/agent/reward"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// Task is one line of a task file.
type Task struct {
	ID     string `json:"id"`
	Prompt string `json:"prompt"`
	// System replaces the default system prompt.
	System  string      `json:"system,omitempty"`
	Sandbox TaskSandbox `json:"sandbox"`
	// Files are seeded before the episode starts (path → UTF-8 content);
	// FilesBase64 holds binary ones.
	Files       map[string]string `json:"files,omitempty"`
	FilesBase64 map[string]string `json:"files_base64,omitempty"`
	Workspace   *Workspace        `json:"workspace,omitempty"`
	Tools       []string          `json:"tools,omitempty"`
	// Reward scores the episode. A "tests" reward runs its command after
	// the episode in a fresh sandbox of this task's backend and spec, with
	// the task's files, the agent's changes it takes (reward.editable, or
	// all but reward.protect and reward.deny), and reward.hidden_tests; it
	// scores the runner's report of named tests (reward.report,
	// reward.must_pass, reward.score) or, weaker, the exit status. See
	// package reward and the README's "Tests rewards".
	Reward reward.Spec `json:"reward"`
	// Monitors configures the reward-hacking monitors (thresholds) and
	// the penalties some of them add to the reward (package agent/monitor).
	Monitors  *monitor.Config `json:"monitors,omitempty"`
	Limits    EpisodeLimits   `json:"limits"`
	Retriever *Retriever      `json:"retriever,omitempty"`
	// Prefix is turns every episode starts with, run once per group and
	// forked (see Prefix and PrefixGroup).
	Prefix *Prefix `json:"prefix,omitempty"`
	// Orchestrator makes the task's episodes orchestrator episodes: the
	// policy gets spawn_subagents and frozen sub-agents run the sub-tasks
	// it gives (see Orchestrator).
	Orchestrator *Orchestrator `json:"orchestrator,omitempty"`
	// Seed is passed to the policy's sampling when set, and pinned in the trajectory.
	Seed     *int64         `json:"seed,omitempty"`
	Metadata map[string]any `json:"metadata,omitempty"`

	// dir is the task file's directory: relative workspace paths resolve there.
	dir string
}

// TaskSandbox is a task's "sandbox" object.
type TaskSandbox struct {
	Backend string            `json:"backend,omitempty"`
	Image   string            `json:"image,omitempty"`
	Runtime string            `json:"runtime,omitempty"`
	Network string            `json:"network,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	Limits  TaskLimits        `json:"limits"`
}

// TaskLimits are a task's sandbox limits in the task file's units.
type TaskLimits struct {
	CPUs         float64 `json:"cpus,omitempty"`
	MemoryMB     int     `json:"memory_mb,omitempty"`
	PIDs         int     `json:"pids,omitempty"`
	DiskMB       int     `json:"disk_mb,omitempty"`
	TmpMB        int     `json:"tmp_mb,omitempty"`
	ExecTimeoutS float64 `json:"exec_timeout_s,omitempty"`
}

// Workspace copies a host tree (a directory or a .tar) in before the episode.
type Workspace struct {
	From string `json:"from"`
	To   string `json:"to,omitempty"`
}

// Retriever names a search task's index.
type Retriever struct {
	Index string `json:"index"`
	// ContextTokens is the budget of documents held in context (default: the
	// episode's max_context_tokens / 2).
	ContextTokens int64 `json:"context_tokens,omitempty"`
}

// EpisodeLimits bound one episode.
type EpisodeLimits struct {
	MaxTurns           int `json:"max_turns,omitempty"`
	MaxToolOutputBytes int `json:"max_tool_output_bytes,omitempty"`
	MaxContextTokens   int `json:"max_context_tokens,omitempty"`
	// ContextOverflow is "end" (default) or "truncate" (drop the oldest tool
	// outputs from the context until it fits).
	ContextOverflow string  `json:"context_overflow,omitempty"`
	EpisodeTimeoutS float64 `json:"episode_timeout_s,omitempty"`
	// IdleTimeoutS stops a command that prints nothing for that long.
	IdleTimeoutS float64 `json:"idle_timeout_s,omitempty"`
	// MaxStoredOutputBytes caps each stream of a command kept in the
	// trajectory (head and tail); what it drops is counted.
	MaxStoredOutputBytes int `json:"max_stored_output_bytes,omitempty"`
}

// Validate checks episode limits against their documented ranges; errors
// name the field under "limits.".
func (l EpisodeLimits) Validate() error {
	r := ranges
	switch {
	case l.MaxTurns < 0 || l.MaxTurns > r.MaxTurns:
		return fmt.Errorf("limits.max_turns: %d is outside 1..%d", l.MaxTurns, r.MaxTurns)
	case l.MaxToolOutputBytes < 0 || l.MaxToolOutputBytes > r.MaxToolOutputBytes:
		return fmt.Errorf("limits.max_tool_output_bytes: %d is outside 64..%d", l.MaxToolOutputBytes, r.MaxToolOutputBytes)
	case l.MaxToolOutputBytes > 0 && l.MaxToolOutputBytes < 64:
		return fmt.Errorf("limits.max_tool_output_bytes: %d is below the minimum of 64", l.MaxToolOutputBytes)
	case l.MaxContextTokens < 0 || l.MaxContextTokens > r.MaxContextTokens:
		return fmt.Errorf("limits.max_context_tokens: %d is outside 0..%d", l.MaxContextTokens, r.MaxContextTokens)
	case l.EpisodeTimeoutS < 0 || l.EpisodeTimeoutS > r.EpisodeTimeoutS:
		return fmt.Errorf("limits.episode_timeout_s: %v is outside 0..%v (a week)", l.EpisodeTimeoutS, r.EpisodeTimeoutS)
	case l.IdleTimeoutS < 0 || l.IdleTimeoutS > r.IdleTimeoutS:
		return fmt.Errorf("limits.idle_timeout_s: %v is outside 0..%v (a day)", l.IdleTimeoutS, r.IdleTimeoutS)
	case l.MaxStoredOutputBytes < 0 || l.MaxStoredOutputBytes > r.MaxStoredOutputBytes:
		return fmt.Errorf("limits.max_stored_output_bytes: %d is outside 0..%d (1 GiB)", l.MaxStoredOutputBytes, r.MaxStoredOutputBytes)
	}
	switch l.ContextOverflow {
	case "", "end", "truncate":
	default:
		return fmt.Errorf("limits.context_overflow %q is not one of end, truncate", l.ContextOverflow)
	}
	return nil
}

// Episode limit defaults.
const (
	DefaultMaxTurns             = 30
	DefaultMaxToolOutputBytes   = 16384
	DefaultMaxContextTokens     = 32768
	DefaultEpisodeTimeout       = 30 * time.Minute
	DefaultMaxStoredOutputBytes = 1 << 20
)

// ranges is the documented range of every number a task may set, checked by
// Validate (the rollout service may bound them lower: rollbox serve
// --max-limits). Beyond these a value is not one anybody means, and a
// duration past ~292 years overflows.
var ranges = struct {
	MaxTurns, MaxToolOutputBytes, MaxContextTokens, MaxStoredOutputBytes int
	EpisodeTimeoutS, IdleTimeoutS, ExecTimeoutS                          float64
	PIDs, DiskMB                                                         int
}{
	MaxTurns: 10000, MaxToolOutputBytes: 64 << 20, MaxContextTokens: 10_000_000, MaxStoredOutputBytes: 1 << 30,
	EpisodeTimeoutS: 7 * 86400, IdleTimeoutS: 86400, ExecTimeoutS: 86400,
	PIDs: 4194304, DiskMB: 16 << 20,
}

var taskIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// WithDefaults fills unset limits and tools.
func (t *Task) WithDefaults() {
	l := &t.Limits
	if l.MaxTurns == 0 {
		l.MaxTurns = DefaultMaxTurns
	}
	if l.MaxToolOutputBytes == 0 {
		l.MaxToolOutputBytes = DefaultMaxToolOutputBytes
	}
	if l.MaxContextTokens == 0 {
		l.MaxContextTokens = DefaultMaxContextTokens
	}
	if l.ContextOverflow == "" {
		l.ContextOverflow = "end"
	}
	if l.EpisodeTimeoutS == 0 {
		l.EpisodeTimeoutS = DefaultEpisodeTimeout.Seconds()
	}
	if l.MaxStoredOutputBytes == 0 {
		l.MaxStoredOutputBytes = DefaultMaxStoredOutputBytes
	}
	if len(t.Tools) == 0 && t.Retriever != nil {
		t.Tools = tools.DefaultSearchNames()
	}
	if len(t.Tools) == 0 {
		t.Tools = tools.DefaultNames(t.Reward.TestCommand() != "")
	}
	if t.Orchestrator != nil && !slices.Contains(t.Tools, NameSpawnSubagents) {
		// The orchestrator's own tool, offered before finish.
		i := slices.Index(t.Tools, tools.NameFinish)
		if i < 0 {
			i = len(t.Tools)
		}
		t.Tools = slices.Insert(slices.Clone(t.Tools), i, NameSpawnSubagents)
	}
	if t.Orchestrator != nil && t.Orchestrator.Async {
		// Asynchronous spawning's tools, after spawn_subagents.
		for _, name := range []string{NameWait, NameCollect} {
			if !slices.Contains(t.Tools, name) {
				i := slices.Index(t.Tools, tools.NameFinish)
				if i < 0 {
					i = len(t.Tools)
				}
				t.Tools = slices.Insert(slices.Clone(t.Tools), i, name)
			}
		}
	}
}

// SandboxSpec is the sandbox the task asks for.
func (t *Task) SandboxSpec() sandbox.Spec {
	s := t.Sandbox
	return sandbox.Spec{
		Image: s.Image, Runtime: s.Runtime, Network: s.Network, Env: s.Env, Workdir: s.Workdir,
		Limits: sandbox.Limits{
			CPUs: s.Limits.CPUs, MemoryMB: s.Limits.MemoryMB, PIDs: s.Limits.PIDs,
			DiskMB: s.Limits.DiskMB, TmpMB: s.Limits.TmpMB,
			ExecTimeout: time.Duration(s.Limits.ExecTimeoutS * float64(time.Second)),
		},
	}
}

// Validate checks every field; the error names the field.
func (t *Task) Validate(knownTools func(string) bool) error {
	if t.ID == "" {
		return errors.New("id: required")
	}
	if !taskIDRe.MatchString(t.ID) {
		return fmt.Errorf("id %q: use letters, digits, '.', '_' and '-' (at most 128, not starting with a symbol)", t.ID)
	}
	if strings.TrimSpace(t.Prompt) == "" {
		return errors.New("prompt: required")
	}
	if b := t.Sandbox.Backend; b != "" {
		if err := sandbox.CheckBackend(b); err != nil {
			return fmt.Errorf("sandbox.backend %v", err)
		}
	}
	if sl := t.Sandbox.Limits; sl.ExecTimeoutS < 0 || sl.ExecTimeoutS > ranges.ExecTimeoutS {
		return fmt.Errorf("sandbox.limits.exec_timeout_s: %v is outside 0..%v", sl.ExecTimeoutS, ranges.ExecTimeoutS)
	} else if sl.PIDs > ranges.PIDs {
		return fmt.Errorf("sandbox.limits.pids: %d is above %d (the kernel's most)", sl.PIDs, ranges.PIDs)
	} else if sl.DiskMB > ranges.DiskMB {
		return fmt.Errorf("sandbox.limits.disk_mb: %d is above %d (16 TiB)", sl.DiskMB, ranges.DiskMB)
	} else if sl.TmpMB > ranges.DiskMB {
		return fmt.Errorf("sandbox.limits.tmp_mb: %d is above %d (16 TiB)", sl.TmpMB, ranges.DiskMB)
	}
	if err := t.SandboxSpec().Validate(); err != nil {
		var fe *sandbox.FieldError
		if errors.As(err, &fe) {
			return fmt.Errorf("sandbox.%s: %s", fe.Field, fe.Message)
		}
		return err
	}
	for p := range t.Files {
		if !path.IsAbs(p) || path.Clean(p) != p {
			return fmt.Errorf("files: %q is not a clean absolute path", p)
		}
	}
	for p, b := range t.FilesBase64 {
		if !path.IsAbs(p) || path.Clean(p) != p {
			return fmt.Errorf("files_base64: %q is not a clean absolute path", p)
		}
		if _, err := base64.StdEncoding.DecodeString(b); err != nil {
			return fmt.Errorf("files_base64[%q]: %v", p, err)
		}
		if _, dup := t.Files[p]; dup {
			return fmt.Errorf("files_base64[%q]: also given in files", p)
		}
	}
	if t.Workspace != nil {
		if t.Workspace.From == "" {
			return errors.New("workspace.from: required")
		}
		if t.Workspace.To != "" && !path.IsAbs(t.Workspace.To) {
			return fmt.Errorf("workspace.to: %q is not absolute", t.Workspace.To)
		}
		if _, err := os.Stat(t.WorkspacePath()); err != nil {
			return fmt.Errorf("workspace.from: %v", err)
		}
	}
	seen := map[string]bool{}
	for i, name := range t.Tools {
		if name == NameSpawnSubagents {
			if t.Orchestrator == nil {
				return fmt.Errorf("tools[%d]: %s needs an orchestrator: {\"orchestrator\": {\"subagent_policy\": ...}}", i, name)
			}
		} else if name == NameWait || name == NameCollect {
			if t.Orchestrator == nil || !t.Orchestrator.Async {
				return fmt.Errorf("tools[%d]: %s needs an asynchronous orchestrator: {\"orchestrator\": {\"async\": true, ...}}", i, name)
			}
		} else if knownTools != nil && !knownTools(name) {
			return fmt.Errorf("tools[%d]: unknown tool %q", i, name)
		}
		if seen[name] {
			return fmt.Errorf("tools[%d]: %q named twice", i, name)
		}
		seen[name] = true
	}
	if err := t.Reward.Validate("reward"); err != nil {
		return err
	}
	workdir := t.Sandbox.Workdir
	if workdir == "" {
		workdir = sandbox.DefaultWorkdir
	}
	if err := t.Reward.CheckPaths("reward", workdir, func(p string) bool {
		_, a := t.Files[p]
		_, b := t.FilesBase64[p]
		return a || b
	}); err != nil {
		return err
	}
	if t.Monitors != nil {
		if err := t.Monitors.Validate("monitors"); err != nil {
			return err
		}
	}
	if seen[tools.NameRunTests] && t.Reward.TestCommand() == "" {
		return errors.New("tools: run_tests needs a reward of type tests (its command is what run_tests runs)")
	}
	if err := t.Limits.Validate(); err != nil {
		return err
	}
	r := ranges
	if t.Retriever != nil && t.Retriever.Index == "" {
		return errors.New("retriever.index: required")
	}
	if t.Retriever != nil && (t.Retriever.ContextTokens < 0 || t.Retriever.ContextTokens > int64(r.MaxContextTokens)) {
		return fmt.Errorf("retriever.context_tokens: %d is outside 0..%d", t.Retriever.ContextTokens, r.MaxContextTokens)
	}
	if t.Reward.Type == "parl" && t.Orchestrator == nil {
		return errors.New("reward.type parl: needs an orchestrator task (\"orchestrator\": {...}): it rewards the sub-agents an orchestrator spawns")
	}
	if t.Orchestrator != nil && t.Prefix != nil {
		return errors.New("orchestrator: a task with a prefix cannot be an orchestrator task (yet): the prefix's forks would share its sub-agents")
	}
	if t.Orchestrator != nil {
		if err := t.Orchestrator.validate(knownTools, t.Retriever != nil); err != nil {
			return err
		}
	}
	if t.Retriever == nil {
		for i, name := range t.Tools {
			if slices.Contains(tools.SearchNames(), name) {
				return fmt.Errorf("tools[%d]: %s needs a retriever: {\"retriever\": {\"index\": \"DIR\"}}", i, name)
			}
		}
	}
	if _, err := t.prefixTurns(); err != nil {
		return err
	}
	return nil
}

// SetDir makes t a task read from a task file in dir: relative workspace
// and index paths resolve there (a cluster worker's copy of a
// coordinator's task, decoded from JSON, which does not carry it).
func (t *Task) SetDir(dir string) { t.dir = dir }

// Dir is the absolute directory of the task file the task was read from
// ("" for a task without a file): relative workspace and index paths
// resolve there.
func (t *Task) Dir() string {
	if t.dir == "" {
		return ""
	}
	if abs, err := filepath.Abs(t.dir); err == nil {
		return abs
	}
	return t.dir
}

// IndexPath is the retriever's index directory resolved against the task
// file's directory ("" without a retriever).
func (t *Task) IndexPath() string {
	if t.Retriever == nil {
		return ""
	}
	if filepath.IsAbs(t.Retriever.Index) || t.dir == "" {
		return t.Retriever.Index
	}
	return filepath.Join(t.dir, t.Retriever.Index)
}

// ContextTokens is the budget of documents a search episode may hold in
// its context: retriever.context_tokens, or half of max_context_tokens.
func (t *Task) ContextTokens() int64 {
	if t.Retriever != nil && t.Retriever.ContextTokens > 0 {
		return t.Retriever.ContextTokens
	}
	return int64(t.Limits.MaxContextTokens) / 2
}

// WorkspacePath is the workspace source resolved against the task file's directory.
func (t *Task) WorkspacePath() string {
	if t.Workspace == nil {
		return ""
	}
	if filepath.IsAbs(t.Workspace.From) || t.dir == "" {
		return t.Workspace.From
	}
	return filepath.Join(t.dir, t.Workspace.From)
}

// SeedFiles returns the files the task seeds: inline ones and the workspace.
func (t *Task) SeedFiles(workdir string) ([]sandbox.File, error) {
	var out []sandbox.File
	if t.Workspace != nil {
		to := t.Workspace.To
		if to == "" {
			to = workdir
		}
		fs, err := sandbox.FilesFromHost(t.WorkspacePath(), to)
		if err != nil {
			return nil, fmt.Errorf("task %q workspace: %w", t.ID, err)
		}
		out = append(out, fs...)
	}
	for p, c := range t.Files {
		out = append(out, sandbox.File{Path: p, Data: []byte(c), Mode: 0o644})
	}
	for p, c := range t.FilesBase64 {
		b, _ := base64.StdEncoding.DecodeString(c)
		out = append(out, sandbox.File{Path: p, Data: b, Mode: 0o644})
	}
	return out, nil
}

// Hash is the sha256 of the task's canonical JSON.
func (t *Task) Hash() string {
	b, _ := json.Marshal(t)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// ParseTask decodes one task, refusing unknown fields, and validates it.
// Relative workspace paths resolve against dir.
func ParseTask(line []byte, dir string, knownTools func(string) bool) (*Task, error) {
	t, err := decodeTask(line)
	if err != nil {
		return t, err
	}
	t.dir = dir
	if err := t.Validate(knownTools); err != nil {
		return t, err
	}
	t.WithDefaults()
	return t, nil
}

func decodeTask(line []byte) (*Task, error) {
	var t Task
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return nil, describeJSONError(err)
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value on the line")
	}
	return &t, nil
}

func describeJSONError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		return fmt.Errorf("%s: want %s, got %s", te.Field, jsonKind(te.Type), jsonValueKind(te.Value))
	case errors.As(err, &se):
		return fmt.Errorf("not valid JSON at byte %d: %v", se.Offset, err)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Errorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return fmt.Errorf("not valid JSON: %v", err)
}

// jsonKind names what a task file must hold to decode into t, in JSON's
// words: "an object", "an array of strings", ...
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.Struct:
		if t == reflect.TypeOf(json.RawMessage{}) {
			return "any JSON value"
		}
		return "an object"
	case reflect.Map:
		return "an object of " + plural(t.Elem())
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "any JSON value"
		}
		return "an array of " + plural(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "a JSON value"
}

func plural(t reflect.Type) string {
	k := strings.TrimPrefix(strings.TrimPrefix(jsonKind(t), "a "), "an ")
	switch {
	case strings.HasPrefix(k, "object"), strings.HasPrefix(k, "array"), strings.HasPrefix(k, "string"), strings.HasPrefix(k, "integer"), strings.HasPrefix(k, "number"):
		head, rest, _ := strings.Cut(k, " ")
		if rest != "" {
			return head + "s " + rest
		}
		return head + "s"
	}
	return k
}

// jsonValueKind names the JSON value json.UnmarshalTypeError saw ("string",
// "number", "object", "array", "bool").
func jsonValueKind(v string) string {
	switch {
	case v == "bool":
		return "true or false"
	case v == "array" || v == "object":
		return "an " + v
	case strings.HasPrefix(v, "number "):
		return "a number (" + strings.TrimSpace(strings.TrimPrefix(v, "number")) + ")"
	case v == "number":
		return "a number"
	}
	return "a " + v
}

// LoadTasks reads a JSONL task file whole. Any bad line refuses the file,
// naming the line, the task and the field; duplicate ids are refused.
func LoadTasks(file string, knownTools func(string) bool) ([]*Task, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTasks(f, file, knownTools)
}

// ReadTasks is LoadTasks over a reader; name is used in messages and its
// directory resolves relative workspace paths.
func ReadTasks(r io.Reader, name string, knownTools func(string) bool) ([]*Task, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	var out []*Task
	ids := map[string]int{}
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		dir := ""
		if name != "" {
			dir = filepath.Dir(name)
		}
		t, err := ParseTask(line, dir, knownTools)
		if err != nil {
			if t != nil && t.ID != "" {
				return nil, fmt.Errorf("%s line %d: task %q: %w", name, n, t.ID, err)
			}
			return nil, fmt.Errorf("%s line %d: %w", name, n, err)
		}
		if prev, dup := ids[t.ID]; dup {
			return nil, fmt.Errorf("%s line %d: task id %q already used on line %d", name, n, t.ID, prev)
		}
		ids[t.ID] = n
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s line %d: %w", name, n+1, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no tasks", name)
	}
	return out, nil
}

// CheckJudges refuses a task whose judges include the policy itself (the
// same endpoint and model): a policy must not grade its own episodes. A
// policy without an endpoint (scripted, replay, environment mode) passes.
func CheckJudges(t *Task, p trajectory.Policy) error {
	if p.Endpoint == "" {
		return nil
	}
	return checkJudges(&t.Reward, "reward", p)
}

func checkJudges(s *reward.Spec, field string, p trajectory.Policy) error {
	norm := func(u string) string { return strings.TrimRight(strings.TrimSpace(u), "/") }
	for i, j := range s.Judges {
		if norm(j.BaseURL) == norm(p.Endpoint) && j.Model == p.Model {
			return fmt.Errorf("%s.judges[%d]: %s model %q is the policy's own endpoint and model: a judge must be a distinct endpoint or model", field, i, j.BaseURL, j.Model)
		}
	}
	if s.Perf != nil {
		if err := checkJudges(s.Perf, field+".perf", p); err != nil {
			return err
		}
	}
	for i := range s.Parts {
		if err := checkJudges(&s.Parts[i].Reward, fmt.Sprintf("%s.parts[%d].reward", field, i), p); err != nil {
			return err
		}
	}
	return nil
}

// JudgeKeyField names the first judge of the task's reward that asks for
// an API key from the environment ("reward.parts[1].reward.judges[0].api_key_env"),
// "" when none does.
func JudgeKeyField(t *Task) string { return judgeKeyField(&t.Reward, "reward") }

func judgeKeyField(s *reward.Spec, field string) string {
	for i, j := range s.Judges {
		if j.APIKeyEnv != "" {
			return fmt.Sprintf("%s.judges[%d].api_key_env", field, i)
		}
	}
	if s.Perf != nil {
		if f := judgeKeyField(s.Perf, field+".perf"); f != "" {
			return f
		}
	}
	for i := range s.Parts {
		if f := judgeKeyField(&s.Parts[i].Reward, fmt.Sprintf("%s.parts[%d].reward", field, i)); f != "" {
			return f
		}
	}
	return ""
}
