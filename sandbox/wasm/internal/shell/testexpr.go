package shell

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

// testExpr evaluates a [[ ]] expression.
func (sh *shell) testExpr(ctx context.Context, x syntax.TestExpr) (bool, error) {
	switch x := x.(type) {
	case *syntax.Word:
		s, release, err := sh.literal(ctx, x)
		if err != nil {
			return false, err
		}
		release()
		return s != "", nil
	case *syntax.ParenTest:
		return sh.testExpr(ctx, x.X)
	case *syntax.UnaryTest:
		if x.Op == syntax.TsNot {
			ok, err := sh.testExpr(ctx, x.X)
			return !ok, err
		}
		w, ok := x.X.(*syntax.Word)
		if !ok {
			return false, fmt.Errorf("unexpected operand of %s", x.Op)
		}
		s, release, err := sh.literal(ctx, w)
		if err != nil {
			return false, err
		}
		release()
		return sh.unaryTest(x.Op.String(), s)
	case *syntax.BinaryTest:
		switch x.Op {
		case syntax.AndTest:
			ok, err := sh.testExpr(ctx, x.X)
			if err != nil || !ok {
				return false, err
			}
			return sh.testExpr(ctx, x.Y)
		case syntax.OrTest:
			ok, err := sh.testExpr(ctx, x.X)
			if err != nil || ok {
				return ok, err
			}
			return sh.testExpr(ctx, x.Y)
		}
		lw, _ := x.X.(*syntax.Word)
		rw, _ := x.Y.(*syntax.Word)
		left, rl, err := sh.literal(ctx, lw)
		if err != nil {
			return false, err
		}
		defer rl()
		switch x.Op {
		case syntax.TsMatch, syntax.TsMatchShort, syntax.TsNoMatch:
			pat, rr, err := sh.pattern(ctx, rw)
			if err != nil {
				return false, err
			}
			defer rr()
			m := sh.match(pat, left, false)
			return m == (x.Op != syntax.TsNoMatch), nil
		case syntax.TsReMatch:
			return sh.reMatch(ctx, left, rw)
		}
		right, rr, err := sh.literal(ctx, rw)
		if err != nil {
			return false, err
		}
		defer rr()
		return sh.binaryTest(ctx, x.Op.String(), left, right, true)
	}
	return false, fmt.Errorf("unsupported test expression %T", x)
}

// reMatch is [[ s =~ re ]]: quoted parts of re match literally; the match
// and its groups go to BASH_REMATCH.
func (sh *shell) reMatch(ctx context.Context, s string, w *syntax.Word) (bool, error) {
	var b strings.Builder
	for _, p := range w.Parts {
		switch p.(type) {
		case *syntax.SglQuoted, *syntax.DblQuoted:
			lit, release, err := sh.literal(ctx, &syntax.Word{Parts: []syntax.WordPart{p}})
			if err != nil {
				return false, err
			}
			release()
			b.WriteString(regexp.QuoteMeta(lit))
		default:
			lit, release, err := sh.literal(ctx, &syntax.Word{Parts: []syntax.WordPart{p}})
			if err != nil {
				return false, err
			}
			release()
			b.WriteString(lit)
		}
	}
	rx, err := regexp.Compile(b.String())
	if err != nil {
		return false, nil // an invalid regex fails the test (status 2 in bash)
	}
	m := rx.FindStringSubmatch(s)
	if m == nil {
		sh.vars.set("BASH_REMATCH", expand.Variable{Set: true, Kind: expand.Indexed}, false)
		return false, nil
	}
	if err := sh.vars.set("BASH_REMATCH", expand.Variable{Set: true, Kind: expand.Indexed, List: m}, false); err != nil {
		return false, err
	}
	return true, nil
}

func (sh *shell) stat(name string, follow bool) (fs.FileInfo, error) {
	if name == "" {
		return nil, fs.ErrNotExist
	}
	p := abs(sh.dir, name)
	if strings.HasPrefix(p, "/dev/fd/") || p == "/dev/stdin" || p == "/dev/stdout" || p == "/dev/stderr" {
		return nil, fs.ErrNotExist
	}
	if follow {
		return sh.s.cfg.FS.Stat(p)
	}
	return sh.s.cfg.FS.Lstat(p)
}

