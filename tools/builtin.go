package tools

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// maxReadBytes caps a file read_file and edit load.
const maxReadBytes = 8 << 20

// resolve makes p absolute against the workdir.
func (e *Env) resolve(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(e.Workdir, p)
}

// timeout picks a command's timeout: the requested seconds, bounded by the
// environment's ceiling.
func (e *Env) timeout(args map[string]any) time.Duration {
	d := e.ExecTimeout
	if d <= 0 {
		d = sandbox.DefaultExecTimeout
	}
	if s, ok := args["timeout_s"].(float64); ok && s > 0 {
		if req := time.Duration(s * float64(time.Second)); req < d {
			d = req
		}
	}
	return d
}

func (e *Env) exec(ctx context.Context, req sandbox.ExecRequest) (Result, error) {
	if req.Timeout == 0 {
		req.Timeout = e.timeout(nil)
	}
	req.IdleTimeout = e.IdleTimeout
	req.OutputCap = e.StoreCap
	res, err := e.Sandbox.Exec(ctx, req)
	if err != nil {
		return Result{}, err
	}
	return execResult(res, req.Timeout), nil
}

// fileError turns a file operation's error into a Result, or passes a
// sandbox failure (the infrastructure's, or one the agent's own commands
// caused) through as an error.
func fileError(op, p string, err error) (Result, error) {
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return failf(KindBadArguments, "%s %s: no such file or directory", op, p), nil
	case errors.Is(err, sandbox.ErrPathEscape):
		return failf(KindBadArguments, "%s %s: the path leaves the sandbox", op, p), nil
	case errors.Is(err, sandbox.ErrTooLarge):
		return failf(KindBadArguments, "%s %s: too large", op, p), nil
	case errors.Is(err, sandbox.ErrInvalidSpec):
		return failf(KindBadArguments, "%s %s: %v", op, p, err), nil
	case sandbox.IsInfra(err) || sandbox.IsAbuse(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return Result{}, err
	default: // permission denied, is a directory, ...: the model's to handle
		return failf(KindBadArguments, "%s %s: %v", op, p, err), nil
	}
}

func schema(name, desc string, p *param) Schema {
	b, _ := json.Marshal(p)
	return Schema{Name: name, Description: desc, Parameters: b}
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Bash runs a shell line in the sandbox.
type Bash struct{}

func (Bash) Schema() Schema {
	return schema(NameBash, "Run a shell command in the sandbox and return its output and exit code.", object(map[string]*param{
		"command":   str("the shell command line"),
		"timeout_s": integer("seconds before the command is killed (bounded by the task's limit)", 1, 86400),
	}, "command"))
}

func (Bash) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	return env.exec(ctx, sandbox.ExecRequest{Shell: args["command"].(string), Timeout: env.timeout(args)})
}

// Python runs a program in the sandbox's Python interpreter.
type Python struct{}

func (Python) Schema() Schema {
	return schema(NamePython, "Run a Python program in the sandbox and return its output.", object(map[string]*param{
		"code": str("the program's source"),
	}, "code"))
}

func (Python) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	argv := env.PythonArgv
	if len(argv) == 0 {
		argv = []string{"python3"}
	}
	// Named by content, not by a counter: the name shows in tracebacks, and
	// a replay must see the same one.
	code := args["code"].(string)
	file := "/tmp/.rollbox-python-" + digest([]byte(code))[:12] + ".py"
	if err := env.Sandbox.WriteFile(ctx, file, []byte(code), 0o644); err != nil {
		return fileError("python: write", file, err)
	}
	return env.exec(ctx, sandbox.ExecRequest{Argv: append(append([]string{}, argv...), file)})
}

// ReadFile returns a file's text, or a range of its lines.
type ReadFile struct{}

func (ReadFile) Schema() Schema {
	return schema(NameReadFile, "Read a file, optionally only lines start_line..end_line (1-based, inclusive).", object(map[string]*param{
		"path":       str("the file, absolute or relative to the working directory"),
		"start_line": integer("first line to return", 1, 1e9),
		"end_line":   integer("last line to return", 1, 1e9),
	}, "path"))
}

