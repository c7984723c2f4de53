package shell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

// call runs a simple command: assignments alone change the shell; with a
// command they are its environment only.
func (sh *shell) call(ctx context.Context, c *syntax.CallExpr) {
	fields, release, err := sh.fields(ctx, c.Args...)
	if err != nil {
		sh.expandErr(err)
		return
	}
	defer release()
	if len(fields) == 0 {
		sh.exit = 0
		for _, as := range c.Assigns {
			if err := sh.assign(ctx, as, "", false); err != nil {
				sh.assignFatal(err)
				return
			}
		}
		// The status is the last command substitution's, if any.
		return
	}
	if sh.opts.expandAliases {
		if v, ok := sh.aliases[fields[0]]; ok && !strings.Contains(v, "\n") {
			fields = append(strings.Fields(v), fields[1:]...)
			if len(fields) == 0 {
				sh.exit = 0
				return
			}
		}
	}
	if len(c.Assigns) > 0 {
		// Temporary assignments: a scope of their own, exported.
		sh.vars.push()
		defer sh.vars.pop()
		for _, as := range c.Assigns {
			if err := sh.assign(ctx, as, "", true); err != nil {
				sh.assignErr(err)
				return
			}
			if vr := sh.vars.scopes[len(sh.vars.scopes)-1][as.Name.Value]; vr != nil {
				vr.Exported = true
			}
		}
	}
	if sh.opts.xtrace {
		fmt.Fprintf(sh.stderr(), "%s%s\n", sh.vars.get("PS4").Str, quoteFields(fields))
	}
	sh.exec(ctx, fields, c)
	sh.pipeStatus = []int{sh.exit}
}

func quoteFields(fields []string) string {
	out := make([]string, len(fields))
	for i, f := range fields {
		q, err := syntax.Quote(f, syntax.LangBash)
		if err != nil || q == "''" && f != "" {
			q = f
		}
		if q == "''" && f == "" {
			q = "''"
		}
		out[i] = q
	}
	return strings.Join(out, " ")
}

func (sh *shell) assignErr(err error) {
	var ro errReadOnly
	if errors.As(err, &ro) {
		sh.errf("%v", err)
		sh.exit = 1
		return
	}
	sh.expandErr(err)
}

// assignFatal reports an assignment error of a plain assignment, which
// ends a non-interactive shell when the variable is read-only.
func (sh *shell) assignFatal(err error) {
	sh.assignErr(err)
	var ro errReadOnly
	if errors.As(err, &ro) {
		sh.exiting = true
	}
}

func (sh *shell) setErr(err error) {
	sh.assignErr(err)
}

// setVar sets a string variable where it lives.
func (sh *shell) setVar(name, value string) error {
	vr := sh.vars.get(name)
	if vr.Kind == expand.NameRef {
		if target := vr.Str; validName(target) {
			name = target
		}
	}
	vr = strVar(value)
	if sh.opts.allexport {
		vr.Exported = true
	}
	return sh.vars.set(name, vr, false)
}

// assign runs one assignment (x=v, x+=v, x[i]=v, x=(a b), x+=(c)).
// declType is a declare flag (-a, -A, -n, -i) or "".
func (sh *shell) assign(ctx context.Context, as *syntax.Assign, declType string, local bool) error {
	name := as.Name.Value
	prev := sh.vars.get(name)
	if local {
		prev = expand.Variable{}
		if top := sh.vars.scopes[len(sh.vars.scopes)-1][name]; top != nil {
			prev = top.Variable
		}
	}
	if prev.Kind == expand.NameRef && validName(prev.Str) && as.Index == nil {
		name = prev.Str
		prev = sh.vars.get(name)
	}
	if as.Index != nil {
		return sh.assignElem(ctx, name, prev, as, local)
	}
	if as.Naked {
		return nil
	}
	if as.Array != nil {
		if as.Append && declType == "" && (prev.Kind == expand.Indexed || prev.Kind == expand.Associative) {
			if done, err := sh.appendArray(ctx, name, prev, as, local); done || err != nil {
				return err
			}
		}
		vr := prev
		vr.Set = true
		if err := sh.assignArray(ctx, &vr, as, declType); err != nil {
			return err
		}
		return sh.store(name, vr, local)
	}
	s, release, err := sh.literal(ctx, as.Value)
	if err != nil {
		return err
	}
	defer release()
	if declType == "-i" {
		if s, err = sh.arithString(ctx, s); err != nil {
			return err
		}
	}
	vr := prev
	vr.Set = true
	switch {
	case !as.Append || prev.Kind == expand.Unknown || prev.Kind == expand.String || prev.Kind == expand.NameRef:
		if as.Append {
			s = prev.Str + s
		}
		vr.Kind, vr.Str, vr.List, vr.Map, vr.Indexes = expand.String, s, nil, nil, nil
		if declType == "-n" {
			vr.Kind = expand.NameRef
		}
		return sh.store(name, vr, local)
	case prev.Kind == expand.Indexed:
		// x+=s on an array appends to element 0.
		return sh.setElem(name, prev, 0, s, true, local)
	default: // associative: to key "0"
		return sh.setKey(name, prev, "0", s, true, local)
	}
}

