package shell

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/interp"
	"mvdan.cc/sh/v3/syntax"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// The guard bounds what a command line can make the host process hold.
// The interpreter exposes no hook on variable writes, so the guard works
// from the hooks it has (see RATIONALE.md, "Bounding the host-side shell"):
//
//   - before every simple command (CallHandler) it sums the sizes of all
//     variables, the command's arguments and the command-substitution
//     buffer being filled, and checks the Go stack depth;
//   - before every word with an expansion is expanded, a checkpoint inserted
//     into the word at parse time (an empty "$(<path)" that reads through
//     the OpenHandler and changes no exit status) adds an upper bound of the
//     word's expansion to that sum, so even a loop of bare assignments such
//     as x="$x$x$x$x" stops before it allocates past the cap;
//   - read and mapfile, which accumulate input without a bound, are fed
//     through a capped copier; printf's field widths are bounded;
//   - code built at run time (eval, trap, source) is parsed and instrumented
//     the same way before it runs; process substitution (a host FIFO) and
//     brace expansions over maxBraceFields fields are refused;
//   - every job (a pipeline stage or a background command, each a
//     goroutine and possibly a pipe) is wrapped at parse time as
//     { __rb_job_begin; ( JOB ) && __rb_job_end 0 || __rb_job_end $?; },
//     which keeps the job's status and always reaches the end (an exit or
//     errexit stays inside the subshell), so the guard counts the jobs
//     alive and stops a command line that holds more than its cap.
type guard struct {
	limits Limits
	cancel context.CancelCauseFunc
	jobs   atomic.Int64
	calls  atomic.Int64

	oom     atomic.Bool
	mu      sync.Mutex
	why     string
	words   []*syntax.Word
	sources map[string][]byte
}

const (
	checkPrefix  = "/dev/.rollbox-check/"
	sourcePrefix = "/dev/.rollbox-source/"
	// maxFrames bounds the Go stack a command line may grow to through
	// nested functions, eval and sh: a goroutine that overflows Go's stack
	// limit would crash the whole process.
	maxFrames = 8000
	// maxBraceFields bounds one brace expansion.
	maxBraceFields = 1 << 16
)

func newGuard(l Limits) *guard {
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = 64 << 20
	}
	if l.Jobs <= 0 {
		l.Jobs = 256
	}
	return &guard{limits: l, sources: map[string][]byte{}}
}

func (g *guard) outOfMemory(format string, args ...any) error {
	g.mu.Lock()
	if g.why == "" {
		g.why = fmt.Sprintf(format, args...)
	}
	g.mu.Unlock()
	g.oom.Store(true)
	if g.cancel != nil {
		g.cancel(ErrOOM)
	}
	return fmt.Errorf("%w: %s", ErrOOM, g.reason())
}

func (g *guard) reason() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.why
}

// fatal returns the error that stops the command line, if any.
func (g *guard) fatal() error {
	if g.oom.Load() {
		return fmt.Errorf("%w: %s", ErrOOM, g.reason())
	}
	return nil
}

// varsSize sums the sizes of the variables visible in env.
func varsSize(env expand.Environ) int64 {
	var n int64
	env.Each(func(name string, vr expand.Variable) bool {
		n += int64(len(name)) + int64(len(vr.Str)) + 16
		for _, s := range vr.List {
			n += int64(len(s)) + 16
		}
		for k, v := range vr.Map {
			n += int64(len(k)+len(v)) + 32
		}
		return true
	})
	return n
}

func bufferLen(w io.Writer) int64 {
	if b, ok := w.(interface{ Len() int }); ok {
		return int64(b.Len())
	}
	return 0
}

// state is the memory the command line holds as seen from hc.
func (g *guard) state(hc interp.HandlerContext) int64 {
	return varsSize(hc.Env) + bufferLen(hc.Stdout)
}

var framesPool = sync.Pool{New: func() any { return make([]uintptr, 1) }}

