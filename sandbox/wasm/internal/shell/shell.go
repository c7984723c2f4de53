// Package shell runs POSIX/bash command lines for the WASM backend: its own
// interpreter over mvdan.cc/sh's parser (syntax) and expansion (expand)
// packages, with every effect routed to the episode: files to the episode's
// filesystem (FS), pipes to in-memory buffers, process substitution to
// in-memory pipes named /dev/fd/N, pids, users and host names to the
// sandbox's own. It never calls the host operating system: the package
// imports no os function (a test checks its source), and mvdan.cc/sh/interp,
// whose pipes, FIFOs, temp files, pwd -P and pids are the host's, is not
// linked. Every resource a command line can consume is charged where it is
// consumed: memory to a budget (variables, arguments, pipe buffers,
// command-substitution output, here-documents, what builtins accumulate),
// goroutines to a jobs limit, nesting to a depth limit, time to the exec's
// context. See ../../RATIONALE.md.
package shell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// What the sandbox says about itself, instead of the host's values.
const (
	sandboxPID   = 1
	sandboxPPID  = 0
	sandboxUser  = "user"
	sandboxHome  = "/root"
	sandboxHost  = "sandbox"
	firstJobPID  = 100
	procSubstFD0 = 63
)

// FS is the episode filesystem as commands use it: a *vfs.FS in this
// process (vfs.Local), or a client of one served from another process.
type FS = vfs.FileSystem

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
	Lookup(fsys FS, dir, name string) (string, bool)
	Run(ctx context.Context, p Proc) (exitCode int, err error)
}

// Config is one command line's world.
type Config struct {
	FS      FS
	Env     map[string]string
	Dir     string
	Stdin   io.Reader // nil: empty
	Stdout  io.Writer
	Stderr  io.Writer
	Limits  Limits
	Program ProgramRunner // may be nil
}

// Limits bound one command line.
type Limits struct {
	// MemoryBytes caps what the command line makes the process hold:
	// variables, arguments, expansions, pipe buffers, here-documents,
	// command-substitution output, lines read, builtins' buffers.
	MemoryBytes int64
	// Jobs caps the concurrent jobs (pipeline stages, background
	// commands, process substitutions: goroutines here).
	Jobs int
	// Depth caps nesting: function calls, eval, source, sh, subshells and
	// command substitutions inside one another. Default 500.
	Depth int
}

// Outcome is what a command line did.
type Outcome struct {
	// Internal is set when the interpreter itself failed (a bug, caught
	// as a panic): the runtime's failure, not the command's.
	Internal string
	ExitCode int
	// OOM is set when the command line was stopped for memory.
	OOM bool
	// Reason explains OOM or a refusal, for stderr.
	Reason string
}

const (
	exitNotFound = 127
	exitUsage    = 2
	exitKilled   = 137
	// maxParseNesting bounds the bracket nesting of source handed to the
	// parser (which recurses on it).
	maxParseNesting = 500
)

// errNesting stops a command line that nests too deep.
var errNesting = errors.New("nesting too deep (functions, eval, source or sh calling themselves)")

// session is one command line: every shell, subshell and job of it share
// its budget, jobs limit, goroutine group and pid counter.
type session struct {
	// ctx is the command line's lifecycle context: background jobs
	// derive theirs from it (not from the job that started them, which
	// may end first, as a parent process may), and it ends with the
	// command line.
	ctx     context.Context
	cfg     Config
	mem     *budget
	jobs    *jobLimiter
	cancel  context.CancelCauseFunc
	started time.Time
	wg      sync.WaitGroup
	nextPID atomic.Int64
	rngMu   sync.Mutex
	rng     *rand.Rand
	// procSubst holds the open ends of process substitutions by path.
	psMu      sync.Mutex
	procSubst map[string]any
	nextFD    int

	internalMu sync.Mutex
	internal   string
}

