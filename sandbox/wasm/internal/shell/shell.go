// Package shell runs POSIX shell command lines for the WASM backend beside
// the guest, in the host process: the mvdan.cc/sh interpreter with every
// handler confined to the episode's in-memory filesystem, the everyday
// commands as Go builtins against that filesystem, and real programs
// (python, js, user .wasm) handed to a Runner that instantiates WASI
// modules. Nothing here can reach the host's filesystem, processes or
// network, and the guard (guard.go) bounds the memory, stack and
// goroutines a command line may use. See ../../RATIONALE.md.
package shell

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/interp"
	"mvdan.cc/sh/v3/syntax"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// Proc is one external program to run: argv[0] is a program name (python,
// js) or a path to a .wasm module inside the episode filesystem.
type Proc struct {
	Args   []string
	Dir    string
	Env    []string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// ProgramRunner runs external programs. Lookup reports whether name (a
// bare name or a path in the episode filesystem) is a program it can run.
type ProgramRunner interface {
	Lookup(fsys *vfs.FS, dir, name string) (string, bool)
	Run(ctx context.Context, p Proc) (exitCode int, err error)
}

// Config is one command line's world.
type Config struct {
	FS      *vfs.FS
	Env     map[string]string
	Dir     string
	Stdin   *os.File // nil: empty
	Stdout  io.Writer
	Stderr  io.Writer
	Limits  Limits
	Program ProgramRunner // may be nil
}

// Limits bound one command line.
type Limits struct {
	// MemoryBytes caps the shell's own state: variables, expansions,
	// command-substitution buffers, lines read.
	MemoryBytes int64
	// Jobs caps the concurrent jobs (pipeline stages, background
	// commands: goroutines here) of the command line.
	Jobs int
}

// ErrOOM is returned (wrapped) when a command line exceeded its memory cap.
var ErrOOM = errors.New("out of memory")

// ErrTooManyJobs is returned when a command line ran too many concurrent jobs.
var ErrTooManyJobs = errors.New("too many concurrent jobs")

// Outcome is what a command line did.
type Outcome struct {
	ExitCode int
	// OOM is set when the guard stopped the command line for memory.
	OOM bool
	// Reason explains OOM or a refusal, for stderr.
	Reason string
}

// RunScript parses and runs a shell command line.
func RunScript(ctx context.Context, cfg Config, script string) Outcome {
	g := newGuard(cfg.Limits)
	return runWithGuard(ctx, cfg, g, func() (syntax.Node, error) { return parse(g, script, "sh") }, nil)
}

// RunArgv runs argv as one simple command, with no expansion of its words.
func RunArgv(ctx context.Context, cfg Config, argv []string) Outcome {
	g := newGuard(cfg.Limits)
	call := &syntax.CallExpr{}
	for _, a := range argv {
		call.Args = append(call.Args, &syntax.Word{Parts: []syntax.WordPart{&syntax.SglQuoted{Value: a}}})
	}
	file := &syntax.File{Stmts: []*syntax.Stmt{{Cmd: call}}}
	return runWithGuard(ctx, cfg, g, func() (syntax.Node, error) { return file, nil }, nil)
}

func parse(g *guard, src, name string) (*syntax.File, error) {
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(src), name)
	if err != nil {
		return nil, err
	}
	if err := g.instrument(f); err != nil {
		return nil, err
	}
	return f, nil
}

func runWithGuard(ctx context.Context, cfg Config, g *guard, load func() (syntax.Node, error), params []string) Outcome {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	g.cancel = cancel
	s := &session{cfg: cfg, g: g}
	code := s.run(ctx, load, cfg.Dir, cfg.Env, params, cfg.Stdin, cfg.Stdout, cfg.Stderr)
	out := Outcome{ExitCode: code}
	if g.oom.Load() {
		out.OOM = true
		out.ExitCode = 137
		out.Reason = g.reason()
	}
	if errors.Is(context.Cause(ctx), ErrTooManyJobs) {
		out.ExitCode = 137
		out.Reason = g.reason()
	}
	return out
}

// session is one command line; nested shells (sh -c, sh FILE) share it.
type session struct {
	cfg Config
	g   *guard
}

const (
	exitNotFound = 127
	exitUsage    = 2
)

// run runs a parsed program in a fresh interpreter and returns its status.
func (s *session) run(ctx context.Context, load func() (syntax.Node, error), dir string, env map[string]string, params []string, stdin *os.File, stdout, stderr io.Writer) int {
	node, err := load()
	if err != nil {
		fmt.Fprintf(stderr, "sh: %v\n", err)
		if errors.Is(err, ErrOOM) {
			return 137
		}
		return exitUsage
	}
	pairs := make([]string, 0, len(env))
	for k, v := range env {
		pairs = append(pairs, k+"="+v)
	}
	slices.Sort(pairs)
	opts := []interp.RunnerOption{
		interp.Env(expand.ListEnviron(pairs...)),
		interp.StdIO(nil, stdout, stderr),
		interp.OpenHandler(s.open),
		interp.ReadDirHandler2(s.readDir),
		interp.StatHandler(s.stat),
		interp.AccessHandler(s.access),
		interp.CallHandler(s.call),
		interp.ExecHandlers(func(interp.ExecHandlerFunc) interp.ExecHandlerFunc { return s.exec }),
	}
	if params != nil {
		opts = append(opts, interp.Params(append([]string{"--"}, params...)...))
	}
	r, err := interp.New(opts...)
	if err != nil {
		fmt.Fprintf(stderr, "sh: %v\n", err)
		return exitUsage
	}
	if stdin != nil {
		interp.StdIO(stdin, stdout, stderr)(r)
	}
	r.Dir = dir // set directly: interp.Dir would stat the host's filesystem
	err = r.Run(ctx, node)
	var es interp.ExitStatus
	switch {
	case err == nil:
		return 0
	case errors.As(err, &es):
		return int(es)
	case errors.Is(err, ErrOOM) || errors.Is(err, ErrTooManyJobs):
		return 137
	case ctx.Err() != nil:
		return 137
	default:
		fmt.Fprintf(stderr, "sh: %v\n", err)
		return 1
	}
}