// unaryTest evaluates -f FILE and friends against the episode's files.
func (sh *shell) unaryTest(op, s string) (bool, error) {
	statMode := func(follow bool, check func(fs.FileInfo) bool) bool {
		fi, err := sh.stat(s, follow)
		return err == nil && check(fi)
	}
	switch op {
	case "-e", "-a":
		return statMode(true, func(fs.FileInfo) bool { return true }), nil
	case "-f":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Mode().IsRegular() }), nil
	case "-d":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.IsDir() }), nil
	case "-c":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Mode()&fs.ModeCharDevice != 0 }), nil
	case "-b":
		return statMode(true, func(fi fs.FileInfo) bool {
			return fi.Mode()&fs.ModeDevice != 0 && fi.Mode()&fs.ModeCharDevice == 0
		}), nil
	case "-p":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Mode()&fs.ModeNamedPipe != 0 }), nil
	case "-S":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Mode()&fs.ModeSocket != 0 }), nil
	case "-L", "-h":
		return statMode(false, func(fi fs.FileInfo) bool { return fi.Mode()&fs.ModeSymlink != 0 }), nil
	case "-k":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Mode()&fs.ModeSticky != 0 }), nil
	case "-g":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Mode()&fs.ModeSetgid != 0 }), nil
	case "-u":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Mode()&fs.ModeSetuid != 0 }), nil
	case "-G", "-O":
		return statMode(true, func(fs.FileInfo) bool { return true }), nil
	case "-N":
		return statMode(true, func(fs.FileInfo) bool { return true }), nil
	case "-r":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.IsDir() || fi.Mode().Perm()&0o444 != 0 }), nil
	case "-w":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Mode().Perm()&0o222 != 0 }), nil
	case "-x":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Mode().Perm()&0o111 != 0 }), nil
	case "-s":
		return statMode(true, func(fi fs.FileInfo) bool { return fi.Size() > 0 }), nil
	case "-t":
		return false, nil // no descriptor is a terminal here
	case "-z":
		return s == "", nil
	case "-n":
		return s != "", nil
	case "-o":
		for _, o := range setOptions {
			if o.name == s {
				return *o.get(&sh.opts), nil
			}
		}
		return false, nil
	case "-v":
		name, idx, hasIdx := strings.Cut(s, "[")
		vr := environ{sh}.Get(name)
		if !hasIdx {
			return vr.IsSet(), nil
		}
		idx = strings.TrimSuffix(idx, "]")
		if vr.Kind == expand.Associative {
			_, ok := vr.Map[idx]
			return ok, nil
		}
		i, err := strconv.Atoi(idx)
		if err != nil {
			return false, nil
		}
		_, ok := indexedGet(vr.List, vr.Indexes, i)
		return ok, nil
	case "-R":
		return sh.vars.get(s).Kind == expand.NameRef, nil
	}
	return false, fmt.Errorf("%s: unary operator expected", op)
}

// binaryTest evaluates the comparison operators; arith says the operands of
// -eq & co are arithmetic expressions ([[ ]]) rather than integers (test).
func (sh *shell) binaryTest(ctx context.Context, op, a, b string, arith bool) (bool, error) {
	num := func(s string) (int, error) {
		if arith {
			v, err := sh.arithString(ctx, s)
			if err != nil {
				return 0, err
			}
			return strconv.Atoi(v)
		}
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return 0, fmt.Errorf("%s: integer expression expected", s)
		}
		return n, nil
	}
	switch op {
	case "=", "==":
		return a == b, nil
	case "!=":
		return a != b, nil
	case "<":
		return a < b, nil
	case ">":
		return a > b, nil
	case "-eq", "-ne", "-lt", "-le", "-gt", "-ge":
		x, err := num(a)
		if err != nil {
			return false, err
		}
		y, err := num(b)
		if err != nil {
			return false, err
		}
		switch op {
		case "-eq":
			return x == y, nil
		case "-ne":
			return x != y, nil
		case "-lt":
			return x < y, nil
		case "-le":
			return x <= y, nil
		case "-gt":
			return x > y, nil
		}
		return x >= y, nil
	case "-nt", "-ot":
		fa, ea := sh.stat(a, true)
		fb, eb := sh.stat(b, true)
		if op == "-nt" {
			return ea == nil && (eb != nil || fa.ModTime().After(fb.ModTime())), nil
		}
		return eb == nil && (ea != nil || fa.ModTime().Before(fb.ModTime())), nil
	case "-ef":
		fa, ea := sh.stat(a, true)
		fb, eb := sh.stat(b, true)
		if ea != nil || eb != nil {
			return false, nil
		}
		ia, okA := fa.(interface{ Ino() uint64 })
		ib, okB := fb.(interface{ Ino() uint64 })
		return okA && okB && ia.Ino() == ib.Ino(), nil
	}
	return false, fmt.Errorf("%s: binary operator expected", op)
}

var errTestSyntax = errors.New("syntax error")