// recoverInternal turns a panic of the interpreter into the command line's
// internal error (and stops it), instead of a crash of the process.
func (s *session) recoverInternal() {
	r := recover()
	if r == nil {
		return
	}
	s.internalMu.Lock()
	if s.internal == "" {
		s.internal = fmt.Sprintf("shell panic: %v\n%s", r, debug.Stack())
	}
	s.internalMu.Unlock()
	s.cancel(errInternal)
}

var errInternal = errors.New("the shell failed")

func (s *session) random() uint64 {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Uint64()
}

func (s *session) pid() int { return int(s.nextPID.Add(1)) }

// RunScript parses and runs a shell command line.
func RunScript(ctx context.Context, cfg Config, script string) Outcome {
	return runLine(ctx, cfg, func(ctx context.Context, sh *shell) int {
		sh.flagC = "c"
		f, err := sh.parse(script, "sh")
		if err != nil {
			fmt.Fprintf(sh.stderr(), "sh: %v\n", err)
			return sh.parseStatus(err)
		}
		sh.runMain(ctx, f.Stmts)
		return sh.exit
	})
}

// RunArgv runs argv as one simple command, with no expansion of its words.
func RunArgv(ctx context.Context, cfg Config, argv []string) Outcome {
	return runLine(ctx, cfg, func(ctx context.Context, sh *shell) int {
		sh.exec(ctx, argv, nil)
		sh.finish(ctx)
		return sh.exit
	})
}

func runLine(ctx context.Context, cfg Config, body func(context.Context, *shell) int) Outcome {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if cfg.Limits.Jobs <= 0 {
		cfg.Limits.Jobs = 256
	}
	if cfg.Limits.Depth <= 0 {
		cfg.Limits.Depth = 500
	}
	s := &session{
		ctx: ctx, cfg: cfg, cancel: cancel, started: time.Now(),
		mem:       newBudget(cfg.Limits.MemoryBytes, cancel),
		jobs:      &jobLimiter{limit: int64(cfg.Limits.Jobs), cancel: cancel},
		rng:       rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x5eed)),
		procSubst: map[string]any{},
		nextFD:    procSubstFD0,
	}
	s.nextPID.Store(firstJobPID)
	sh, err := newShell(s, cfg.Env, cfg.Dir)
	code := 0
	if err != nil {
		fmt.Fprintf(cfg.Stderr, "sh: %v\n", err)
		code = exitKilled
	} else {
		stdin := cfg.Stdin
		if stdin == nil {
			stdin = strings.NewReader("")
		}
		sh.fds.set(0, &fdEnt{r: newSharedReader(stdin), name: "/dev/stdin"})
		sh.fds.set(1, &fdEnt{w: cfg.Stdout, name: "/dev/stdout"})
		sh.fds.set(2, &fdEnt{w: cfg.Stderr, name: "/dev/stderr"})
		func() {
			defer s.recoverInternal()
			code = body(ctx, sh)
		}()
		sh.vars.drop()
	}
	// Nothing of the command line outlives it: stop what is still
	// running (background jobs, process substitutions) and wait for it.
	cancel(errCommandDone)
	s.wg.Wait()
	s.closeProcSubsts()
	out := Outcome{ExitCode: code, Internal: s.internal}
	switch {
	case s.mem.oom.Load():
		out.OOM, out.ExitCode, out.Reason = true, exitKilled, s.mem.reason()
	case s.jobs.over.Load():
		out.ExitCode = exitKilled
		out.Reason = fmt.Sprintf("more than %d concurrent jobs (pipeline stages and background commands)", s.jobs.limit)
	}
	return out
}

// errCommandDone cancels what a finished command line left running.
var errCommandDone = errors.New("the command line ended")

// options are the shell options (set -o, shopt).
type options struct {
	errexit, nounset, xtrace, pipefail, noglob, noclobber, allexport, noexec bool
	globstar, dotglob, nullglob, extglob, nocaseglob, failglob, lastpipe     bool
	expandAliases                                                            bool
}