// store sets a variable, exported under set -a.
func (sh *shell) store(name string, vr expand.Variable, local bool) error {
	if sh.opts.allexport {
		vr.Exported = true
	}
	return sh.vars.set(name, vr, local)
}

// appendArray runs a+=(x y) on an existing array in place.
func (sh *shell) appendArray(ctx context.Context, name string, prev expand.Variable, as *syntax.Assign, local bool) (bool, error) {
	if prev.Kind == expand.Associative {
		type kv struct{ k, v string }
		var add []kv
		for _, e := range as.Array.Elems {
			if e.Index == nil {
				continue
			}
			k, err := sh.indexKey(ctx, e.Index)
			if err != nil {
				return true, err
			}
			v, release, err := sh.literal(ctx, e.Value)
			if err != nil {
				return true, err
			}
			release()
			add = append(add, kv{k, v})
		}
		return sh.vars.edit(name, local, func(vr *expand.Variable) (int64, error) {
			var delta int64
			if vr.Map == nil {
				vr.Map = map[string]string{}
			}
			for _, p := range add {
				old, had := vr.Map[p.k]
				if had {
					delta -= int64(len(p.k)+len(old)) + 32
				}
				vr.Map[p.k] = p.v
				delta += int64(len(p.k)+len(p.v)) + 32
			}
			return delta, nil
		})
	}
	for _, e := range as.Array.Elems {
		if e.Index != nil {
			return false, nil // explicit indexes: the general path
		}
	}
	var vals []string
	for _, e := range as.Array.Elems {
		if e.Value == nil {
			continue
		}
		fs, release, err := sh.fields(ctx, e.Value)
		if err != nil {
			return true, err
		}
		release()
		vals = append(vals, fs...)
	}
	return sh.vars.edit(name, local, func(vr *expand.Variable) (int64, error) {
		var delta int64
		next := len(vr.List)
		if vr.Indexes != nil && len(vr.Indexes) > 0 {
			next = vr.Indexes[len(vr.Indexes)-1] + 1
		}
		for _, v := range vals {
			vr.List = append(vr.List, v)
			if vr.Indexes != nil {
				vr.Indexes = append(vr.Indexes, next)
				delta += 8
			}
			next++
			delta += int64(len(v)) + 16
		}
		return delta, nil
	})
}

// setElem sets (or appends to) element i of an indexed array, in place
// when it can.
func (sh *shell) setElem(name string, prev expand.Variable, i int, val string, appendTo bool, local bool) error {
	if prev.Kind == expand.Indexed {
		ok, err := sh.vars.edit(name, local, func(vr *expand.Variable) (int64, error) {
			cur, had := indexedGet(vr.List, vr.Indexes, i)
			if appendTo {
				val = cur + val
			}
			if vr.Indexes == nil && i < len(vr.List) {
				vr.List[i] = val
				return int64(len(val) - len(cur)), nil
			}
			if vr.Indexes == nil && i == len(vr.List) {
				vr.List = append(vr.List, val)
				return int64(len(val)) + 16, nil
			}
			vr.List, vr.Indexes = setIndexed(vr.List, vr.Indexes, i, val)
			if had {
				return int64(len(val) - len(cur)), nil
			}
			return int64(len(val)) + 24, nil
		})
		if ok || err != nil {
			return err
		}
	}
	vr := prev
	var list []string
	switch prev.Kind {
	case expand.Indexed:
		list = slices.Clone(prev.List)
	case expand.String:
		if prev.IsSet() {
			list = []string{prev.Str}
		}
	}
	indexes := slices.Clone(prev.Indexes)
	if prev.Kind != expand.Indexed {
		indexes = nil
	}
	if appendTo {
		cur, _ := indexedGet(list, indexes, i)
		val = cur + val
	}
	vr.List, vr.Indexes = setIndexed(list, indexes, i, val)
	vr.Kind, vr.Str, vr.Map, vr.Set = expand.Indexed, "", nil, true
	return sh.store(name, vr, local)
}