// abs resolves p against dir in the episode's namespace.
func abs(dir, p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(dir, p)
}

type nopCloser struct {
	io.Reader
	io.Writer
}

func (nopCloser) Close() error { return nil }

func (s *session) open(ctx context.Context, p string, flag int, perm os.FileMode) (io.ReadWriteCloser, error) {
	hc := interp.HandlerCtx(ctx)
	if strings.HasPrefix(p, checkPrefix) {
		return s.g.checkpoint(hc, p)
	}
	if strings.HasPrefix(p, sourcePrefix) {
		return s.g.sourced(p)
	}
	switch p {
	case "/dev/stdin", "/dev/fd/0":
		if hc.Stdin == nil {
			return nopCloser{Reader: strings.NewReader("")}, nil
		}
		return nopCloser{Reader: hc.Stdin}, nil
	case "/dev/stdout", "/dev/fd/1":
		return nopCloser{Reader: strings.NewReader(""), Writer: hc.Stdout}, nil
	case "/dev/stderr", "/dev/fd/2":
		return nopCloser{Reader: strings.NewReader(""), Writer: hc.Stderr}, nil
	}
	f, err := s.cfg.FS.OpenFile(abs(hc.Dir, p), flag, perm)
	if err != nil {
		return nil, userPathErr(err, p)
	}
	return f, nil
}

// userPathErr gives an error the path the user wrote, as an *os.PathError
// so the interpreter prints it and goes on.
func userPathErr(err error, p string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return &fs.PathError{Op: pe.Op, Path: p, Err: pe.Err}
	}
	return &fs.PathError{Op: "open", Path: p, Err: err}
}

func (s *session) readDir(ctx context.Context, p string) ([]fs.DirEntry, error) {
	hc := interp.HandlerCtx(ctx)
	return s.cfg.FS.ReadDir(abs(hc.Dir, p))
}

func (s *session) stat(ctx context.Context, p string, follow bool) (fs.FileInfo, error) {
	hc := interp.HandlerCtx(ctx)
	if follow {
		return s.cfg.FS.Stat(abs(hc.Dir, p))
	}
	return s.cfg.FS.Lstat(abs(hc.Dir, p))
}

func (s *session) access(ctx context.Context, p string, mode interp.AccessMode) error {
	hc := interp.HandlerCtx(ctx)
	fi, err := s.cfg.FS.Stat(abs(hc.Dir, p))
	if err != nil {
		return err
	}
	if mode&interp.AccessExec != 0 && !fi.IsDir() && fi.Mode().Perm()&0o111 == 0 {
		return &fs.PathError{Op: "access", Path: p, Err: syscall.EACCES}
	}
	return nil
}

// call runs before every simple command: it enforces the guard and rewrites
// the few builtins that would otherwise reach the host or escape the guard.
func (s *session) call(ctx context.Context, args []string) ([]string, error) {
	hc := interp.HandlerCtx(ctx)
	if err := s.g.checkCall(hc, args); err != nil {
		return nil, err
	}
	return s.g.rewriteCall(hc, s.cfg.FS, args)
}

// exec runs every command that is neither a shell function nor an
// interpreter builtin.
func (s *session) exec(ctx context.Context, args []string) error {
	hc := interp.HandlerCtx(ctx)
	c := &cmd{ctx: ctx, s: s, args: args, dir: hc.Dir, stdin: hc.Stdin, stdout: hc.Stdout, stderr: hc.Stderr, env: hc.Env}
	if f, ok := hc.Stdin.(*os.File); ok {
		stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()) })
		defer func() {
			if !stop() {
				f.SetReadDeadline(time.Time{})
			}
		}()
	}
	if hc.Stdin == nil {
		c.stdin = strings.NewReader("")
	}
	c.stdout = s.g.limitBuffer(hc, hc.Stdout)
	c.stderr = s.g.limitBuffer(hc, hc.Stderr)
	code := c.dispatch()
	if err := s.g.fatal(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if code == 0 {
		return nil
	}
	return interp.ExitStatus(uint8(code))
}

// environ lists exported variables as KEY=VALUE.
func environ(env expand.Environ) []string {
	seen := map[string]bool{}
	var out []string
	env.Each(func(name string, vr expand.Variable) bool {
		if seen[name] {
			return true
		}
		seen[name] = true
		if vr.IsSet() && vr.Exported && vr.Kind == expand.String {
			out = append(out, name+"="+vr.Str)
		}
		return true
	})
	slices.Sort(out)
	return out
}

// isScript reports whether data starts with a shell shebang or looks like
// text a shell would run.
func interpreterOf(data []byte) string {
	if !bytes.HasPrefix(data, []byte("#!")) {
		return "sh"
	}
	line, _, _ := bytes.Cut(data[2:], []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) == 0 {
		return "sh"
	}
	prog := path.Base(fields[0])
	if prog == "env" && len(fields) > 1 {
		prog = fields[1]
	}
	return prog
}