func (o options) flags() string {
	var b strings.Builder
	for _, f := range []struct {
		on bool
		c  byte
	}{{o.allexport, 'a'}, {o.errexit, 'e'}, {o.noglob, 'f'}, {o.noexec, 'n'}, {o.nounset, 'u'}, {o.xtrace, 'x'}, {o.noclobber, 'C'}} {
		if f.on {
			b.WriteByte(f.c)
		}
	}
	b.WriteString("hB")
	return b.String()
}

// shell is one shell process: its variables, functions, options, working
// directory, file descriptors and positional parameters. Subshells and
// jobs are copies.
type shell struct {
	s       *session
	vars    *varStore
	funcs   map[string]*syntax.Stmt
	aliases map[string]string
	opts    options
	dir     string
	arg0    string
	params  []string
	fds     *fdTable
	traps   map[string]string
	bg      *jobTable
	lastBg  int
	pid     int

	exit int // $?
	// pipeStatus is PIPESTATUS: the statuses of the last foreground
	// pipeline (or the one command).
	pipeStatus []int
	// exempt says the last status came from a command errexit ignores
	// (a condition, a non-final part of an && or || list, a negation).
	exempt bool

	// control flow
	exiting   bool
	returning bool
	breakN    int
	contN     int
	loops     int
	funcDepth int
	noErrExit int
	depth     int
	inTrap    bool

	sourcing  int // source/. files being run (return ends one)
	funcNames []string
	dirStack  []string
	lineno    int
	// getopts' position: the OPTIND it last set and the letter within
	// that argument.
	optInd, optPos int
	umaskVal       int
	// flagC is "c" in $- for a shell running a -c string.
	flagC string
}

func newShell(s *session, env map[string]string, dir string) (*shell, error) {
	sh := &shell{
		s: s, vars: newVarStore(s.mem), funcs: map[string]*syntax.Stmt{}, aliases: map[string]string{},
		dir: dir, arg0: "sh", fds: newFDTable(), traps: map[string]string{}, bg: &jobTable{}, pid: sandboxPID,
	}
	for k, v := range env {
		if !validName(k) {
			continue
		}
		if err := sh.vars.set(k, expand.Variable{Set: true, Kind: expand.String, Str: v, Exported: true}, false); err != nil {
			return nil, err
		}
	}
	if err := sh.vars.set("PWD", expand.Variable{Set: true, Kind: expand.String, Str: dir, Exported: true}, false); err != nil {
		return nil, err
	}
	for k, v := range map[string]string{"IFS": " \t\n", "OPTIND": "1", "PS4": "+ ", "HOSTNAME": sandboxHost, "BASH_VERSION": "5.2.15(1)-release"} {
		if !sh.vars.get(k).IsSet() {
			if err := sh.vars.set(k, strVar(v), false); err != nil {
				return nil, err
			}
		}
	}
	return sh, nil
}

// subshell copies sh for a ( list ), a pipeline stage, a command
// substitution or a background job. Traps are reset, as in bash.
func (sh *shell) subshell() (*shell, error) {
	if sh.depth+1 > sh.s.cfg.Limits.Depth {
		return nil, sh.s.mem.fail("%v", errNesting)
	}
	vars, err := sh.vars.clone()
	if err != nil {
		return nil, err
	}
	c := *sh
	c.vars = vars
	c.funcs = make(map[string]*syntax.Stmt, len(sh.funcs))
	for k, v := range sh.funcs {
		c.funcs[k] = v
	}
	c.aliases = make(map[string]string, len(sh.aliases))
	for k, v := range sh.aliases {
		c.aliases[k] = v
	}
	c.params = append([]string(nil), sh.params...)
	c.fds = sh.fds.clone()
	c.traps = map[string]string{}
	c.bg = &jobTable{}
	c.funcNames = append([]string(nil), sh.funcNames...)
	c.dirStack = append([]string(nil), sh.dirStack...)
	c.depth = sh.depth + 1
	c.pid = sh.s.pid()
	c.exiting, c.returning, c.breakN, c.contN = false, false, 0, 0
	return &c, nil
}