// setKey sets (or appends to) key k of an associative array.
func (sh *shell) setKey(name string, prev expand.Variable, k, val string, appendTo bool, local bool) error {
	ok, err := sh.vars.edit(name, local, func(vr *expand.Variable) (int64, error) {
		if vr.Map == nil {
			vr.Map = map[string]string{}
		}
		old, had := vr.Map[k]
		if appendTo {
			val = old + val
		}
		vr.Map[k] = val
		if had {
			return int64(len(val) - len(old)), nil
		}
		return int64(len(k)+len(val)) + 32, nil
	})
	if ok || err != nil {
		return err
	}
	vr := prev
	vr.Map = map[string]string{k: val}
	vr.Kind, vr.Set = expand.Associative, true
	return sh.store(name, vr, local)
}

func (sh *shell) assignArray(ctx context.Context, vr *expand.Variable, as *syntax.Assign, declType string) error {
	elems := as.Array.Elems
	assoc := declType == "-A" || vr.Kind == expand.Associative && declType != "-a"
	if assoc {
		m := map[string]string{}
		if as.Append && vr.Map != nil {
			m = maps.Clone(vr.Map)
		}
		for _, e := range elems {
			if e.Index == nil {
				continue
			}
			k, err := sh.indexKey(ctx, e.Index)
			if err != nil {
				return err
			}
			v, release, err := sh.literal(ctx, e.Value)
			if err != nil {
				return err
			}
			release()
			m[k] = v
		}
		vr.Kind, vr.Map, vr.List, vr.Indexes, vr.Str = expand.Associative, m, nil, nil, ""
		return nil
	}
	var list []string
	var indexes []int
	if as.Append {
		switch vr.Kind {
		case expand.String:
			list = []string{vr.Str}
		case expand.Indexed:
			list, indexes = slices.Clone(vr.List), slices.Clone(vr.Indexes)
		}
	}
	next := len(list)
	if indexes != nil && len(indexes) > 0 {
		next = indexes[len(indexes)-1] + 1
	}
	for _, e := range elems {
		if e.Index != nil {
			i, err := sh.arith(ctx, e.Index)
			if err != nil {
				return err
			}
			next = i
		}
		if e.Value == nil {
			continue
		}
		if e.Index != nil {
			v, release, err := sh.literal(ctx, e.Value)
			if err != nil {
				return err
			}
			release()
			list, indexes = setIndexed(list, indexes, next, v)
			next++
			continue
		}
		fs, release, err := sh.fields(ctx, e.Value)
		if err != nil {
			return err
		}
		release()
		for _, f := range fs {
			list, indexes = setIndexed(list, indexes, next, f)
			next++
		}
	}
	vr.Kind, vr.List, vr.Indexes, vr.Map, vr.Str = expand.Indexed, list, indexes, nil, ""
	return nil
}

func (sh *shell) indexKey(ctx context.Context, idx syntax.ArithmExpr) (string, error) {
	if w, ok := idx.(*syntax.Word); ok {
		s, release, err := sh.literal(ctx, w)
		if err != nil {
			return "", err
		}
		release()
		return s, nil
	}
	n, err := sh.arith(ctx, idx)
	return strconv.Itoa(n), err
}

// assignElem runs a[i]=v, a[i]+=v and m[k]=v.
func (sh *shell) assignElem(ctx context.Context, name string, prev expand.Variable, as *syntax.Assign, local bool) error {
	val, release, err := sh.literal(ctx, as.Value)
	if err != nil {
		return err
	}
	defer release()
	if prev.Kind == expand.Associative {
		k, err := sh.indexKey(ctx, as.Index)
		if err != nil {
			return err
		}
		return sh.setKey(name, prev, k, val, as.Append, local)
	}
	i, err := sh.arith(ctx, as.Index)
	if err != nil {
		return err
	}
	if i < 0 {
		n := len(prev.List)
		if prev.Indexes != nil && n > 0 {
			n = prev.Indexes[n-1] + 1
		}
		i += n
		if i < 0 {
			return fmt.Errorf("%s[%d]: bad array subscript", name, i-n)
		}
	}
	if i > 1<<24 {
		return fmt.Errorf("%s[%d]: array index too large", name, i)
	}
	return sh.setElem(name, prev, i, val, as.Append, local)
}

// setIndexed sets element i of a (possibly sparse) indexed array, editing
// list and indexes (which the caller owns).
func setIndexed(list []string, indexes []int, i int, v string) ([]string, []int) {
	if indexes == nil {
		switch {
		case i < len(list):
			list[i] = v
			return list, nil
		case i == len(list):
			return append(list, v), nil
		}
		indexes = make([]int, len(list))
		for k := range indexes {
			indexes[k] = k
		}
	}
	pos := sort.SearchInts(indexes, i)
	if pos < len(indexes) && indexes[pos] == i {
		list[pos] = v
		return list, indexes
	}
	list = slices.Insert(list, pos, v)
	indexes = slices.Insert(indexes, pos, i)
	if indexes[len(indexes)-1] == len(indexes)-1 {
		return list, nil // dense again
	}
	return list, indexes
}

