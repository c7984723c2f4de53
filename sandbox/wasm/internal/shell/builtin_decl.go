package shell

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

// declClause runs declare, local, export, readonly, typeset and nameref as
// the parser gives them (assignments already split from flags).
func (sh *shell) declClause(ctx context.Context, c *syntax.DeclClause) {
	variant := c.Variant.Value
	var args []declArg
	for _, as := range c.Args {
		if as.Naked && as.Name == nil {
			// A flag, or a dynamic word: expand it and parse the result.
			fs, release, err := sh.fields(ctx, as.Value)
			if err != nil {
				sh.expandErr(err)
				return
			}
			for _, f := range fs {
				args = append(args, declArg{word: f})
			}
			release()
			continue
		}
		args = append(args, declArg{as: as})
	}
	sh.exit = sh.declare(ctx, variant, args)
}

// declArg is one operand of declare & co: an assignment from the parser or
// a word (a flag, or "name=value" built at run time).
type declArg struct {
	as   *syntax.Assign
	word string
}

func declBuiltin(ctx context.Context, sh *shell, args []string) int {
	var das []declArg
	for _, a := range args[1:] {
		das = append(das, declArg{word: a})
	}
	return sh.declare(ctx, args[0], das)
}

func (sh *shell) declare(ctx context.Context, variant string, args []declArg) int {
	local := variant == "local" || (variant == "declare" || variant == "typeset") && sh.funcDepth > 0
	if variant == "local" && sh.funcDepth == 0 {
		sh.errf("local: can only be used in a function")
		return 1
	}
	var exported, readonly, print, global, unexport, funcs bool
	kind := ""
	switch variant {
	case "export":
		exported = true
	case "readonly":
		readonly = true
	case "nameref":
		kind = "-n"
	}
	var names []declArg
	flagsDone := false
	for _, a := range args {
		if a.as == nil && !flagsDone && (strings.HasPrefix(a.word, "-") || strings.HasPrefix(a.word, "+")) && len(a.word) > 1 {
			if a.word == "--" {
				flagsDone = true
				continue
			}
			on := a.word[0] == '-'
			for _, f := range a.word[1:] {
				switch f {
				case 'x':
					exported, unexport = on, !on
				case 'r':
					readonly = on
				case 'p':
					print = true
				case 'g':
					global = true
				case 'a':
					kind = "-a"
				case 'A':
					kind = "-A"
				case 'n':
					if variant == "export" {
						unexport = true
						exported = false
					} else {
						kind = "-n"
					}
				case 'i':
					kind = "-i"
				case 'f', 'F':
					funcs = true
				case 'l', 'u', 't':
				default:
					sh.errf("%s: -%c: invalid option", variant, f)
					return exitUsage
				}
			}
			continue
		}
		flagsDone = true
		names = append(names, a)
	}
	if global {
		local = false
	}
	if funcs {
		for _, n := range sortedKeys(sh.funcs) {
			fmt.Fprintf(sh.stdout(), "declare -f %s\n", n)
		}
		return 0
	}
	if len(names) == 0 {
		if print || variant != "local" {
			sh.printVars(exported && variant == "export", readonly && variant == "readonly")
		}
		return 0
	}
	code := 0
	for _, a := range names {
		as := a.as
		if as == nil {
			name, value, hasValue := strings.Cut(a.word, "=")
			appendOp := strings.HasSuffix(name, "+")
			name = strings.TrimSuffix(name, "+")
			if !validName(name) {
				sh.errf("%s: `%s': not a valid identifier", variant, a.word)
				code = 1
				continue
			}
			as = &syntax.Assign{Name: &syntax.Lit{Value: name}, Append: appendOp}
			if hasValue {
				as.Value = &syntax.Word{Parts: []syntax.WordPart{&syntax.SglQuoted{Value: value}}}
			} else {
				as.Naked = true
			}
		}
		if print {
			sh.printVar(as.Name.Value)
			continue
		}
		name := as.Name.Value
		if !as.Naked || as.Array != nil {
			if err := sh.assign(ctx, as, kind, local); err != nil {
				sh.assignErr(err)
				code = 1
				continue
			}
		} else {
			// Declare without a value: set attributes only.
			var vr expand.Variable
			if local {
				top := sh.vars.scopes[len(sh.vars.scopes)-1][name]
				if top != nil {
					vr = top.Variable
				}
				vr.Local = true
			} else {
				vr = sh.vars.get(name)
			}
			if !vr.IsSet() && !vr.Declared() {
				switch kind {
				case "-a":
					vr.Kind = expand.Indexed
				case "-A":
					vr.Kind = expand.Associative
					vr.Map = map[string]string{}
				}
			}
			if err := sh.vars.set(name, withKeep(vr), local); err != nil {
				sh.assignErr(err)
				code = 1
				continue
			}
		}
		if top, _ := sh.vars.lookup(name); top != nil {
			if exported {
				top.Exported = true
			}
			if unexport {
				top.Exported = false
			}
			if readonly {
				top.ReadOnly = true
			}
			if kind == "-n" && top.Kind == expand.String {
				top.Kind = expand.NameRef
			}
		}
	}
	return code
}

// withKeep sets a variable's attributes without touching its value.
func withKeep(vr expand.Variable) expand.Variable {
	switch {
	case vr.Kind == expand.Indexed && vr.List == nil && !vr.IsSet(),
		vr.Kind == expand.Associative && !vr.IsSet():
		return vr
	}
	if vr.IsSet() {
		return vr
	}
	vr.Kind = expand.KeepValue
	return vr
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// printVars prints variables as declare -p would.
func (sh *shell) printVars(onlyExported, onlyReadonly bool) {
	for _, n := range sh.vars.names() {
		vr := sh.vars.get(n)
		if onlyExported && !vr.Exported || onlyReadonly && !vr.ReadOnly {
			continue
		}
		sh.printVar(n)
	}
}

func (sh *shell) printVar(name string) {
	vr := environ{sh}.Get(name)
	if !vr.IsSet() && !vr.Declared() {
		sh.errf("declare: %s: not found", name)
		return
	}
	flags := "-"
	switch vr.Kind {
	case expand.Indexed:
		flags += "a"
	case expand.Associative:
		flags += "A"
	case expand.NameRef:
		flags += "n"
	}
	if vr.ReadOnly {
		flags += "r"
	}
	if vr.Exported {
		flags += "x"
	}
	if flags == "-" {
		flags = "--"
	}
	w := sh.stdout()
	switch vr.Kind {
	case expand.Indexed:
		var parts []string
		for i, v := range vr.List {
			idx := i
			if vr.Indexes != nil {
				idx = vr.Indexes[i]
			}
			parts = append(parts, fmt.Sprintf("[%d]=%s", idx, dquote(v)))
		}
		fmt.Fprintf(w, "declare %s %s=(%s)\n", flags, name, strings.Join(parts, " "))
	case expand.Associative:
		var parts []string
		for _, k := range sortedKeys(vr.Map) {
			parts = append(parts, fmt.Sprintf("[%s]=%s", k, dquote(vr.Map[k])))
		}
		fmt.Fprintf(w, "declare %s %s=(%s )\n", flags, name, strings.Join(parts, " "))
	default:
		if !vr.IsSet() {
			fmt.Fprintf(w, "declare %s %s\n", flags, name)
			return
		}
		fmt.Fprintf(w, "declare %s %s=%s\n", flags, name, dquote(vr.Str))
	}
}

// dquote double-quotes s as bash's declare -p does.
func dquote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\', '$', '`':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}