// endSubshell runs the subshell's EXIT trap and releases its variables.
func (sh *shell) endSubshell(ctx context.Context) {
	sh.finish(ctx)
	sh.vars.drop()
}

func (sh *shell) stdin() io.Reader  { return sh.fds.reader(0) }
func (sh *shell) stdout() io.Writer { return sh.fds.writer(1) }
func (sh *shell) stderr() io.Writer { return sh.fds.writer(2) }

func (sh *shell) errf(format string, args ...any) {
	fmt.Fprintf(sh.stderr(), "sh: "+format+"\n", args...)
}

// stopped reports whether statements should stop running: the context
// ended, or exit, return, break or continue is unwinding.
func (sh *shell) stopped(ctx context.Context) bool {
	if ctx.Err() != nil {
		if sh.exit == 0 {
			sh.exit = exitKilled
		}
		return true
	}
	return sh.exiting || sh.returning || sh.breakN > 0 || sh.contN > 0
}

// parse parses source, refusing nesting the parser would recurse on too
// deeply and charging the syntax tree (about 8 bytes per source byte)
// while the caller holds it.
func (sh *shell) parse(src, name string) (*syntax.File, error) {
	if d := nesting(src); d > maxParseNesting {
		return nil, fmt.Errorf("%s: brackets nested %d deep (limit %d)", name, d, maxParseNesting)
	}
	if err := sh.s.mem.fits(int64(len(src))*8, "parsing "+name); err != nil {
		return nil, err
	}
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash), syntax.KeepComments(false)).Parse(strings.NewReader(src), name)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (sh *shell) parseStatus(err error) int {
	if errors.Is(err, ErrOOM) {
		return exitKilled
	}
	return exitUsage
}

// nesting is an upper bound of how deep brackets nest in src.
func nesting(src string) int {
	depth, most := 0, 0
	for i := 0; i < len(src); i++ {
		switch src[i] {
		case '(', '{', '[':
			depth++
			most = max(most, depth)
		case ')', '}', ']':
			if depth > 0 {
				depth--
			}
		}
	}
	return most
}

// runMain runs a program's statements, then its EXIT trap.
func (sh *shell) runMain(ctx context.Context, stmts []*syntax.Stmt) {
	sh.stmts(ctx, stmts)
	sh.finish(ctx)
}

// finish runs the EXIT trap once.
func (sh *shell) finish(ctx context.Context) {
	if t, ok := sh.traps["EXIT"]; ok && !sh.inTrap {
		delete(sh.traps, "EXIT")
		sh.runTrap(ctx, t)
	}
}

func (sh *shell) runTrap(ctx context.Context, src string) {
	if src == "" {
		return
	}
	code := sh.exit
	f, err := sh.parse(src, "trap")
	if err != nil {
		sh.errf("trap: %v", err)
		return
	}
	exiting := sh.exiting
	sh.exiting, sh.returning = false, false
	sh.inTrap = true
	sh.stmts(ctx, f.Stmts)
	sh.inTrap = false
	if !sh.exiting {
		sh.exit = code
	}
	sh.exiting = sh.exiting || exiting
}

func (sh *shell) stmts(ctx context.Context, stmts []*syntax.Stmt) {
	for _, st := range stmts {
		if sh.stopped(ctx) {
			return
		}
		sh.stmt(ctx, st)
	}
}

