package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// ErrorKind says why a tool step failed. It is a closed list (ErrorKinds),
// recorded as a trajectory step's error_kind and counted in summaries and
// metrics; the trajectory's JSON Schema lists the same.
type ErrorKind string

// The error kinds. The tools set the first five and sandbox_error; the agent
// loop sets output_truncated (it cuts the output for the model), timeout
// (the episode's deadline), cancelled (the run was interrupted or the
// episode cancelled while the call ran), sandbox_error and sandbox_abuse (a
// sandbox that failed under a call, or that the call's own command broke).
const (
	KindBadArguments    ErrorKind = "bad_arguments"
	KindUnknownTool     ErrorKind = "unknown_tool"
	KindTimeout         ErrorKind = "timeout"
	KindNonzeroExit     ErrorKind = "nonzero_exit"
	KindOOM             ErrorKind = "oom"
	KindOutputTruncated ErrorKind = "output_truncated"
	KindSandbox         ErrorKind = "sandbox_error"
	KindPolicy          ErrorKind = "policy_error"
	// KindSandboxAbuse: the call's own command broke the sandbox (killed,
	// froze or exhausted what serves it); the episode ends sandbox_abuse.
	KindSandboxAbuse ErrorKind = "sandbox_abuse"
	// KindCancelled: the call was killed because the episode was cancelled
	// or the run interrupted (SIGINT, SIGTERM, DELETE), not for its own
	// sake; the episode ends cancelled or interrupted, unscored.
	KindCancelled ErrorKind = "cancelled"
)

// ErrorKinds is the closed list, in order.
func ErrorKinds() []ErrorKind {
	return []ErrorKind{KindBadArguments, KindUnknownTool, KindTimeout, KindNonzeroExit, KindOOM, KindOutputTruncated, KindSandbox, KindPolicy, KindSandboxAbuse, KindCancelled}
}

// Sandbox is what the tools need of a sandbox.
type Sandbox interface {
	Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Result, error)
	ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error)
	WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error
}

// Env is the episode-side context a tool runs in.
type Env struct {
	Sandbox Sandbox
	Workdir string
	// ExecTimeout is the default and the ceiling of a command's timeout.
	ExecTimeout time.Duration
	// IdleTimeout stops a command that prints nothing for that long.
	IdleTimeout time.Duration
	// StoreCap caps each stream kept of a command (head and tail).
	StoreCap int
	// TestCommand is what run_tests runs; TestTimeout bounds it.
	TestCommand string
	TestTimeout time.Duration
	// PythonArgv runs a python program from a file: argv + path.
	PythonArgv []string
	// Extra carries tool-specific state (the retriever's context ledger).
	Extra map[string]any
}

// Finish is what the finish tool was given.
type Finish struct {
	Answer *string  `json:"answer,omitempty"`
	IDs    []string `json:"ids,omitempty"`
}

// Result is what a call did. Text is the tool's whole textual answer, before
// the agent loop cuts it to the model's budget.
type Result struct {
	Text string
	// Notes are the spans of Text that are the tool's own words, not the
	// output (a command's stdout and stderr; for other tools the whole
	// text is output): headers, status lines, and the markers where a
	// cap dropped output. Sorted, not overlapping.
	Notes     []Note
	ErrorKind ErrorKind // "" or one of ErrorKinds
	Err       string    // a short description when ErrorKind is set
	ExitCode  *int
	Signal    string
	TimedOut  bool
	OOMKilled bool
	// Stdout and Stderr are the command's streams as kept (StoreCap, head
	// and tail); the Dropped counts are what the cap dropped.
	Stdout, Stderr               []byte
	StdoutDropped, StderrDropped int64
	Finish                       *Finish
	// Files maps paths the tool wrote to their sha256.
	Files map[string]string
	// Events are context events the tool caused (retrieval tools).
	Events []Event
}

// Note is a span Text[Start:End] of a Result's text that is not output.
// Stands is how many bytes of output it stands for: a cap's marker stands
// for the bytes the cap dropped, anything else for none. The agent loop
// counts a step's bytes_dropped from them: the output's bytes the model did
// not see.
type Note struct {
	Start, End int
	Stands     int64
}

// Event is a context event a tool reports to the loop.
type Event struct {
	Kind   string
	Detail string
	IDs    []string
	Tokens int64
}

