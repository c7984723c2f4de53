package shell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"regexp"
	"strconv"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/pattern"
	"mvdan.cc/sh/v3/syntax"
)

// transient tracks what one expansion holds while its result is in use:
// command-substitution output, the fields themselves, process
// substitutions to close. release gives it all back.
type transient struct {
	mem     *budget
	n       int64
	closers []io.Closer
	// caps bounds the output of command substitutions whose output a
	// pattern replacement multiplies (${x//a/$(cmd)}).
	caps map[*syntax.CmdSubst]int64
}

func (t *transient) release() {
	t.mem.release(t.n)
	t.n = 0
	closeAll(t.closers)
	t.closers = nil
}

// config is the expansion configuration for sh, charging to t.
func (sh *shell) config(ctx context.Context, t *transient) *expand.Config {
	cfg := &expand.Config{
		Env:        environ{sh},
		NoUnset:    sh.opts.nounset,
		GlobStar:   sh.opts.globstar,
		DotGlob:    sh.opts.dotglob,
		NullGlob:   sh.opts.nullglob,
		ExtGlob:    sh.opts.extglob,
		NoCaseGlob: sh.opts.nocaseglob,
		CmdSubst: func(w io.Writer, cs *syntax.CmdSubst) error {
			return sh.cmdSubst(ctx, t, w, cs)
		},
		ProcSubst: func(ps *syntax.ProcSubst) (string, error) {
			return sh.procSubst(ctx, t, ps)
		},
	}
	if !sh.opts.noglob {
		fsys := sh.s.cfg.FS
		cfg.ReadDir2 = func(p string) ([]fs.DirEntry, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return fsys.ReadDir(abs(sh.dir, p))
		}
	}
	return cfg
}

// chargedWriter charges what it passes on, up to a cap.
type chargedWriter struct {
	w   io.Writer
	t   *transient
	cap int64 // <0: none beyond the budget
}

func (c *chargedWriter) Write(p []byte) (int, error) {
	n := int64(len(p))
	if c.cap >= 0 {
		if n > c.cap {
			return 0, c.t.mem.fail("a command substitution's output, multiplied by a pattern replacement,")
		}
		c.cap -= n
	}
	if err := c.t.mem.charge(n, "a command substitution's output"); err != nil {
		return 0, err
	}
	c.t.n += n
	return c.w.Write(p)
}

func (sh *shell) cmdSubst(ctx context.Context, t *transient, w io.Writer, cs *syntax.CmdSubst) error {
	capN := int64(-1)
	if c, ok := t.caps[cs]; ok {
		capN = c
	}
	out := &chargedWriter{w: w, t: t, cap: capN}
	// $(< file) reads the file, as bash does.
	if len(cs.Stmts) == 1 && cs.Stmts[0].Cmd == nil && len(cs.Stmts[0].Redirs) == 1 && cs.Stmts[0].Redirs[0].Op == syntax.RdrIn {
		name, release, err := sh.literal(ctx, cs.Stmts[0].Redirs[0].Word)
		if err != nil {
			return err
		}
		defer release()
		var closers []io.Closer
		e, err := sh.openRedir(name, 0, &closers, false)
		if err != nil {
			sh.errf("%v", err)
			sh.exit = 1
			return nil
		}
		defer closeAll(closers)
		if _, err := io.Copy(out, e.r); err != nil && (errors.Is(err, ErrOOM) || ctx.Err() != nil) {
			return err
		}
		sh.exit = 0
		return nil
	}
	sub, err := sh.subshell()
	if err != nil {
		return err
	}
	sub.fds.set(1, &fdEnt{w: out, name: "command substitution"})
	sub.stmts(ctx, cs.Stmts)
	sub.endSubshell(ctx)
	sh.exit = sub.exit
	if sh.s.mem.oom.Load() {
		return fmt.Errorf("%w: %s", ErrOOM, sh.s.mem.reason())
	}
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	return nil
}