func (sh *shell) stmt(ctx context.Context, st *syntax.Stmt) {
	if sh.stopped(ctx) {
		return
	}
	sh.lineno = int(st.Position.Line())
	if st.Coprocess || st.Disown && !st.Background {
		sh.errf("line %d: coproc is not supported in this shell", sh.lineno)
		sh.exit, sh.exempt = exitUsage, false
		return
	}
	if st.Background {
		sh.background(ctx, st)
		return
	}
	if sh.opts.noexec {
		return
	}
	if len(st.Redirs) > 0 {
		saved := sh.fds
		fds, closers, err := sh.redirect(ctx, st.Redirs, sh.fds.clone())
		if err != nil {
			closeAll(closers)
			sh.errf("%v", err)
			sh.exit, sh.exempt = 1, false
			sh.checkErr(ctx, st)
			return
		}
		sh.fds = fds
		sh.command(ctx, st.Cmd, st.Negated)
		// exec with redirections only changes the shell's own fds.
		if call, ok := st.Cmd.(*syntax.CallExpr); ok && isExecRedirOnly(call) && sh.exit == 0 {
			saved = fds
			closers = nil
		}
		sh.fds = saved
		closeAll(closers)
	} else {
		sh.command(ctx, st.Cmd, st.Negated)
	}
	if st.Negated {
		if sh.exit == 0 {
			sh.exit = 1
		} else {
			sh.exit = 0
		}
		sh.exempt = true
	}
	sh.checkErr(ctx, st)
}

// checkErr applies set -e and the ERR trap after a statement.
func (sh *shell) checkErr(ctx context.Context, st *syntax.Stmt) {
	if sh.exit == 0 || sh.exempt || sh.noErrExit > 0 || sh.stopped(ctx) {
		return
	}
	if t, ok := sh.traps["ERR"]; ok && !sh.inTrap {
		sh.runTrap(ctx, t)
	}
	if sh.opts.errexit {
		sh.exiting = true
	}
}

func (sh *shell) command(ctx context.Context, cmd syntax.Command, negated bool) {
	if negated {
		sh.noErrExit++
		defer func() { sh.noErrExit-- }()
	}
	sh.exempt = false
	switch c := cmd.(type) {
	case nil:
		sh.exit = 0
	case *syntax.CallExpr:
		sh.call(ctx, c)
	case *syntax.Block:
		sh.stmts(ctx, c.Stmts)
	case *syntax.Subshell:
		sub, err := sh.subshell()
		if err != nil {
			sh.fail(err)
			return
		}
		sub.stmts(ctx, c.Stmts)
		sub.endSubshell(ctx)
		sh.exit, sh.exempt = sub.exit, sub.exempt && !sub.exiting
	case *syntax.BinaryCmd:
		sh.binary(ctx, c)
	case *syntax.IfClause:
		sh.ifClause(ctx, c)
	case *syntax.WhileClause:
		sh.whileClause(ctx, c)
	case *syntax.ForClause:
		sh.forClause(ctx, c)
	case *syntax.CaseClause:
		sh.caseClause(ctx, c)
	case *syntax.FuncDecl:
		if err := sh.s.mem.charge(int64(c.Body.End().Offset()-c.Body.Pos().Offset())*8+64, "defining function "+c.Name.Value); err != nil {
			sh.fail(err)
			return
		}
		sh.funcs[c.Name.Value] = c.Body
		sh.exit = 0
	case *syntax.ArithmCmd:
		n, err := sh.arith(ctx, c.X)
		if err != nil {
			sh.errf("%v", err)
			sh.exit = 1
			return
		}
		sh.exit = boolStatus(n != 0)
	case *syntax.TestClause:
		ok, err := sh.testExpr(ctx, c.X)
		if err != nil {
			sh.errf("%v", err)
			sh.exit = 2
			return
		}
		sh.exit = boolStatus(ok)
	case *syntax.DeclClause:
		sh.declClause(ctx, c)
	case *syntax.LetClause:
		var n int
		for _, e := range c.Exprs {
			v, err := sh.letExpr(ctx, e)
			if err != nil {
				sh.errf("let: %v", err)
				sh.exit = 1
				return
			}
			n = v
		}
		sh.exit = boolStatus(n != 0)
	case *syntax.TimeClause:
		start := time.Now()
		if c.Stmt != nil {
			sh.stmt(ctx, c.Stmt)
		}
		el := time.Since(start)
		if c.PosixFormat {
			fmt.Fprintf(sh.stderr(), "real %.2f\nuser %.2f\nsys %.2f\n", el.Seconds(), el.Seconds(), 0.0)
		} else {
			fmt.Fprintf(sh.stderr(), "\nreal\t%s\nuser\t%s\nsys\t0m0.000s\n", bashDuration(el), bashDuration(el))
		}
	case *syntax.CoprocClause:
		sh.errf("line %d: coproc is not supported in this shell", sh.lineno)
		sh.exit = exitUsage
	default:
		sh.errf("line %d: %T is not supported in this shell", sh.lineno, cmd)
		sh.exit = exitUsage
	}
}