func (ReadFile) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	p := env.resolve(args["path"].(string))
	data, err := env.Sandbox.ReadFile(ctx, p, maxReadBytes)
	if err != nil {
		return fileError(NameReadFile, p, err)
	}
	start, hasStart := args["start_line"].(float64)
	end, hasEnd := args["end_line"].(float64)
	if !hasStart && !hasEnd {
		return Result{Text: string(data), Stdout: data}, nil
	}
	lines := strings.SplitAfter(string(data), "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	lo, hi := 1, len(lines)
	if hasStart {
		lo = int(start)
	}
	if hasEnd {
		hi = int(end)
	}
	if lo > hi {
		return failf(KindBadArguments, "read_file: start_line %d is after end_line %d", lo, hi), nil
	}
	if lo > len(lines) {
		return failf(KindBadArguments, "read_file %s: start_line %d is past the end (%d lines)", p, lo, len(lines)), nil
	}
	hi = min(hi, len(lines))
	text := strings.Join(lines[lo-1:hi], "")
	var b annotated
	b.note(fmt.Sprintf("[%s lines %d-%d of %d]\n", p, lo, hi, len(lines)), 0)
	b.output([]byte(text))
	return Result{Text: b.String(), Notes: b.notes, Stdout: []byte(text)}, nil
}

// WriteFile creates or replaces a file.
type WriteFile struct{}

func (WriteFile) Schema() Schema {
	return schema(NameWriteFile, "Create or replace a file with the given content.", object(map[string]*param{
		"path":    str("the file, absolute or relative to the working directory"),
		"content": strAny("the whole new content"),
	}, "path", "content"))
}

func (WriteFile) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	p := env.resolve(args["path"].(string))
	data := []byte(args["content"].(string))
	if err := env.Sandbox.WriteFile(ctx, p, data, 0o644); err != nil {
		return fileError("write_file", p, err)
	}
	return Result{Text: fmt.Sprintf("wrote %d bytes to %s\n", len(data), p), Files: map[string]string{p: digest(data)}}, nil
}

// Edit replaces one exact occurrence of a string in a file.
type Edit struct{}

func (Edit) Schema() Schema {
	return schema(NameEdit, "Replace the one exact occurrence of old_string in a file with new_string. Fails if old_string occurs zero or several times.", object(map[string]*param{
		"path":       str("the file, absolute or relative to the working directory"),
		"old_string": str("the exact text to replace; must occur exactly once"),
		"new_string": strAny("the replacement text"),
	}, "path", "old_string", "new_string"))
}

func (Edit) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	p := env.resolve(args["path"].(string))
	old, repl := args["old_string"].(string), args["new_string"].(string)
	data, err := env.Sandbox.ReadFile(ctx, p, maxReadBytes)
	if err != nil {
		return fileError("edit", p, err)
	}
	switch n := bytes.Count(data, []byte(old)); n {
	case 0:
		return failf(KindBadArguments, "edit %s: old_string not found; nothing was changed", p), nil
	case 1:
	default:
		return failf(KindBadArguments, "edit %s: old_string occurs %d times; give more context so it is unique; nothing was changed", p, n), nil
	}
	out := bytes.Replace(data, []byte(old), []byte(repl), 1)
	if err := env.Sandbox.WriteFile(ctx, p, out, 0o644); err != nil {
		return fileError("edit", p, err)
	}
	return Result{Text: fmt.Sprintf("edited %s: replaced 1 occurrence\n", p), Files: map[string]string{p: digest(out)}}, nil
}

// RunTests runs the task's test command.
type RunTests struct{}

func (RunTests) Schema() Schema {
	return schema(NameRunTests, "Run the task's tests and return their output.", object(map[string]*param{}))
}

func (RunTests) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	if env.TestCommand == "" {
		return failf(KindBadArguments, "run_tests: this task has no test command"), nil
	}
	d := env.TestTimeout
	if d <= 0 {
		d = env.timeout(nil)
	}
	return env.exec(ctx, sandbox.ExecRequest{Shell: env.TestCommand, Timeout: d})
}

// FinishTool ends the episode with an answer (and, for retrieval, ids).
type FinishTool struct{}

func (FinishTool) Schema() Schema {
	return schema(NameFinish, "End the episode, giving the final answer (and, for search tasks, the ids of the relevant documents).", object(map[string]*param{
		"answer": strAny("the final answer"),
		"ids":    strList("ids of the documents you judge relevant"),
	}))
}

func (FinishTool) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	f := &Finish{}
	if a, ok := args["answer"].(string); ok {
		f.Answer = &a
	}
	if ids, ok := args["ids"].([]any); ok {
		f.IDs = make([]string, 0, len(ids))
		for _, id := range ids {
			f.IDs = append(f.IDs, id.(string))
		}
	}
	return Result{Text: "finished\n", Finish: f}, nil
}