// checkCall runs before every simple command.
func (g *guard) checkCall(hc interp.HandlerContext, args []string) error {
	if err := g.fatal(); err != nil {
		return err
	}
	// Walking the stack costs its depth, so look every 8th call: a
	// recursion overshoots by a few levels at most.
	deep := false
	if g.calls.Add(1)%8 == 0 {
		pcs := framesPool.Get().([]uintptr)
		deep = runtime.Callers(maxFrames, pcs) > 0
		framesPool.Put(pcs)
	}
	if deep {
		return g.outOfMemory("nesting too deep (functions, eval or sh calling themselves)")
	}
	var argBytes int64
	for _, a := range args {
		argBytes += int64(len(a)) + 16
	}
	if args[0] == "printf" {
		argBytes += printfBound(args[1:])
	}
	if used := g.state(hc) + argBytes; used > g.limits.MemoryBytes {
		return g.outOfMemory("the shell's variables and arguments would exceed the %d MB memory limit", g.limits.MemoryBytes>>20)
	}
	return nil
}

// printfBound bounds the bytes printf's field widths and precisions add.
func printfBound(args []string) int64 {
	if len(args) == 0 {
		return 0
	}
	format, rest := args[0], args[1:]
	if len(rest) > 0 && format == "-v" && len(rest) >= 2 {
		format, rest = rest[1], rest[2:]
	}
	var perPass int64
	stars := 0
	verbs := 0
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		i++
		num := 0
		for ; i < len(format) && strings.IndexByte("-+ #0123456789.*", format[i]) >= 0; i++ {
			switch c := format[i]; {
			case c == '*':
				stars++
			case c >= '0' && c <= '9':
				num = num*10 + int(c-'0')
				if num > math.MaxInt32 {
					num = math.MaxInt32
				}
			case c == '.':
				perPass += int64(num)
				num = 0
			}
		}
		perPass += int64(num)
		verbs++
	}
	for _, a := range rest {
		if n, err := strconv.ParseInt(strings.TrimSpace(a), 10, 64); err == nil && n > 0 && stars > 0 {
			perPass += n
		}
	}
	passes := int64(1)
	if verbs > 0 {
		passes += int64(len(rest) / verbs)
	}
	return perPass*passes + int64(len(format))*passes
}

// limitBuffer wraps a command's output when it is an in-memory buffer (a
// command substitution): writes past the memory cap stop the command line.
func (g *guard) limitBuffer(hc interp.HandlerContext, w io.Writer) io.Writer {
	if _, ok := w.(interface{ Len() int }); !ok {
		return w
	}
	return &limitedWriter{w: w, room: g.limits.MemoryBytes - g.state(hc), g: g}
}

type limitedWriter struct {
	w    io.Writer
	room int64
	g    *guard
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.room {
		return 0, l.g.outOfMemory("a command substitution's output would exceed the %d MB memory limit", l.g.limits.MemoryBytes>>20)
	}
	l.room -= int64(len(p))
	return l.w.Write(p)
}

// checkpoint is the OpenHandler side of a word checkpoint: it bounds the
// word's expansion before the interpreter expands it.
func (g *guard) checkpoint(hc interp.HandlerContext, p string) (io.ReadWriteCloser, error) {
	id, err := strconv.Atoi(strings.TrimPrefix(p, checkPrefix))
	g.mu.Lock()
	var w *syntax.Word
	if err == nil && id >= 0 && id < len(g.words) {
		w = g.words[id]
	}
	g.mu.Unlock()
	empty := nopCloser{Reader: strings.NewReader("")}
	if w == nil {
		return empty, nil
	}
	vars := varsSize(hc.Env)
	total := vars + bufferLen(hc.Stdout) + wordBound(w, hc.Env, vars)
	if total > g.limits.MemoryBytes {
		return nil, g.outOfMemory("expanding a word would exceed the %d MB memory limit", g.limits.MemoryBytes>>20)
	}
	return empty, nil
}

// wordBound is an upper bound of the bytes a word expands to; vars (the
// total size of all variables) bounds any one parameter expansion.
func wordBound(w *syntax.Word, env expand.Environ, vars int64) int64 {
	if w == nil {
		return 0
	}
	return partsBound(w.Parts, env, vars)
}