// letExpr evaluates one of let's expressions: a quoted word is an
// expression of its own, as in let "y = x * 2".
func (sh *shell) letExpr(ctx context.Context, e syntax.ArithmExpr) (int, error) {
	if w, ok := e.(*syntax.Word); ok && len(w.Parts) == 1 {
		if _, quoted := w.Parts[0].(*syntax.DblQuoted); quoted {
			s, release, err := sh.literal(ctx, w)
			if err != nil {
				return 0, err
			}
			release()
			v, err := sh.arithString(ctx, s)
			if err != nil {
				return 0, err
			}
			return strconv.Atoi(v)
		}
		if _, quoted := w.Parts[0].(*syntax.SglQuoted); quoted {
			v, err := sh.arithString(ctx, w.Parts[0].(*syntax.SglQuoted).Value)
			if err != nil {
				return 0, err
			}
			return strconv.Atoi(v)
		}
	}
	return sh.arith(ctx, e)
}

func bashDuration(d time.Duration) string {
	m := int(d / time.Minute)
	s := (d - time.Duration(m)*time.Minute).Seconds()
	return fmt.Sprintf("%dm%.3fs", m, s)
}

func boolStatus(ok bool) int {
	if ok {
		return 0
	}
	return 1
}

// fail records an error that stops the command line (memory, jobs,
// nesting): the budget or limiter already cancelled the context.
func (sh *shell) fail(err error) {
	if errors.Is(err, ErrOOM) || errors.Is(err, ErrTooManyJobs) {
		sh.exit = exitKilled
		sh.exiting = true
		return
	}
	sh.errf("%v", err)
	sh.exit = 1
}

func (sh *shell) binary(ctx context.Context, c *syntax.BinaryCmd) {
	switch c.Op {
	case syntax.AndStmt, syntax.OrStmt:
		sh.noErrExit++
		sh.stmt(ctx, c.X)
		sh.noErrExit--
		if sh.stopped(ctx) {
			return
		}
		if (sh.exit == 0) == (c.Op == syntax.AndStmt) {
			sh.stmt(ctx, c.Y)
			return
		}
		sh.exempt = true
	case syntax.Pipe, syntax.PipeAll:
		sh.pipeline(ctx, c)
	}
}