// bTest is test and [: POSIX's rules by argument count, then a
// recursive-descent parse with -a, -o, ! and parentheses.
func bTest(ctx context.Context, sh *shell, args []string) int {
	name := args[0]
	args = args[1:]
	if name == "[" {
		if len(args) == 0 || args[len(args)-1] != "]" {
			sh.builtinErr("[", "missing `]'")
			return 2
		}
		args = args[:len(args)-1]
	}
	t := &testParser{sh: sh, ctx: ctx, args: args}
	ok, err := t.eval()
	if err != nil {
		if errors.Is(err, ErrOOM) {
			sh.fail(err)
			return exitKilled
		}
		sh.builtinErr(name, "%v", err)
		return 2
	}
	return boolStatus(ok)
}

type testParser struct {
	sh   *shell
	ctx  context.Context
	args []string
	pos  int
}

var binaryOps = map[string]bool{"=": true, "==": true, "!=": true, "<": true, ">": true, "-eq": true, "-ne": true,
	"-lt": true, "-le": true, "-gt": true, "-ge": true, "-nt": true, "-ot": true, "-ef": true}

func isUnaryOp(s string) bool {
	return len(s) == 2 && s[0] == '-' && strings.IndexByte("abcdefghknoprstuvwxzGLNOSR", s[1]) >= 0
}

func (t *testParser) eval() (bool, error) {
	a := t.args
	switch len(a) {
	case 0:
		return false, nil
	case 1:
		return a[0] != "", nil
	case 2:
		if a[0] == "!" {
			return a[1] == "", nil
		}
		if isUnaryOp(a[0]) {
			return t.sh.unaryTest(a[0], a[1])
		}
		return false, fmt.Errorf("%s: unary operator expected", a[0])
	case 3:
		if binaryOps[a[1]] {
			return t.sh.binaryTest(t.ctx, a[1], a[0], a[2], false)
		}
		if a[1] == "-a" || a[1] == "-o" {
			break
		}
		if a[0] == "!" {
			inner := &testParser{sh: t.sh, ctx: t.ctx, args: a[1:]}
			ok, err := inner.eval()
			return !ok, err
		}
		if a[0] == "(" && a[2] == ")" {
			return a[1] != "", nil
		}
		return false, fmt.Errorf("%s: binary operator expected", a[1])
	case 4:
		if a[0] == "!" {
			inner := &testParser{sh: t.sh, ctx: t.ctx, args: a[1:]}
			ok, err := inner.eval()
			return !ok, err
		}
		if a[0] == "(" && a[3] == ")" {
			inner := &testParser{sh: t.sh, ctx: t.ctx, args: a[1:3]}
			return inner.eval()
		}
	}
	ok, err := t.or()
	if err == nil && t.pos < len(t.args) {
		err = fmt.Errorf("%s: %w", t.args[t.pos], errTestSyntax)
	}
	return ok, err
}

func (t *testParser) peek() string {
	if t.pos < len(t.args) {
		return t.args[t.pos]
	}
	return ""
}

func (t *testParser) or() (bool, error) {
	ok, err := t.and()
	for err == nil && t.peek() == "-o" {
		t.pos++
		r, e := t.and()
		ok, err = ok || r, e
	}
	return ok, err
}

func (t *testParser) and() (bool, error) {
	ok, err := t.not()
	for err == nil && t.peek() == "-a" {
		t.pos++
		r, e := t.not()
		ok, err = ok && r, e
	}
	return ok, err
}

func (t *testParser) not() (bool, error) {
	if t.peek() == "!" {
		t.pos++
		ok, err := t.not()
		return !ok, err
	}
	return t.primary()
}

func (t *testParser) primary() (bool, error) {
	if t.pos >= len(t.args) {
		return false, fmt.Errorf("argument expected")
	}
	a := t.args[t.pos]
	if a == "(" {
		t.pos++
		ok, err := t.or()
		if err != nil {
			return false, err
		}
		if t.peek() != ")" {
			return false, fmt.Errorf("`)' expected")
		}
		t.pos++
		return ok, nil
	}
	if t.pos+2 < len(t.args)+0 && binaryOps[t.args[t.pos+1]] {
		l, op, r := a, t.args[t.pos+1], t.args[t.pos+2]
		t.pos += 3
		return t.sh.binaryTest(t.ctx, op, l, r, false)
	}
	if isUnaryOp(a) && t.pos+1 < len(t.args) {
		t.pos += 2
		return t.sh.unaryTest(a, t.args[t.pos-1])
	}
	t.pos++
	return a != "", nil
}