func partsBound(parts []syntax.WordPart, env expand.Environ, vars int64) int64 {
	var n int64
	for _, p := range parts {
		switch p := p.(type) {
		case *syntax.Lit:
			n += int64(len(p.Value))
		case *syntax.SglQuoted:
			n += int64(len(p.Value))
		case *syntax.DblQuoted:
			n += partsBound(p.Parts, env, vars)
		case *syntax.ParamExp:
			n += paramBound(p, env, vars)
		case *syntax.ArithmExp:
			n += 24
		default: // command substitutions are bounded as they write
			n += 16
		}
	}
	return n
}

func paramBound(p *syntax.ParamExp, env expand.Environ, vars int64) int64 {
	if p.Length || p.Width {
		return 24
	}
	base := vars
	if p.Param != nil && p.Index == nil && !p.Excl && p.Names == 0 {
		vr := env.Get(p.Param.Value)
		base = int64(len(vr.Str))
		for _, s := range vr.List {
			base += int64(len(s)) + 1
		}
		for _, s := range vr.Map {
			base += int64(len(s)) + 1
		}
		if vr.Kind == expand.Unknown && !vr.IsSet() {
			switch p.Param.Value {
			case "@", "*", "#", "?", "$", "!", "-", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "RANDOM", "SRANDOM", "PPID", "DIRSTACK":
				base = vars // positional parameters are not visible here
			}
		}
	}
	if p.Exp != nil {
		base += wordBound(p.Exp.Word, env, vars)
	}
	if p.Repl != nil {
		with := wordBound(p.Repl.With, env, vars)
		base = base*(with+1) + with
	}
	return base
}

// sourced serves an instrumented copy of a file given to source or ".".
func (g *guard) sourced(p string) (io.ReadWriteCloser, error) {
	g.mu.Lock()
	data := g.sources[p]
	delete(g.sources, p)
	g.mu.Unlock()
	return nopCloser{Reader: bytes.NewReader(data)}, nil
}

// rewriteCall replaces calls the interpreter would run unguarded.
func (g *guard) rewriteCall(hc interp.HandlerContext, fsys *vfs.FS, args []string) ([]string, error) {
	switch args[0] {
	case "__rb_read":
		return append([]string{"read"}, args[1:]...), nil
	case "__rb_mapfile":
		return append([]string{"mapfile"}, args[1:]...), nil
	case "read", "mapfile", "readarray":
		// Only reached through eval-less indirection ("$cmd", builtin,
		// command): those calls would read unbounded input.
		return []string{"__rb_refuse", args[0] + ": only direct calls are supported in this shell"}, nil
	case "builtin", "command":
		if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
			switch args[1] {
			case "read", "mapfile", "readarray", "eval", "source", ".", "trap":
				return []string{"__rb_refuse", args[0] + " " + args[1] + ": not supported in this shell"}, nil
			}
		}
		if args[0] == "command" && len(args) > 2 && (args[1] == "-v" || args[1] == "-V") {
			return append([]string{"__rb_which", args[1]}, args[2:]...), nil
		}
	case "type", "hash", "which":
		return append([]string{"__rb_which", "-t:" + args[0]}, args[1:]...), nil
	case "eval":
		src := strings.Join(args[1:], " ")
		out, err := g.instrumentSource(src, "eval")
		if err != nil {
			return args, nil // let eval report the syntax error
		}
		return []string{"eval", out}, nil
	case "trap":
		if len(args) > 2 && !strings.HasPrefix(args[1], "-") {
			out, err := g.instrumentSource(args[1], "trap")
			if err == nil {
				args = append([]string{"trap", out}, args[2:]...)
			}
		}
	case "source", ".":
		if len(args) < 2 {
			return args, nil
		}
		data, err := fsys.ReadFile(abs(hc.Dir, args[1]), 0)
		if err != nil {
			return args, nil // let source report it
		}
		out, err := g.instrumentSource(string(data), args[1])
		if err != nil {
			return args, nil
		}
		g.mu.Lock()
		key := sourcePrefix + strconv.Itoa(len(g.sources)) + "-" + strconv.Itoa(len(g.words))
		g.sources[key] = []byte(out)
		g.mu.Unlock()
		return append([]string{args[0], key}, args[2:]...), nil
	}
	return args, nil
}