// pipeline runs a | b | c: every stage but the last in a goroutine (a
// job), each in a subshell, joined by in-memory pipes.
func (sh *shell) pipeline(ctx context.Context, c *syntax.BinaryCmd) {
	// Flatten the left-nested tree.
	var stages []*syntax.Stmt
	var alls []bool
	var walk func(n *syntax.BinaryCmd)
	walk = func(n *syntax.BinaryCmd) {
		if x, ok := n.X.Cmd.(*syntax.BinaryCmd); ok && (x.Op == syntax.Pipe || x.Op == syntax.PipeAll) && len(n.X.Redirs) == 0 && !n.X.Negated && !n.X.Background {
			walk(x)
		} else {
			stages = append(stages, n.X)
		}
		alls = append(alls, n.Op == syntax.PipeAll)
		stages = append(stages, n.Y)
	}
	walk(c)
	statuses := make([]int, len(stages))
	var wg sync.WaitGroup
	var in io.Reader = nil
	var inCloser io.Closer
	for i, st := range stages {
		last := i == len(stages)-1
		sub, err := sh.subshell()
		if err != nil {
			if inCloser != nil {
				inCloser.Close()
			}
			wg.Wait()
			sh.fail(err)
			return
		}
		if in != nil {
			sub.fds.set(0, &fdEnt{r: newSharedReader(in), c: inCloser, name: "pipe"})
		}
		var pw *pipeWriter
		if !last {
			pr, w, err := newPipe(ctx, sh.s.mem)
			if err != nil {
				sub.vars.drop()
				if inCloser != nil {
					inCloser.Close()
				}
				wg.Wait()
				sh.fail(err)
				return
			}
			pw = w
			sub.fds.set(1, &fdEnt{w: pw, name: "pipe"})
			if alls[i] {
				sub.fds.set(2, &fdEnt{w: pw, name: "pipe"})
			}
			in, inCloser = pr, pr
		}
		if last {
			sub.stmt(ctx, st)
			sub.endSubshell(ctx)
			if rc := sub.fds.get(0); rc != nil && rc.c != nil {
				rc.c.Close()
			}
			statuses[i] = sub.exit
			break
		}
		if err := sh.s.jobs.begin(); err != nil {
			pw.Close()
			sub.vars.drop()
			wg.Wait()
			sh.fail(err)
			return
		}
		wg.Add(1)
		sh.s.wg.Add(1)
		stageIn := sub.fds.get(0)
		go func(i int) {
			defer sh.s.wg.Done()
			defer sh.s.recoverInternal()
			defer wg.Done()
			defer sh.s.jobs.end()
			defer pw.Close()
			defer func() {
				if stageIn != nil && stageIn.c != nil {
					stageIn.c.Close()
				}
			}()
			sub.stmt(ctx, st)
			sub.endSubshell(ctx)
			statuses[i] = sub.exit
		}(i)
	}
	wg.Wait()
	sh.exit = statuses[len(statuses)-1]
	sh.pipeStatus = statuses
	if sh.opts.pipefail {
		for i := len(statuses) - 1; i >= 0; i-- {
			if statuses[i] != 0 {
				sh.exit = statuses[i]
				break
			}
		}
	}
	if ctx.Err() != nil && sh.exit == 0 {
		sh.exit = exitKilled
	}
}

func (sh *shell) ifClause(ctx context.Context, c *syntax.IfClause) {
	for cl := c; cl != nil; cl = cl.Else {
		if len(cl.Cond) == 0 { // else
			sh.stmts(ctx, cl.Then)
			return
		}
		sh.noErrExit++
		sh.stmts(ctx, cl.Cond)
		sh.noErrExit--
		if sh.stopped(ctx) {
			return
		}
		if sh.exit == 0 {
			sh.stmts(ctx, cl.Then)
			return
		}
	}
	sh.exit, sh.exempt = 0, false
}

// loopBody runs a loop body and reports whether the loop should stop.
func (sh *shell) loopBody(ctx context.Context, body []*syntax.Stmt) (stop bool) {
	sh.loops++
	sh.stmts(ctx, body)
	sh.loops--
	if sh.breakN > 0 {
		sh.breakN--
		return true
	}
	if sh.contN > 0 {
		sh.contN--
		return sh.contN > 0 // continue N>1 continues an outer loop
	}
	return sh.stopped(ctx)
}

func (sh *shell) whileClause(ctx context.Context, c *syntax.WhileClause) {
	status := 0
	for !sh.stopped(ctx) {
		sh.noErrExit++
		sh.stmts(ctx, c.Cond)
		sh.noErrExit--
		if sh.stopped(ctx) {
			break
		}
		if (sh.exit == 0) == c.Until {
			break
		}
		if sh.loopBody(ctx, c.Do) {
			status = sh.exit
			sh.exit = status
			return
		}
		status = sh.exit
	}
	if !sh.exiting && !sh.returning && ctx.Err() == nil {
		sh.exit, sh.exempt = status, false
	}
}