// procSubst starts <(cmd) or >(cmd) as a job joined to an in-memory pipe
// named /dev/fd/N, which this shell's redirections and builtins open.
func (sh *shell) procSubst(ctx context.Context, t *transient, ps *syntax.ProcSubst) (string, error) {
	sub, err := sh.subshell()
	if err != nil {
		return "", err
	}
	pr, pw, err := newPipe(ctx, sh.s.mem)
	if err != nil {
		sub.vars.drop()
		return "", err
	}
	if err := sh.s.jobs.begin(); err != nil {
		pr.Close()
		pw.Close()
		sub.vars.drop()
		return "", err
	}
	s := sh.s
	s.psMu.Lock()
	p := "/dev/fd/" + strconv.Itoa(s.nextFD)
	s.nextFD++
	var mine io.Closer
	if ps.Op == syntax.CmdIn {
		s.procSubst[p] = pr
		sub.fds.set(1, &fdEnt{w: pw, name: "pipe"})
		mine = pw
	} else {
		s.procSubst[p] = pw
		sub.fds.set(0, &fdEnt{r: newSharedReader(pr), name: "pipe"})
		mine = pr
	}
	s.psMu.Unlock()
	// Closing the path's end when the expansion's command is done
	// releases the job (EPIPE or EOF) if nothing opened it.
	t.closers = append(t.closers, psCloser{s, p})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.recoverInternal()
		defer s.jobs.end()
		defer mine.Close()
		sub.stmts(ctx, ps.Stmts)
		sub.endSubshell(ctx)
	}()
	return p, nil
}

type psCloser struct {
	s *session
	p string
}

func (c psCloser) Close() error {
	if e := c.s.procSubstEnd(c.p); e != nil {
		e.c.Close()
	}
	return nil
}

// fields expands words into fields (brace expansion, splitting, globbing),
// checking each word's bound before expanding it and charging the fields.
// release gives back what they hold.
func (sh *shell) fields(ctx context.Context, words ...*syntax.Word) ([]string, func(), error) {
	t := &transient{mem: sh.s.mem}
	fail := func(err error) ([]string, func(), error) {
		t.release()
		return nil, func() {}, err
	}
	var out []string
	add := func(f string) error {
		if err := sh.s.mem.charge(int64(len(f))+16, "expanding the command's words"); err != nil {
			return err
		}
		t.n += int64(len(f)) + 16
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		out = append(out, f)
		return nil
	}
	ifs, custom := sh.ifsHasNonSpace()
	for _, w := range words {
		if err := sh.bound(t, w); err != nil {
			return fail(err)
		}
		w, err := sh.rewrite(ctx, w)
		if err != nil {
			return fail(err)
		}
		if custom && singleExpansion(w) {
			if err := sh.splitWord(ctx, t, w, ifs, add); err != nil {
				return fail(err)
			}
			continue
		}
		for f, err := range expand.FieldsSeq(sh.config(ctx, t), w) {
			if err == nil {
				err = add(f)
			}
			if err != nil {
				return fail(err)
			}
		}
	}
	return out, t.release, nil
}

// literal expands one word without splitting or globbing.
func (sh *shell) literal(ctx context.Context, w *syntax.Word) (string, func(), error) {
	return sh.expandOne(ctx, w, expand.Literal)
}

// document expands a here-document body.
func (sh *shell) document(ctx context.Context, w *syntax.Word) (string, func(), error) {
	return sh.expandOne(ctx, w, expand.Document)
}

// pattern expands a word as a pattern (quoted parts escaped).
func (sh *shell) pattern(ctx context.Context, w *syntax.Word) (string, func(), error) {
	return sh.expandOne(ctx, w, expand.Pattern)
}

func (sh *shell) expandOne(ctx context.Context, w *syntax.Word, fn func(*expand.Config, *syntax.Word) (string, error)) (string, func(), error) {
	if w == nil {
		return "", func() {}, nil
	}
	t := &transient{mem: sh.s.mem}
	if err := sh.bound(t, w); err != nil {
		return "", func() {}, err
	}
	w, err := sh.rewrite(ctx, w)
	if err != nil {
		return "", func() {}, err
	}
	s, err := fn(sh.config(ctx, t), w)
	if err != nil {
		t.release()
		return "", func() {}, err
	}
	if err := sh.s.mem.charge(int64(len(s)), "expanding a word"); err != nil {
		t.release()
		return "", func() {}, err
	}
	t.n += int64(len(s))
	return s, t.release, nil
}

// arith evaluates an arithmetic expression.
func (sh *shell) arith(ctx context.Context, x syntax.ArithmExpr) (int, error) {
	t := &transient{mem: sh.s.mem}
	defer t.release()
	var err error
	syntax.Walk(x, func(n syntax.Node) bool {
		if w, ok := n.(*syntax.Word); ok && err == nil {
			err = sh.bound(t, w)
			return false
		}
		return err == nil
	})
	if err != nil {
		return 0, err
	}
	n, err := expand.Arithm(sh.config(ctx, t), x)
	if err != nil {
		return 0, err
	}
	return n, nil
}