// Tool is one callable tool.
type Tool interface {
	Schema() Schema
	// Run executes a call whose arguments already passed the schema. A
	// returned error means the sandbox failed; everything else is a Result.
	Run(ctx context.Context, env *Env, args map[string]any) (Result, error)
}

// Registry is the set of tools offered in an episode, in order.
type Registry struct {
	tools map[string]Tool
	order []string
	specs map[string]*param
}

// NewRegistry builds a registry of tools in the given order. Duplicate names
// are an error.
func NewRegistry(ts ...Tool) (*Registry, error) {
	r := &Registry{tools: map[string]Tool{}, specs: map[string]*param{}}
	for _, t := range ts {
		s := t.Schema()
		if _, dup := r.tools[s.Name]; dup {
			return nil, fmt.Errorf("tools: %q registered twice", s.Name)
		}
		var p param
		if err := json.Unmarshal(s.Parameters, &p); err != nil {
			return nil, fmt.Errorf("tools: %s schema: %w", s.Name, err)
		}
		r.tools[s.Name] = t
		r.specs[s.Name] = &p
		r.order = append(r.order, s.Name)
	}
	return r, nil
}

// Names lists the tools in order.
func (r *Registry) Names() []string { return append([]string(nil), r.order...) }

// Schemas lists the tool definitions in order.
func (r *Registry) Schemas() []Schema {
	out := make([]Schema, 0, len(r.order))
	for _, n := range r.order {
		out = append(out, r.tools[n].Schema())
	}
	return out
}

// Has reports whether name is offered.
func (r *Registry) Has(name string) bool { _, ok := r.tools[name]; return ok }

// Call parses and validates raw arguments and runs the named tool. Unknown
// tools and bad arguments are Results the model reads; a returned error is a
// sandbox failure.
func (r *Registry) Call(ctx context.Context, env *Env, name, rawArgs string) (Result, error) {
	t, ok := r.tools[name]
	if !ok {
		return failf(KindUnknownTool, "unknown tool %q; the tools are: %s", name, strings.Join(r.order, ", ")), nil
	}
	args, err := ParseArguments(rawArgs)
	if err != nil {
		return failf(KindBadArguments, "%s: %v", name, err), nil
	}
	if err := r.specs[name].validate("", args); err != nil {
		return failf(KindBadArguments, "%s: %v", name, err), nil
	}
	return t.Run(ctx, env, args)
}