func indexedGet(list []string, indexes []int, i int) (string, bool) {
	if indexes == nil {
		if i >= 0 && i < len(list) {
			return list[i], true
		}
		return "", false
	}
	pos := sort.SearchInts(indexes, i)
	if pos < len(indexes) && indexes[pos] == i {
		return list[pos], true
	}
	return "", false
}

// exec runs a command by name: a function, a shell builtin, or a command
// (a Go builtin, a program, a script of the episode).
func (sh *shell) exec(ctx context.Context, args []string, c *syntax.CallExpr) {
	name := args[0]
	if body, ok := sh.funcs[name]; ok {
		sh.callFunc(ctx, name, body, args[1:])
		return
	}
	if b := shellBuiltinNamed(name); b != nil {
		sh.exit = b(ctx, sh, args)
		return
	}
	sh.external(ctx, args)
}

// callFunc runs a shell function with args as its positional parameters.
func (sh *shell) callFunc(ctx context.Context, name string, body *syntax.Stmt, args []string) {
	if sh.depth+1 > sh.s.cfg.Limits.Depth {
		sh.fail(sh.s.mem.fail("%v", errNesting))
		return
	}
	var argBytes int64
	for _, a := range args {
		argBytes += int64(len(a)) + 16
	}
	if err := sh.s.mem.charge(argBytes, "a function's arguments"); err != nil {
		sh.fail(err)
		return
	}
	defer sh.s.mem.release(argBytes)
	savedParams := sh.params
	sh.params = args
	sh.vars.push()
	sh.funcNames = append(sh.funcNames, name)
	sh.depth++
	sh.funcDepth++
	sh.stmt(ctx, body)
	sh.funcDepth--
	sh.depth--
	sh.funcNames = sh.funcNames[:len(sh.funcNames)-1]
	sh.vars.pop()
	sh.params = savedParams
	if sh.returning {
		sh.returning = false
	}
}

// external runs a command that is not part of the shell language: one of
// the Go builtins (cat, grep, ...), a WASI program, or a script of the
// episode, with the shell's exported variables as its environment.
func (sh *shell) external(ctx context.Context, args []string) {
	c := sh.newCmd(ctx, args)
	sh.exit = c.dispatch()
	if ctx.Err() != nil && sh.exit == 0 {
		sh.exit = exitKilled
	}
}

// newCmd is one command's invocation from this shell.
func (sh *shell) newCmd(ctx context.Context, args []string) *cmd {
	return &cmd{
		ctx: ctx, sh: sh, s: sh.s, args: args, dir: sh.dir,
		env:   expand.ListEnviron(sh.vars.exported()...),
		stdin: sh.stdin(), stdout: sh.stdout(), stderr: sh.stderr(),
	}
}

// runArgv runs argv as a command of its own (xargs, env, timeout, find
// -exec): shell builtins through a fresh shell with env as its only
// variables, anything else as a command. No functions: those live in the
// shell that started the parent command, not in a new process.
func (s *session) runArgv(ctx context.Context, parent *cmd, argv []string, env []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if b := shellBuiltinNamed(argv[0]); b != nil {
		m := map[string]string{}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		sh, err := newShell(s, m, parent.dir)
		if err != nil {
			return exitKilled
		}
		defer sh.vars.drop()
		if parent.sh != nil {
			sh.depth = parent.sh.depth + 1
			if sh.depth > s.cfg.Limits.Depth {
				s.mem.fail("%v", errNesting)
				return exitKilled
			}
		}
		sh.fds.set(0, &fdEnt{r: newSharedReader(stdin)})
		sh.fds.set(1, &fdEnt{w: stdout})
		sh.fds.set(2, &fdEnt{w: stderr})
		return b(ctx, sh, argv)
	}
	c := &cmd{ctx: ctx, sh: parent.sh, s: s, args: argv, dir: parent.dir, env: expand.ListEnviron(env...),
		stdin: stdin, stdout: stdout, stderr: stderr}
	return c.dispatch()
}

// arithString evaluates s as an arithmetic expression (let, declare -i,
// [[ -eq ]]).
func (sh *shell) arithString(ctx context.Context, s string) (string, error) {
	if err := sh.s.mem.fits(int64(len(s))*8, "parsing an arithmetic expression"); err != nil {
		return "", err
	}
	if d := nesting(s); d > maxParseNesting {
		return "", fmt.Errorf("arithmetic expression nested %d deep (limit %d)", d, maxParseNesting)
	}
	x, err := syntax.NewParser().Arithmetic(strings.NewReader(s))
	if err != nil {
		return "", err
	}
	n, err := sh.arith(ctx, x)
	if err != nil {
		return "", err
	}
	return strconv.Itoa(n), nil
}