// instrumentSource parses code made at run time, instruments it and prints
// it back.
func (g *guard) instrumentSource(src, name string) (string, error) {
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(src), name)
	if err != nil {
		return "", err
	}
	if err := g.instrument(f); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := syntax.NewPrinter().Print(&buf, f); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// instrument refuses what cannot be confined and inserts the checkpoints.
func (g *guard) instrument(f *syntax.File) error {
	var err error
	var words []*syntax.Word
	var reads []*syntax.Stmt
	var bgs []*syntax.Stmt
	var pipes []*syntax.BinaryCmd
	// stack of the nodes being visited, to know a word's context.
	var stack []syntax.Node
	syntax.Walk(f, func(n syntax.Node) bool {
		if err != nil {
			return false
		}
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		switch n := n.(type) {
		case *syntax.ProcSubst:
			err = fmt.Errorf("line %d: process substitution is not supported in this shell", n.Pos().Line())
			return false
		case *syntax.CoprocClause:
			err = fmt.Errorf("line %d: coproc is not supported in this shell", n.Pos().Line())
			return false
		case *syntax.Word:
			if c := braceFields(n); c > maxBraceFields {
				err = fmt.Errorf("line %d: brace expansion of %d fields is over the limit of %d", n.Pos().Line(), c, maxBraceFields)
				return false
			}
			if topLevelWord(stack) && hasExpansion(n.Parts) {
				words = append(words, n)
			}
		case *syntax.BinaryCmd:
			if n.Op == syntax.Pipe || n.Op == syntax.PipeAll {
				pipes = append(pipes, n)
			}
		case *syntax.Stmt:
			if n.Background || n.Disown {
				bgs = append(bgs, n)
			}
			if call, ok := n.Cmd.(*syntax.CallExpr); ok && len(call.Args) > 0 {
				switch call.Args[0].Lit() {
				case "read", "mapfile", "readarray":
					reads = append(reads, n)
				}
			}
		}
		stack = append(stack, n)
		return true
	})
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, w := range words {
		id := len(g.words)
		g.words = append(g.words, w)
		check := &syntax.CmdSubst{Stmts: []*syntax.Stmt{{Redirs: []*syntax.Redirect{{
			Op: syntax.RdrIn, Word: lit(checkPrefix + strconv.Itoa(id))}}}}}
		w.Parts = append([]syntax.WordPart{check}, w.Parts...)
	}
	for _, st := range reads {
		call := st.Cmd.(*syntax.CallExpr)
		name := call.Args[0].Lit()
		feeder := "__rb_line"
		call.Args[0] = lit("__rb_read")
		if name != "read" {
			feeder = "__rb_cap"
			call.Args[0] = lit("__rb_mapfile")
		} else if readIsRaw(call.Args[1:]) {
			feeder = "__rb_line_raw"
		}
		st.Cmd = &syntax.BinaryCmd{Op: syntax.Pipe,
			X: &syntax.Stmt{Cmd: &syntax.CallExpr{Args: []*syntax.Word{lit(feeder)}}},
			Y: &syntax.Stmt{Cmd: call}}
	}
	for _, st := range bgs {
		inner := *st
		inner.Background, inner.Disown = false, false
		*st = syntax.Stmt{Cmd: countedJob(&inner).Cmd, Background: true, Position: st.Position}
	}
	for _, bc := range pipes {
		bc.X = countedJob(bc.X)
	}
	return nil
}