// bound refuses a word whose expansion could exceed the memory left, before
// any of it is built: parameter sizes are known, pattern replacements
// multiply, command substitutions are charged as they write (those a
// replacement multiplies get a cap here).
func (sh *shell) bound(t *transient, w *syntax.Word) error {
	if w == nil {
		return nil
	}
	if n := braceFields(w); n > maxBraceFields {
		return sh.s.mem.fail("a brace expansion of %d fields", n)
	}
	b := sh.partsBound(t, w.Parts, 1)
	return sh.s.mem.fits(b, "expanding a word")
}

// maxBraceFields bounds one brace expansion before it is built.
const maxBraceFields = 1 << 16

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// partsBound is an upper bound of the bytes parts expand to; mult is how
// many times an enclosing replacement repeats them.
func (sh *shell) partsBound(t *transient, parts []syntax.WordPart, mult int64) int64 {
	var n int64
	for _, p := range parts {
		switch p := p.(type) {
		case *syntax.Lit:
			n = satAdd(n, int64(len(p.Value)))
		case *syntax.SglQuoted:
			n = satAdd(n, int64(len(p.Value)))
		case *syntax.DblQuoted:
			n = satAdd(n, sh.partsBound(t, p.Parts, mult))
		case *syntax.ParamExp:
			n = satAdd(n, sh.paramBound(t, p, mult))
		case *syntax.CmdSubst:
			if mult > 1 {
				if t.caps == nil {
					t.caps = map[*syntax.CmdSubst]int64{}
				}
				room := sh.s.mem.limit - sh.s.mem.used.Load()
				t.caps[p] = max(room/mult, 0)
			}
			n = satAdd(n, 16) // charged as it writes
		case *syntax.ArithmExp:
			n = satAdd(n, 24)
		default:
			n = satAdd(n, 16)
		}
	}
	return n
}

// paramBound bounds one parameter expansion.
func (sh *shell) paramBound(t *transient, p *syntax.ParamExp, mult int64) int64 {
	if p.Length || p.Width {
		return 24
	}
	// Anything not a plain variable (indirection, name lists, special
	// arrays) is bounded by everything the command line holds.
	base := sh.s.mem.used.Load()
	if p.Param != nil && !p.Excl && p.Names == 0 {
		vr := environ{sh}.Get(p.Param.Value)
		switch {
		case vr.Kind == expand.Indexed || vr.Kind == expand.Associative:
			var s int64
			for _, e := range vr.List {
				s += int64(len(e)) + 1
			}
			for _, e := range vr.Map {
				s += int64(len(e)) + 1
			}
			base = s
		case vr.Kind == expand.NameRef:
		default:
			base = int64(len(vr.Str))
		}
	}
	if p.Exp != nil && p.Exp.Word != nil {
		base = satAdd(base, sh.partsBound(t, p.Exp.Word.Parts, mult))
	}
	if p.Repl != nil {
		var with int64
		if p.Repl.With != nil {
			with = sh.partsBound(t, p.Repl.With.Parts, satMul(mult, base+1))
		}
		if p.Repl.Orig != nil {
			sh.partsBound(t, p.Repl.Orig.Parts, mult)
		}
		base = satAdd(satMul(base, with+1), with)
	}
	if p.Slice != nil {
		// Offsets and lengths are arithmetic: nothing to add.
	}
	return base
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
		total = satMul(total, n)
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

// match reports whether s matches the shell pattern pat (already
// expanded, quoted parts escaped).
func (sh *shell) match(pat, s string, partial bool) bool {
	mode := pattern.EntireString
	if sh.opts.extglob {
		mode |= pattern.ExtendedOperators
	}
	if partial {
		mode = 0
	}
	expr, err := pattern.Regexp(pat, mode)
	if err != nil {
		return pat == s
	}
	rx, err := regexp.Compile(expr)
	if err != nil {
		return pat == s
	}
	return rx.MatchString(s)
}

// expandErr reports an expansion error as the shell does; an unset
// variable under set -u ends the shell.
func (sh *shell) expandErr(err error) {
	var unset expand.UnsetParameterError
	switch {
	case errors.Is(err, ErrOOM) || errors.Is(err, ErrTooManyJobs):
		sh.fail(err)
		return
	case errors.As(err, &unset):
		// bash ends a non-interactive shell with 127 here.
		sh.errf("%v", err)
		sh.exit = exitNotFound
		sh.exiting = true
		return
	case errors.Is(err, errCommandDone) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		sh.exit = exitKilled
		return
	}
	sh.errf("%v", err)
	sh.exit = 1
}