// ParseArguments decodes a tool call's argument text into an object. Empty
// text is an empty object (models often send "" for no arguments).
func ParseArguments(raw string) (map[string]any, error) {
	if strings.TrimSpace(raw) == "" {
		return map[string]any{}, nil
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("arguments are not valid JSON: %v", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("arguments hold more than one JSON value")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("arguments must be a JSON object, got %s", jsonType(v))
	}
	return obj, nil
}

func failf(kind ErrorKind, format string, args ...any) Result {
	msg := fmt.Sprintf(format, args...)
	return Result{ErrorKind: kind, Err: msg, Text: "error: " + msg}
}

// Tool names: the closed list a task's "tools", a policy's calls and a
// trajectory's tool steps use (each tool's Schema carries its own).
const (
	NameBash      = "bash"
	NamePython    = "python"
	NameReadFile  = "read_file"
	NameWriteFile = "write_file"
	NameEdit      = "edit"
	NameRunTests  = "run_tests"
	NameFinish    = "finish"
	// The retrieval tools (SearchTools), for tasks with a retriever.
	NameSearch = "search"
	NameRead   = "read"
	NamePrune  = "prune"
)

// builtins are the tools every episode may name, in their usual order.
func builtins() []Tool {
	return []Tool{Bash{}, Python{}, ReadFile{}, WriteFile{}, Edit{}, RunTests{}, FinishTool{}}
}

// Builtins are the tools every episode may name, by name.
func Builtins() map[string]Tool {
	m := map[string]Tool{}
	for _, t := range builtins() {
		m[t.Schema().Name] = t
	}
	return m
}

// BuiltinNames lists the builtin tools in their usual order.
func BuiltinNames() []string {
	var out []string
	for _, t := range builtins() {
		out = append(out, t.Schema().Name)
	}
	return out
}

// DefaultNames are the tools a task that names none is offered: the
// builtins less python, and less run_tests when the task has no test
// command (hasTests false).
func DefaultNames(hasTests bool) []string {
	out := []string{NameBash, NameReadFile, NameWriteFile, NameEdit}
	if hasTests {
		out = append(out, NameRunTests)
	}
	return append(out, NameFinish)
}

// DefaultSearchNames are the tools a task with a retriever that names none
// is offered: the retrieval tools and finish.
func DefaultSearchNames() []string { return append(SearchNames(), NameFinish) }

// Known reports whether name is a tool a task may name: a builtin or a
// retrieval tool (which needs a retriever: the task says so).
func Known(name string) bool {
	_, ok := Builtins()[name]
	return ok || slices.Contains(SearchNames(), name)
}

// Select builds a registry of the named builtins (plus extra tools), in the
// order given. An unknown name is an error naming it and the known ones.
func Select(names []string, extra map[string]Tool) (*Registry, error) {
	all := Builtins()
	for k, v := range extra {
		all[k] = v
	}
	var ts []Tool
	for _, n := range names {
		t, ok := all[n]
		if !ok {
			known := make([]string, 0, len(all))
			for k := range all {
				known = append(known, k)
			}
			sort.Strings(known)
			return nil, fmt.Errorf("unknown tool %q (known: %s)", n, strings.Join(known, ", "))
		}
		ts = append(ts, t)
	}
	return NewRegistry(ts...)
}

// execResult turns a command's Result into a tool Result, with a text the
// model reads: stdout, then stderr under a marker, then the exit status.
// Everything but the streams' bytes is a Note.
func execResult(res sandbox.Result, timeout time.Duration) Result {
	code := res.ExitCode
	out := Result{
		ExitCode: &code, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
		Stdout: res.Stdout, Stderr: res.Stderr, StdoutDropped: res.StdoutDropped, StderrDropped: res.StderrDropped,
	}
	var b annotated
	b.stream(res.Stdout, res.StdoutDropped)
	if len(res.Stderr) > 0 || res.StderrDropped > 0 {
		b.endLine()
		b.note("[stderr]\n", 0)
		b.stream(res.Stderr, res.StderrDropped)
	}
	b.endLine()
	switch {
	case res.IdleTimedOut:
		out.ErrorKind = KindTimeout
		out.Err = "the command printed nothing for too long and was stopped"
		b.note("[stopped: no output for too long; the command and its children were killed]\n", 0)
	case res.TimedOut:
		out.ErrorKind = KindTimeout
		out.Err = fmt.Sprintf("timed out after %v", timeout)
		b.note(fmt.Sprintf("[timed out after %v; the command and its children were killed]\n", timeout), 0)
	case res.OOMKilled:
		out.ErrorKind = KindOOM
		out.Err = "killed: out of memory"
		b.note("[killed: out of memory]\n", 0)
	case res.ExitCode != 0:
		out.ErrorKind = KindNonzeroExit
		out.Err = fmt.Sprintf("exit code %d", res.ExitCode)
		if res.Signal != "" {
			b.note(fmt.Sprintf("[exit code %d, killed by %s]\n", res.ExitCode, res.Signal), 0)
		} else {
			b.note(fmt.Sprintf("[exit code %d]\n", res.ExitCode), 0)
		}
	}
	if res.Trap != "" {
		b.note(fmt.Sprintf("[trap: %s]\n", res.Trap), 0)
	}
	out.Text, out.Notes = b.String(), b.notes
	return out
}

// annotated builds a Result's Text from output and notes.
type annotated struct {
	strings.Builder
	notes []Note
}

// output appends bytes of the output.
func (a *annotated) output(p []byte) { a.Write(p) }

// note appends the tool's own words, standing for stands bytes of output.
func (a *annotated) note(s string, stands int64) {
	if s == "" && stands == 0 {
		return
	}
	start := a.Len()
	a.WriteString(s)
	a.notes = append(a.notes, Note{Start: start, End: a.Len(), Stands: stands})
}

// endLine ends the text's last line, if it has one that is open.
func (a *annotated) endLine() {
	if s := a.String(); s != "" && !strings.HasSuffix(s, "\n") {
		a.note("\n", 0)
	}
}

// stream appends a capped stream (its kept head and tail), marking where
// the cap cut it.
func (a *annotated) stream(data []byte, dropped int64) {
	if dropped == 0 {
		a.output(data)
		return
	}
	head := min(len(data)-len(data)/2, len(data))
	a.output(data[:head])
	a.note(fmt.Sprintf("\n[... %d bytes dropped ...]\n", dropped), dropped)
	a.output(data[head:])
}