// countedJob wraps a job so the guard counts it while it runs:
// { __rb_job_begin; ( JOB ) && __rb_job_end 0 || __rb_job_end $?; }
func countedJob(job *syntax.Stmt) *syntax.Stmt {
	call := func(args ...*syntax.Word) *syntax.Stmt { return &syntax.Stmt{Cmd: &syntax.CallExpr{Args: args}} }
	status := &syntax.Word{Parts: []syntax.WordPart{&syntax.ParamExp{Short: true, Param: &syntax.Lit{Value: "?"}}}}
	and := &syntax.BinaryCmd{Op: syntax.AndStmt,
		X: &syntax.Stmt{Cmd: &syntax.Subshell{Stmts: []*syntax.Stmt{job}}},
		Y: call(lit("__rb_job_end"), lit("0"))}
	or := &syntax.BinaryCmd{Op: syntax.OrStmt, X: &syntax.Stmt{Cmd: and}, Y: call(lit("__rb_job_end"), status)}
	return &syntax.Stmt{Cmd: &syntax.Block{Stmts: []*syntax.Stmt{call(lit("__rb_job_begin")), {Cmd: or}}}}
}

// jobBegin counts a job in; past the cap the command line is stopped.
func (g *guard) jobBegin() bool {
	if n := g.jobs.Add(1); n > int64(g.limits.Jobs) {
		g.mu.Lock()
		if g.why == "" {
			g.why = fmt.Sprintf("more than %d concurrent jobs (pipeline stages and background commands)", g.limits.Jobs)
		}
		g.mu.Unlock()
		if g.cancel != nil {
			g.cancel(ErrTooManyJobs)
		}
		return false
	}
	return true
}

func (g *guard) jobEnd() { g.jobs.Add(-1) }

func lit(s string) *syntax.Word {
	return &syntax.Word{Parts: []syntax.WordPart{&syntax.Lit{Value: s}}}
}

func readIsRaw(args []*syntax.Word) bool {
	for _, a := range args {
		s := a.Lit()
		if strings.HasPrefix(s, "-") && strings.Contains(s, "r") {
			return true
		}
	}
	return false
}

// topLevelWord reports whether a word being entered is expanded on its own
// (not part of an enclosing word, nor an arithmetic operand).
func topLevelWord(stack []syntax.Node) bool {
	for i := len(stack) - 1; i >= 0; i-- {
		switch stack[i].(type) {
		case *syntax.Word, *syntax.ArithmExp, *syntax.ArithmCmd, *syntax.LetClause:
			return false
		case *syntax.CmdSubst, *syntax.Stmt:
			return true
		}
	}
	return true
}

func hasExpansion(parts []syntax.WordPart) bool {
	for _, p := range parts {
		switch p := p.(type) {
		case *syntax.ParamExp, *syntax.CmdSubst, *syntax.ArithmExp:
			return true
		case *syntax.DblQuoted:
			if hasExpansion(p.Parts) {
				return true
			}
		}
	}
	return false
}

// braceFields counts the fields a word's brace expansion makes.
func braceFields(w *syntax.Word) int64 {
	cp := &syntax.Word{Parts: append([]syntax.WordPart(nil), w.Parts...)}
	if !syntax.SplitBraces(cp) {
		return 1
	}
	return countBraces(cp.Parts)
}

func countBraces(parts []syntax.WordPart) int64 {
	total := int64(1)
	for _, p := range parts {
		be, ok := p.(*syntax.BraceExp)
		if !ok {
			continue
		}
		var n int64
		if be.Sequence && len(be.Elems) >= 2 {
			a, b := be.Elems[0].Lit(), be.Elems[1].Lit()
			if x, err := strconv.ParseInt(a, 10, 64); err == nil {
				if y, err := strconv.ParseInt(b, 10, 64); err == nil {
					n = absDiff(x, y) + 1
				}
			} else if len(a) == 1 && len(b) == 1 {
				n = absDiff(int64(a[0]), int64(b[0])) + 1
			}
			if len(be.Elems) == 3 {
				if step, err := strconv.ParseInt(be.Elems[2].Lit(), 10, 64); err == nil && step != 0 {
					n = n/absDiff(step, 0) + 1
				}
			}
		} else {
			for _, e := range be.Elems {
				n += countBraces(e.Parts)
			}
		}
		if n < 1 {
			n = 1
		}
		total *= n
		if total > math.MaxInt32 {
			return math.MaxInt32
		}
	}
	return total
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

var _ = errors.New