func (sh *shell) forClause(ctx context.Context, c *syntax.ForClause) {
	if c.Select {
		sh.errf("line %d: select is not supported in this shell", sh.lineno)
		sh.exit = exitUsage
		return
	}
	sh.exit = 0
	switch l := c.Loop.(type) {
	case *syntax.WordIter:
		var items []string
		if l.InPos.IsValid() || len(l.Items) > 0 {
			fields, release, err := sh.fields(ctx, l.Items...)
			if err != nil {
				sh.expandErr(err)
				return
			}
			defer release()
			items = fields
		} else {
			items = append([]string(nil), sh.params...)
		}
		for _, it := range items {
			if sh.stopped(ctx) {
				return
			}
			if err := sh.setVar(l.Name.Value, it); err != nil {
				sh.setErr(err)
				return
			}
			if sh.loopBody(ctx, c.Do) {
				return
			}
		}
	case *syntax.CStyleLoop:
		if l.Init != nil {
			if _, err := sh.arith(ctx, l.Init); err != nil {
				sh.errf("%v", err)
				sh.exit = 1
				return
			}
		}
		for !sh.stopped(ctx) {
			if l.Cond != nil {
				n, err := sh.arith(ctx, l.Cond)
				if err != nil {
					sh.errf("%v", err)
					sh.exit = 1
					return
				}
				if n == 0 {
					break
				}
			}
			if sh.loopBody(ctx, c.Do) {
				return
			}
			if l.Post != nil {
				if _, err := sh.arith(ctx, l.Post); err != nil {
					sh.errf("%v", err)
					sh.exit = 1
					return
				}
			}
		}
	}
}

func (sh *shell) caseClause(ctx context.Context, c *syntax.CaseClause) {
	word, release, err := sh.literal(ctx, c.Word)
	if err != nil {
		sh.expandErr(err)
		return
	}
	defer release()
	sh.exit = 0
	matched := false
	for i := 0; i < len(c.Items); i++ {
		it := c.Items[i]
		if !matched {
			for _, p := range it.Patterns {
				pat, rel, err := sh.pattern(ctx, p)
				if err != nil {
					sh.expandErr(err)
					return
				}
				ok := sh.match(pat, word, false)
				rel()
				if ok {
					matched = true
					break
				}
			}
		}
		if !matched {
			continue
		}
		sh.stmts(ctx, it.Stmts)
		switch it.Op {
		case syntax.Fallthrough:
			continue // run the next item's body too
		case syntax.Resume, syntax.ResumeKorn:
			matched = false // test the next patterns
			continue
		}
		return
	}
}

// background starts a statement as a job: a goroutine running a copy of
// the shell. It ends with the command line at the latest.
func (sh *shell) background(ctx context.Context, st *syntax.Stmt) {
	sub, err := sh.subshell()
	if err != nil {
		sh.fail(err)
		return
	}
	if err := sh.s.jobs.begin(); err != nil {
		sub.vars.drop()
		sh.fail(err)
		return
	}
	fg := *st
	fg.Background, fg.Disown = false, false
	j := &job{pid: sub.pid, done: make(chan struct{})}
	sh.bg.add(j)
	sh.lastBg = j.pid
	sh.s.wg.Add(1)
	jctx, cancel := context.WithCancelCause(sh.s.ctx)
	j.cancel = cancel
	go func() {
		defer sh.s.wg.Done()
		defer sh.s.recoverInternal()
		defer sh.s.jobs.end()
		defer cancel(nil)
		sub.stmt(jctx, &fg)
		sub.endSubshell(jctx)
		j.status = sub.exit
		close(j.done)
	}()
	sh.exit, sh.exempt = 0, false
}

// job is a background job.
type job struct {
	pid    int
	status int
	done   chan struct{}
	cancel context.CancelCauseFunc
}

type jobTable struct {
	mu   sync.Mutex
	jobs []*job
}

func (t *jobTable) add(j *job) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.jobs = append(t.jobs, j)
}

func (t *jobTable) list() []*job {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*job(nil), t.jobs...)
}

func (t *jobTable) find(pid int) *job {
	for _, j := range t.list() {
		if j.pid == pid {
			return j
		}
	}
	return nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// pathErrText is the short text of a file error, as shells print it.
func pathErrText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return errText(err)
}
