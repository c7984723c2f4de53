package shell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"mvdan.cc/sh/v3/expand"
)

// shellBuiltin is a command of the shell itself: it runs in the shell that
// calls it and may change it.
type shellBuiltin func(ctx context.Context, sh *shell, args []string) int

// shellBuiltinNamed returns the shell builtin called name (nil if none). A
// switch rather than a map filled at init: some builtins (command,
// builtin) refer back to it.
func shellBuiltinNamed(name string) shellBuiltin {
	switch name {
	case ":", "true", "disown", "enable", "complete":
		return bTrue
	case "false", "compgen":
		return bFalse
	case "echo":
		return bEcho
	case "printf":
		return bPrintf
	case "test", "[":
		return bTest
	case "cd":
		return bCd
	case "pwd":
		return bPwd
	case "pushd":
		return bPushd
	case "popd":
		return bPopd
	case "dirs":
		return bDirs
	case "export", "readonly", "local", "declare", "typeset":
		return declBuiltin
	case "unset":
		return bUnset
	case "set":
		return bSet
	case "shift":
		return bShift
	case "shopt":
		return bShopt
	case "exit", "logout":
		return bExit
	case "return":
		return bReturn
	case "break":
		return bBreak
	case "continue":
		return bContinue
	case "eval":
		return bEval
	case "source", ".":
		return bSource
	case "exec":
		return bExec
	case "read":
		return bRead
	case "mapfile", "readarray":
		return bMapfile
	case "trap":
		return bTrap
	case "wait":
		return bWait
	case "kill":
		return bKill
	case "jobs":
		return bJobs
	case "type":
		return bType
	case "command":
		return bCommand
	case "builtin":
		return bBuiltin
	case "hash":
		return bHash
	case "let":
		return bLet
	case "getopts":
		return bGetopts
	case "alias":
		return bAlias
	case "unalias":
		return bUnalias
	case "umask":
		return bUmask
	case "ulimit":
		return bUlimit
	case "times":
		return bTimes
	case "caller":
		return bCaller
	case "help":
		return bHelp
	case "fg", "bg", "suspend":
		return bNoJobControl
	}
	return nil
}

// shellBuiltinNames lists the shell builtins.
var shellBuiltinNames = []string{".", ":", "[", "alias", "bg", "break", "builtin", "caller", "cd", "command", "compgen", "complete", "continue", "declare", "dirs", "disown", "echo", "enable", "eval", "exec", "exit", "export", "false", "fg", "getopts", "hash", "help", "jobs", "kill", "let", "local", "logout", "mapfile", "popd", "printf", "pushd", "pwd", "read", "readarray", "readonly", "return", "set", "shift", "shopt", "source", "suspend", "test", "times", "trap", "true", "type", "typeset", "ulimit", "umask", "unalias", "unset", "wait"}

// keywords are reserved words, for type and command -V.
var keywords = []string{"if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while",
	"until", "do", "done", "in", "function", "time", "{", "}", "!", "[[", "]]", "coproc"}

func (sh *shell) builtinErr(name, format string, args ...any) int {
	fmt.Fprintf(sh.stderr(), "sh: %s: "+format+"\n", append([]any{name}, args...)...)
	return 1
}

func bTrue(context.Context, *shell, []string) int  { return 0 }
func bFalse(context.Context, *shell, []string) int { return 1 }

func bNoJobControl(_ context.Context, sh *shell, args []string) int {
	return sh.builtinErr(args[0], "no job control")
}

func bEcho(_ context.Context, sh *shell, args []string) int {
	args = args[1:]
	newline, escapes := true, false
	for len(args) > 0 && len(args[0]) > 1 && args[0][0] == '-' && strings.Trim(args[0][1:], "neE") == "" {
		for _, f := range args[0][1:] {
			switch f {
			case 'n':
				newline = false
			case 'e':
				escapes = true
			case 'E':
				escapes = false
			}
		}
		args = args[1:]
	}
	var b strings.Builder
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		if escapes {
			s, stop := echoEscapes(a)
			b.WriteString(s)
			if stop {
				newline = false
				break
			}
			continue
		}
		b.WriteString(a)
	}
	if newline {
		b.WriteByte('\n')
	}
	if _, err := io.WriteString(sh.stdout(), b.String()); err != nil {
		return writeErrStatus(sh, "echo", err)
	}
	return 0
}

// writeErrStatus turns a failed write into a status: a closed pipe ends the
// command quietly, like SIGPIPE.
func writeErrStatus(sh *shell, name string, err error) int {
	if isEPIPE(err) {
		return 141
	}
	if errors.Is(err, ErrOOM) {
		return exitKilled
	}
	sh.builtinErr(name, "write error: %s", errText(err))
	return 1
}

// echoEscapes interprets echo -e's escapes; stop reports \c.
func echoEscapes(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'c':
			return b.String(), true
		case 'e', 'E':
			b.WriteByte(0x1b)
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case '\\':
			b.WriteByte('\\')
		case '0':
			n, j := 0, i+1
			for ; j < len(s) && j < i+4 && s[j] >= '0' && s[j] <= '7'; j++ {
				n = n*8 + int(s[j]-'0')
			}
			b.WriteByte(byte(n))
			i = j - 1
		case 'x':
			n, j := 0, i+1
			for ; j < len(s) && j < i+3 && isHex(s[j]); j++ {
				n = n*16 + hexVal(s[j])
			}
			if j == i+1 {
				b.WriteString("\\x")
				continue
			}
			b.WriteByte(byte(n))
			i = j - 1
		case 'u', 'U':
			max := 4
			if s[i] == 'U' {
				max = 8
			}
			n, j := 0, i+1
			for ; j < len(s) && j < i+1+max && isHex(s[j]); j++ {
				n = n*16 + hexVal(s[j])
			}
			if j == i+1 {
				b.WriteByte('\\')
				b.WriteByte(s[i])
				continue
			}
			b.WriteRune(rune(n))
			i = j - 1
		default:
			b.WriteByte('\\')
			b.WriteByte(s[i])
		}
	}
	return b.String(), false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return int(c-'A') + 10
}

func bPrintf(ctx context.Context, sh *shell, args []string) int {
	args = args[1:]
	varName := ""
	if len(args) >= 2 && args[0] == "-v" {
		varName, args = args[1], args[2:]
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		return sh.builtinErr("printf", "usage: printf [-v var] format [arguments]")
	}
	format, rest := args[0], args[1:]
	if err := sh.s.mem.fits(printfBound(format, rest), "printf's output"); err != nil {
		sh.fail(err)
		return exitKilled
	}
	out, errs := printfFormat(format, rest)
	if err := ctx.Err(); err != nil {
		return exitKilled
	}
	code := 0
	for _, e := range errs {
		sh.builtinErr("printf", "%s", e)
		code = 1
	}
	var b strings.Builder
	b.WriteString(out)
	if varName != "" {
		if err := sh.setVar(varName, b.String()); err != nil {
			sh.assignErr(err)
			return 1
		}
		return code
	}
	if _, err := io.WriteString(sh.stdout(), b.String()); err != nil {
		return writeErrStatus(sh, "printf", err)
	}
	return code
}

// printfBound bounds the bytes printf writes: its format repeated for the
// arguments, plus field widths and precisions (which printf pads to).
func printfBound(format string, args []string) int64 {
	var perPass int64
	stars, verbs := 0, 0
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		i++
		num := int64(0)
		for ; i < len(format) && strings.IndexByte("-+ #0123456789.*", format[i]) >= 0; i++ {
			switch c := format[i]; {
			case c == '*':
				stars++
			case c >= '0' && c <= '9':
				num = min(num*10+int64(c-'0'), math.MaxInt32)
			case c == '.':
				perPass += num
				num = 0
			}
		}
		perPass += num
		verbs++
	}
	var argBytes int64
	for _, a := range args {
		argBytes += int64(len(a))
		if n, err := strconv.ParseInt(strings.TrimSpace(a), 10, 64); err == nil && n > 0 && stars > 0 {
			perPass = satAdd(perPass, n)
		}
	}
	passes := int64(1)
	if verbs > 0 {
		passes += int64(len(args) / verbs)
	}
	return satAdd(satMul(satAdd(perPass, int64(len(format))*4), passes), argBytes*4)
}

func bCd(_ context.Context, sh *shell, args []string) int {
	physical := false
	args = args[1:]
	for len(args) > 0 && len(args[0]) > 1 && args[0][0] == '-' {
		if args[0] == "--" {
			args = args[1:]
			break
		}
		switch args[0] {
		case "-P":
			physical = true
		case "-L":
			physical = false
		default:
			if args[0] == "-" {
				goto operands
			}
			return sh.builtinErr("cd", "%s: invalid option", args[0])
		}
		args = args[1:]
	}
operands:
	var target string
	switch {
	case len(args) == 0:
		target = sh.vars.get("HOME").Str
		if target == "" {
			return sh.builtinErr("cd", "HOME not set")
		}
	case len(args) > 1:
		return sh.builtinErr("cd", "too many arguments")
	case args[0] == "-":
		target = sh.vars.get("OLDPWD").Str
		if target == "" {
			return sh.builtinErr("cd", "OLDPWD not set")
		}
		fmt.Fprintln(sh.stdout(), target)
	default:
		target = args[0]
	}
	return sh.chdir(target, physical)
}

func (sh *shell) chdir(target string, physical bool) int {
	p := abs(sh.dir, target)
	if physical {
		r, err := realpath(sh.s.cfg.FS, p)
		if err != nil {
			return sh.builtinErr("cd", "%s: %s", target, errText(err))
		}
		p = r
	}
	fi, err := sh.s.cfg.FS.Stat(p)
	if err != nil {
		return sh.builtinErr("cd", "%s: %s", target, pathErrText(err))
	}
	if !fi.IsDir() {
		return sh.builtinErr("cd", "%s: Not a directory", target)
	}
	old := sh.dir
	sh.dir = p
	sh.setVar("OLDPWD", old)
	pwd := sh.vars.get("PWD")
	pwd.Kind, pwd.Str, pwd.Set = expand.String, p, true
	sh.vars.set("PWD", pwd, false)
	return 0
}

func bPwd(_ context.Context, sh *shell, args []string) int {
	physical := slices.Contains(args[1:], "-P")
	d := sh.dir
	if physical {
		r, err := realpath(sh.s.cfg.FS, d)
		if err != nil {
			return sh.builtinErr("pwd", "%s", errText(err))
		}
		d = r
	}
	fmt.Fprintln(sh.stdout(), d)
	return 0
}

func bPushd(_ context.Context, sh *shell, args []string) int {
	if len(args) < 2 {
		if len(sh.dirStack) == 0 {
			return sh.builtinErr("pushd", "no other directory")
		}
		top := sh.dirStack[0]
		sh.dirStack[0] = sh.dir
		if code := sh.chdir(top, false); code != 0 {
			return code
		}
		return bDirs(nil, sh, nil)
	}
	old := sh.dir
	if code := sh.chdir(args[1], false); code != 0 {
		return code
	}
	sh.dirStack = append([]string{old}, sh.dirStack...)
	return bDirs(nil, sh, nil)
}

func bPopd(_ context.Context, sh *shell, _ []string) int {
	if len(sh.dirStack) == 0 {
		return sh.builtinErr("popd", "directory stack empty")
	}
	top := sh.dirStack[0]
	sh.dirStack = sh.dirStack[1:]
	if code := sh.chdir(top, false); code != 0 {
		return code
	}
	return bDirs(nil, sh, nil)
}

func bDirs(_ context.Context, sh *shell, _ []string) int {
	fmt.Fprintln(sh.stdout(), strings.Join(append([]string{sh.dir}, sh.dirStack...), " "))
	return 0
}

func bUnset(_ context.Context, sh *shell, args []string) int {
	funcs := false
	code := 0
	for _, a := range args[1:] {
		switch a {
		case "-f":
			funcs = true
			continue
		case "-v":
			funcs = false
			continue
		case "-n", "--":
			continue
		}
		if funcs {
			delete(sh.funcs, a)
			continue
		}
		name, idx, hasIdx := strings.Cut(a, "[")
		if !validName(name) {
			sh.builtinErr("unset", "`%s': not a valid identifier", a)
			code = 1
			continue
		}
		if hasIdx {
			idx = strings.TrimSuffix(idx, "]")
			vr := cloneVar(sh.vars.get(name))
			switch vr.Kind {
			case expand.Associative:
				delete(vr.Map, idx)
			case expand.Indexed:
				i, err := strconv.Atoi(idx)
				if err == nil {
					vr.List, vr.Indexes = unsetIndexed(vr.List, vr.Indexes, i)
				}
			}
			if err := sh.vars.set(name, vr, false); err != nil {
				sh.assignErr(err)
				code = 1
			}
			continue
		}
		if err := sh.vars.unset(name); err != nil {
			sh.builtinErr("unset", "%s: cannot unset: readonly variable", name)
			code = 1
			continue
		}
		if _, ok := sh.funcs[name]; ok && !sh.vars.get(name).IsSet() {
			// unset NAME also removes a function when no variable had it.
		}
	}
	return code
}

func unsetIndexed(list []string, indexes []int, i int) ([]string, []int) {
	if indexes == nil {
		if i < 0 || i >= len(list) {
			return list, nil
		}
		indexes = make([]int, len(list))
		for k := range indexes {
			indexes[k] = k
		}
	}
	for k, idx := range indexes {
		if idx == i {
			return slices.Delete(slices.Clone(list), k, k+1), slices.Delete(slices.Clone(indexes), k, k+1)
		}
	}
	return list, indexes
}

var setOptions = []struct {
	name  string
	short byte
	get   func(o *options) *bool
}{
	{"allexport", 'a', func(o *options) *bool { return &o.allexport }},
	{"errexit", 'e', func(o *options) *bool { return &o.errexit }},
	{"noglob", 'f', func(o *options) *bool { return &o.noglob }},
	{"noexec", 'n', func(o *options) *bool { return &o.noexec }},
	{"nounset", 'u', func(o *options) *bool { return &o.nounset }},
	{"xtrace", 'x', func(o *options) *bool { return &o.xtrace }},
	{"noclobber", 'C', func(o *options) *bool { return &o.noclobber }},
	{"pipefail", 0, func(o *options) *bool { return &o.pipefail }},
}

// ignoredSetOptions are accepted and have no effect here.
var ignoredSetOptions = map[string]bool{"verbose": true, "monitor": true, "hashall": true, "braceexpand": true,
	"posix": true, "errtrace": true, "functrace": true, "notify": true, "ignoreeof": true, "interactive-comments": true,
	"keyword": true, "onecmd": true, "physical": true, "privileged": true, "history": true, "emacs": true, "vi": true}

func bSet(_ context.Context, sh *shell, args []string) int {
	args = args[1:]
	if len(args) == 0 {
		for _, n := range sh.vars.names() {
			vr := sh.vars.get(n)
			if vr.Kind == expand.String && vr.IsSet() {
				fmt.Fprintf(sh.stdout(), "%s=%s\n", n, shellQuote(vr.Str))
			}
		}
		return 0
	}
	for len(args) > 0 {
		a := args[0]
		if a == "--" {
			sh.params = append([]string(nil), args[1:]...)
			return 0
		}
		if a == "-" {
			sh.opts.xtrace = false
			args = args[1:]
			if len(args) > 0 {
				sh.params = append([]string(nil), args...)
			}
			return 0
		}
		if len(a) < 2 || a[0] != '-' && a[0] != '+' {
			sh.params = append([]string(nil), args...)
			return 0
		}
		on := a[0] == '-'
		args = args[1:]
		for _, f := range a[1:] {
			if f == 'o' {
				if len(args) == 0 {
					for _, o := range setOptions {
						state := "off"
						if *o.get(&sh.opts) {
							state = "on"
						}
						fmt.Fprintf(sh.stdout(), "%-15s\t%s\n", o.name, state)
					}
					return 0
				}
				name := args[0]
				args = args[1:]
				found := false
				for _, o := range setOptions {
					if o.name == name {
						*o.get(&sh.opts) = on
						found = true
					}
				}
				if !found && !ignoredSetOptions[name] {
					return sh.builtinErr("set", "%s: invalid option name", name)
				}
				continue
			}
			found := false
			for _, o := range setOptions {
				if o.short == byte(f) {
					*o.get(&sh.opts) = on
					found = true
				}
			}
			if !found && !strings.ContainsRune("vmhBHPTbEki", f) {
				sh.builtinErr("set", "-%c: invalid option", f)
				return exitUsage
			}
		}
	}
	return 0
}

// shellQuote quotes s for re-input, as set and alias print values.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=@%+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

var shoptNames = map[string]func(o *options) *bool{
	"globstar":       func(o *options) *bool { return &o.globstar },
	"dotglob":        func(o *options) *bool { return &o.dotglob },
	"nullglob":       func(o *options) *bool { return &o.nullglob },
	"extglob":        func(o *options) *bool { return &o.extglob },
	"nocaseglob":     func(o *options) *bool { return &o.nocaseglob },
	"failglob":       func(o *options) *bool { return &o.failglob },
	"lastpipe":       func(o *options) *bool { return &o.lastpipe },
	"expand_aliases": func(o *options) *bool { return &o.expandAliases },
}

// ignoredShopt are accepted and have no effect here.
var ignoredShopt = map[string]bool{"inherit_errexit": true, "nocasematch": true, "checkwinsize": true, "histappend": true,
	"sourcepath": true, "promptvars": true, "cmdhist": true, "interactive_comments": true, "progcomp": true,
	"extquote": true, "force_fignore": true, "hostcomplete": true, "complete_fullquote": true, "localvar_inherit": true}

func bShopt(_ context.Context, sh *shell, args []string) int {
	set, unset, quiet, print := false, false, false, false
	var names []string
	for _, a := range args[1:] {
		switch a {
		case "-s":
			set = true
		case "-u":
			unset = true
		case "-q":
			quiet = true
		case "-p":
			print = true
		case "-o":
		default:
			names = append(names, a)
		}
	}
	if len(names) == 0 {
		for _, n := range sortedKeys(shoptNames) {
			on := *shoptNames[n](&sh.opts)
			if set && !on || unset && on {
				continue
			}
			if print {
				flag := "-u"
				if on {
					flag = "-s"
				}
				fmt.Fprintf(sh.stdout(), "shopt %s %s\n", flag, n)
			} else {
				state := "off"
				if on {
					state = "on"
				}
				fmt.Fprintf(sh.stdout(), "%-15s\t%s\n", n, state)
			}
		}
		return 0
	}
	code := 0
	for _, n := range names {
		get, ok := shoptNames[n]
		if !ok {
			if ignoredShopt[n] {
				if !set && !unset {
					code = 1
				}
				continue
			}
			sh.builtinErr("shopt", "%s: invalid shell option name", n)
			code = 1
			continue
		}
		switch {
		case set:
			*get(&sh.opts) = true
		case unset:
			*get(&sh.opts) = false
		default:
			if !*get(&sh.opts) {
				code = 1
			}
			if !quiet {
				state := "off"
				if *get(&sh.opts) {
					state = "on"
				}
				fmt.Fprintf(sh.stdout(), "%-15s\t%s\n", n, state)
			}
		}
	}
	return code
}

func bShift(_ context.Context, sh *shell, args []string) int {
	n := 1
	if len(args) > 1 {
		var err error
		if n, err = strconv.Atoi(args[1]); err != nil || n < 0 {
			return sh.builtinErr("shift", "%s: numeric argument required", args[1])
		}
	}
	if n > len(sh.params) {
		return 1
	}
	sh.params = sh.params[n:]
	return 0
}

func statusArg(sh *shell, name string, args []string) (int, bool) {
	if len(args) < 2 {
		return sh.exit, true
	}
	n, err := strconv.Atoi(args[1])
	if err != nil {
		sh.builtinErr(name, "%s: numeric argument required", args[1])
		return exitUsage, false
	}
	return n & 0xff, true
}

func bExit(_ context.Context, sh *shell, args []string) int {
	n, _ := statusArg(sh, "exit", args)
	sh.exiting = true
	return n
}

func bReturn(_ context.Context, sh *shell, args []string) int {
	if sh.funcDepth == 0 && sh.sourcing == 0 {
		sh.builtinErr("return", "can only `return' from a function or sourced script")
		return exitUsage
	}
	n, _ := statusArg(sh, "return", args)
	sh.returning = true
	return n
}

func loopCount(sh *shell, name string, args []string) (int, bool) {
	n := 1
	if len(args) > 1 {
		var err error
		if n, err = strconv.Atoi(args[1]); err != nil || n < 1 {
			sh.builtinErr(name, "%s: loop count out of range", args[1])
			return 0, false
		}
	}
	if sh.loops == 0 {
		return 0, false
	}
	return min(n, sh.loops), true
}

func bBreak(_ context.Context, sh *shell, args []string) int {
	if n, ok := loopCount(sh, "break", args); ok {
		sh.breakN = n
	}
	return 0
}

func bContinue(_ context.Context, sh *shell, args []string) int {
	if n, ok := loopCount(sh, "continue", args); ok {
		sh.contN = n
	}
	return 0
}

// runSource parses src and runs it in this shell (eval, source, trap).
func (sh *shell) runSource(ctx context.Context, src, name string) int {
	if sh.depth+1 > sh.s.cfg.Limits.Depth {
		sh.fail(sh.s.mem.fail("%v", errNesting))
		return exitKilled
	}
	n := int64(len(src)) * 8
	if err := sh.s.mem.charge(n, "parsing "+name); err != nil {
		sh.fail(err)
		return exitKilled
	}
	defer sh.s.mem.release(n)
	f, err := sh.parse(src, name)
	if err != nil {
		sh.errf("%v", err)
		return sh.parseStatus(err)
	}
	sh.depth++
	sh.exit = 0
	sh.stmts(ctx, f.Stmts)
	sh.depth--
	return sh.exit
}

func bEval(ctx context.Context, sh *shell, args []string) int {
	return sh.runSource(ctx, strings.Join(args[1:], " "), "eval")
}

func bSource(ctx context.Context, sh *shell, args []string) int {
	if len(args) < 2 {
		return sh.builtinErr(args[0], "filename argument required")
	}
	name := args[1]
	p := abs(sh.dir, name)
	if !strings.Contains(name, "/") {
		for _, d := range strings.Split(sh.vars.get("PATH").Str, ":") {
			if d == "" {
				continue
			}
			if fi, err := sh.s.cfg.FS.Stat(path.Join(d, name)); err == nil && fi.Mode().IsRegular() {
				p = path.Join(d, name)
				break
			}
		}
	}
	data, err := sh.s.cfg.FS.ReadFile(p, sh.s.mem.limit)
	if err != nil {
		return sh.builtinErr(args[0], "%s: %s", name, pathErrText(err))
	}
	if err := sh.s.mem.charge(int64(len(data)), "source "+name); err != nil {
		sh.fail(err)
		return exitKilled
	}
	defer sh.s.mem.release(int64(len(data)))
	saved := sh.params
	if len(args) > 2 {
		sh.params = args[2:]
	}
	sh.sourcing++
	code := sh.runSource(ctx, string(data), name)
	sh.sourcing--
	if len(args) > 2 {
		sh.params = saved
	}
	if sh.returning {
		sh.returning = false
		code = sh.exit
	}
	return code
}

func bExec(ctx context.Context, sh *shell, args []string) int {
	if len(args) < 2 {
		return 0 // redirections only: kept by stmt
	}
	sh.exec(ctx, args[1:], nil)
	sh.exiting = true
	return sh.exit
}

// readLine reads up to delim (not included) from r, charging what it holds;
// eof says the input ended before a delimiter.
func (sh *shell) readLine(ctx context.Context, r io.Reader, delim byte, raw bool, limit int) (line string, eof bool, err error) {
	var b []byte
	var charged int64
	defer func() { sh.s.mem.release(charged) }()
	br, _ := r.(io.ByteReader)
	var one [1]byte
	esc := false
	for limit < 0 || len(b) < limit {
		if err := ctx.Err(); err != nil {
			return string(b), true, context.Cause(ctx)
		}
		var c byte
		if br != nil {
			c, err = br.ReadByte()
		} else {
			var n int
			n, err = r.Read(one[:])
			if n == 1 {
				c, err = one[0], nil
			} else if err == nil {
				continue
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return string(b), true, nil
			}
			return string(b), true, err
		}
		if !raw && esc {
			esc = false
			if c == '\n' {
				continue // line continuation
			}
			b = append(b, c)
		} else if !raw && c == '\\' && delim != 0 {
			esc = true
			continue
		} else if c == delim {
			return string(b), false, nil
		} else {
			b = append(b, c)
		}
		if len(b)%1024 == 0 {
			if err := sh.s.mem.charge(1024*2, "read: a line"); err != nil {
				return "", true, err
			}
			charged += 2048
		}
	}
	return string(b), false, nil
}

func bRead(ctx context.Context, sh *shell, args []string) int {
	raw, silent := false, false
	delim := byte('\n')
	nchars, exact := -1, false
	fd := 0
	arrayName := ""
	var timeout time.Duration
	prompt := ""
	var names []string
	args = args[1:]
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && len(args[0]) > 1 {
		a := args[0]
		args = args[1:]
		if a == "--" {
			break
		}
		for i := 1; i < len(a); i++ {
			f := a[i]
			val := func() (string, bool) {
				if i+1 < len(a) {
					v := a[i+1:]
					i = len(a)
					return v, true
				}
				if len(args) == 0 {
					return "", false
				}
				v := args[0]
				args = args[1:]
				return v, true
			}
			switch f {
			case 'r':
				raw = true
			case 's':
				silent = true
			case 'e', 'E':
			case 'a', 'd', 'n', 'N', 'p', 't', 'u', 'i':
				v, ok := val()
				if !ok {
					return sh.builtinErr("read", "-%c: option requires an argument", f)
				}
				switch f {
				case 'a':
					arrayName = v
				case 'd':
					delim = 0
					if v != "" {
						delim = v[0]
					}
				case 'n', 'N':
					n, err := strconv.Atoi(v)
					if err != nil || n < 0 {
						return sh.builtinErr("read", "%s: invalid number", v)
					}
					nchars, exact = n, f == 'N'
				case 'p':
					prompt = v
				case 't':
					secs, err := strconv.ParseFloat(v, 64)
					if err != nil || secs < 0 {
						return sh.builtinErr("read", "%s: invalid timeout specification", v)
					}
					timeout = time.Duration(secs * float64(time.Second))
				case 'u':
					n, err := strconv.Atoi(v)
					if err != nil {
						return sh.builtinErr("read", "%s: invalid file descriptor specification", v)
					}
					fd = n
				}
			default:
				return sh.builtinErr("read", "-%c: invalid option", f)
			}
		}
	}
	_ = silent
	names = args
	if prompt != "" {
		io.WriteString(sh.stderr(), prompt)
	}
	r := sh.fds.reader(fd)
	rctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	limit := nchars
	d := delim
	if exact {
		d = 0
		raw = true
	}
	line, eof, err := sh.readLine(rctx, r, d, raw, limit)
	if err != nil {
		if errors.Is(err, ErrOOM) {
			sh.fail(err)
			return exitKilled
		}
		if rctx.Err() != nil && ctx.Err() == nil {
			return 142 // read timed out
		}
		if ctx.Err() != nil {
			return exitKilled
		}
		return sh.builtinErr("read", "read error: %s", errText(err))
	}
	cfg := sh.config(ctx, &transient{mem: sh.s.mem})
	if arrayName != "" {
		fields := expand.ReadFields(cfg, line, -1, true)
		vr := expand.Variable{Set: true, Kind: expand.Indexed, List: fields}
		if err := sh.vars.set(arrayName, vr, false); err != nil {
			sh.assignErr(err)
			return 1
		}
	} else {
		if len(names) == 0 {
			names = []string{"REPLY"}
			if err := sh.setVar("REPLY", line); err != nil {
				sh.assignErr(err)
				return 1
			}
		} else {
			fields := expand.ReadFields(cfg, line, len(names), true)
			for i, n := range names {
				v := ""
				if i < len(fields) {
					v = fields[i]
				}
				if err := sh.setVar(n, v); err != nil {
					sh.assignErr(err)
					return 1
				}
			}
		}
	}
	if eof && (line == "" || limit < 0 || len(line) < limit) {
		return 1
	}
	return 0
}

func bMapfile(ctx context.Context, sh *shell, args []string) int {
	strip := false
	delim := byte('\n')
	count, skip, origin := -1, 0, 0
	fd := 0
	keep := false
	args = args[1:]
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && len(args[0]) > 1 {
		a := args[0]
		args = args[1:]
		switch a[1] {
		case 't':
			strip = true
			continue
		}
		v := a[2:]
		if v == "" && len(args) > 0 {
			v, args = args[0], args[1:]
		}
		switch a[1] {
		case 'd':
			delim = 0
			if v != "" {
				delim = v[0]
			}
		case 'n':
			count, _ = strconv.Atoi(v)
			if count == 0 {
				count = -1
			}
		case 's':
			skip, _ = strconv.Atoi(v)
		case 'O':
			origin, _ = strconv.Atoi(v)
			keep = true
		case 'u':
			fd, _ = strconv.Atoi(v)
		case 'C', 'c':
		default:
			return sh.builtinErr(args[0], "%s: invalid option", a)
		}
	}
	name := "MAPFILE"
	if len(args) > 0 {
		name = args[0]
	}
	r := sh.fds.reader(fd)
	var list []string
	var charged int64
	defer func() { sh.s.mem.release(charged) }()
	for count < 0 || len(list) < count {
		line, eof, err := sh.readLine(ctx, r, delim, true, -1)
		if err != nil {
			if errors.Is(err, ErrOOM) {
				sh.fail(err)
				return exitKilled
			}
			return exitKilled
		}
		if eof && line == "" {
			break
		}
		if !eof && !strip && delim != 0 {
			line += string(delim)
		}
		if skip > 0 {
			skip--
		} else {
			if err := sh.s.mem.charge(int64(len(line))+16, "mapfile"); err != nil {
				sh.fail(err)
				return exitKilled
			}
			charged += int64(len(line)) + 16
			list = append(list, line)
		}
		if eof {
			break
		}
	}
	vr := expand.Variable{Set: true, Kind: expand.Indexed}
	if keep {
		old := sh.vars.get(name)
		vr.List, vr.Indexes = old.List, old.Indexes
		for i, l := range list {
			vr.List, vr.Indexes = setIndexed(vr.List, vr.Indexes, origin+i, l)
		}
	} else {
		vr.List = list
	}
	if err := sh.vars.set(name, vr, false); err != nil {
		sh.assignErr(err)
		return 1
	}
	return 0
}

func bTrap(_ context.Context, sh *shell, args []string) int {
	args = args[1:]
	if len(args) == 0 || args[0] == "-p" {
		for _, k := range sortedKeys(sh.traps) {
			fmt.Fprintf(sh.stdout(), "trap -- %s %s\n", shellQuote(sh.traps[k]), k)
		}
		return 0
	}
	if args[0] == "-l" {
		fmt.Fprintln(sh.stdout(), " 1) SIGHUP\t 2) SIGINT\t 3) SIGQUIT\t 9) SIGKILL\t15) SIGTERM")
		return 0
	}
	if args[0] == "--" {
		args = args[1:]
	}
	action := args[0]
	sigs := args[1:]
	if len(sigs) == 0 {
		// trap SIG: reset it.
		sigs, action = args, "-"
	}
	for _, s := range sigs {
		s = strings.TrimPrefix(strings.ToUpper(s), "SIG")
		switch s {
		case "0":
			s = "EXIT"
		}
		if action == "-" {
			delete(sh.traps, s)
			continue
		}
		sh.traps[s] = action
	}
	return 0
}

func bWait(ctx context.Context, sh *shell, args []string) int {
	jobs := sh.bg.list()
	if len(args) < 2 {
		for _, j := range jobs {
			select {
			case <-j.done:
			case <-ctx.Done():
				return exitKilled
			}
		}
		return 0
	}
	code := 0
	for _, a := range args[1:] {
		if a == "-n" {
			for _, j := range jobs {
				select {
				case <-j.done:
					return j.status
				default:
				}
			}
			if len(jobs) == 0 {
				return 127
			}
			cases := make(chan int, len(jobs))
			for _, j := range jobs {
				go func(j *job) {
					select {
					case <-j.done:
						cases <- j.status
					case <-ctx.Done():
					}
				}(j)
			}
			select {
			case c := <-cases:
				return c
			case <-ctx.Done():
				return exitKilled
			}
		}
		j := sh.findJob(a)
		if j == nil {
			sh.builtinErr("wait", "pid %s is not a child of this shell", a)
			code = 127
			continue
		}
		select {
		case <-j.done:
			code = j.status
		case <-ctx.Done():
			return exitKilled
		}
	}
	return code
}

func (sh *shell) findJob(spec string) *job {
	if n, ok := strings.CutPrefix(spec, "%"); ok {
		i, err := strconv.Atoi(n)
		jobs := sh.bg.list()
		if err != nil || i < 1 || i > len(jobs) {
			return nil
		}
		return jobs[i-1]
	}
	pid, err := strconv.Atoi(spec)
	if err != nil {
		return nil
	}
	return sh.bg.find(pid)
}

var signals = map[string]int{"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15}

func bKill(_ context.Context, sh *shell, args []string) int {
	args = args[1:]
	sig := 15
	if len(args) > 0 && args[0] == "-l" {
		fmt.Fprintln(sh.stdout(), "HUP INT QUIT KILL USR1 USR2 PIPE ALRM TERM")
		return 0
	}
	if len(args) > 0 && strings.HasPrefix(args[0], "-") && len(args[0]) > 1 {
		s := strings.TrimPrefix(strings.TrimPrefix(args[0][1:], "s "), "SIG")
		if args[0] == "-s" && len(args) > 1 {
			s = strings.TrimPrefix(args[1], "SIG")
			args = args[1:]
		}
		if n, err := strconv.Atoi(s); err == nil {
			sig = n
		} else if n, ok := signals[strings.ToUpper(s)]; ok {
			sig = n
		} else {
			return sh.builtinErr("kill", "%s: invalid signal specification", s)
		}
		args = args[1:]
	}
	if len(args) == 0 {
		return sh.builtinErr("kill", "usage: kill [-s sigspec | -n signum | -sigspec] pid | jobspec ...")
	}
	code := 0
	for _, a := range args {
		if a == strconv.Itoa(sandboxPID) || a == strconv.Itoa(sh.pid) {
			if sig == 0 {
				continue
			}
			sh.exiting = true
			sh.exit = 128 + sig
			return 128 + sig
		}
		j := sh.findJob(a)
		if j == nil {
			sh.builtinErr("kill", "(%s) - No such process", a)
			code = 1
			continue
		}
		if sig == 0 {
			select {
			case <-j.done:
				code = 1
			default:
			}
			continue
		}
		j.cancel(fmt.Errorf("killed by signal %d", sig))
	}
	return code
}

func bJobs(_ context.Context, sh *shell, _ []string) int {
	for i, j := range sh.bg.list() {
		state := "Running"
		select {
		case <-j.done:
			state = "Done"
		default:
		}
		fmt.Fprintf(sh.stdout(), "[%d]  %s\t%d\n", i+1, state, j.pid)
	}
	return 0
}

// lookup says what name is to this shell: kind is alias, keyword,
// function, builtin or file ("" when not found); where is what command -v
// prints.
func (sh *shell) lookup(name string, skipFuncs bool) (kind, where string) {
	if v, ok := sh.aliases[name]; ok && !skipFuncs {
		return "alias", "alias " + name + "=" + shellQuote(v)
	}
	if slices.Contains(keywords, name) {
		return "keyword", name
	}
	if _, ok := sh.funcs[name]; ok && !skipFuncs {
		return "function", name
	}
	if shellBuiltinNamed(name) != nil {
		return "builtin", name
	}
	c := sh.newCmd(context.Background(), []string{name})
	if p := c.which(name); p != "" {
		return "file", p
	}
	return "", ""
}

func bType(_ context.Context, sh *shell, args []string) int {
	code := 0
	mode := ""
	for _, a := range args[1:] {
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			mode = a
			continue
		}
		kind, where := sh.lookup(a, false)
		switch {
		case kind == "":
			if mode == "" {
				sh.builtinErr("type", "%s: not found", a)
			}
			code = 1
		case mode == "-t":
			fmt.Fprintln(sh.stdout(), kind)
		case mode == "-p" || mode == "-P":
			if kind == "file" {
				fmt.Fprintln(sh.stdout(), where)
			}
		case kind == "file":
			fmt.Fprintf(sh.stdout(), "%s is %s\n", a, where)
		case kind == "builtin":
			fmt.Fprintf(sh.stdout(), "%s is a shell builtin\n", a)
		case kind == "keyword":
			fmt.Fprintf(sh.stdout(), "%s is a shell keyword\n", a)
		case kind == "function":
			fmt.Fprintf(sh.stdout(), "%s is a function\n", a)
		case kind == "alias":
			fmt.Fprintf(sh.stdout(), "%s is aliased to `%s'\n", a, sh.aliases[a])
		}
	}
	return code
}

func bCommand(ctx context.Context, sh *shell, args []string) int {
	args = args[1:]
	mode := ""
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && len(args[0]) > 1 {
		switch args[0] {
		case "-v", "-V":
			mode = args[0]
		case "-p":
		case "--":
			args = args[1:]
			goto run
		default:
			return sh.builtinErr("command", "%s: invalid option", args[0])
		}
		args = args[1:]
	}
run:
	if len(args) == 0 {
		return 0
	}
	if mode != "" {
		code := 0
		for _, a := range args {
			kind, where := sh.lookup(a, false)
			switch {
			case kind == "":
				if mode == "-V" {
					sh.builtinErr("command", "%s: not found", a)
				}
				code = 1
			case mode == "-v":
				fmt.Fprintln(sh.stdout(), where)
			default:
				bType(ctx, sh, []string{"type", a})
			}
		}
		return code
	}
	if b := shellBuiltinNamed(args[0]); b != nil {
		return b(ctx, sh, args)
	}
	sh.external(ctx, args)
	return sh.exit
}

func bBuiltin(ctx context.Context, sh *shell, args []string) int {
	if len(args) < 2 {
		return 0
	}
	b := shellBuiltinNamed(args[1])
	if b == nil {
		return sh.builtinErr("builtin", "%s: not a shell builtin", args[1])
	}
	return b(ctx, sh, args[1:])
}

func bHash(_ context.Context, sh *shell, args []string) int {
	code := 0
	for _, a := range args[1:] {
		if strings.HasPrefix(a, "-") {
			continue
		}
		if kind, _ := sh.lookup(a, true); kind == "" {
			sh.builtinErr("hash", "%s: not found", a)
			code = 1
		}
	}
	return code
}

func bLet(ctx context.Context, sh *shell, args []string) int {
	if len(args) < 2 {
		return sh.builtinErr("let", "expression expected")
	}
	n := 0
	for _, a := range args[1:] {
		v, err := sh.arithString(ctx, a)
		if err != nil {
			if errors.Is(err, ErrOOM) {
				sh.fail(err)
				return exitKilled
			}
			sh.builtinErr("let", "%v", err)
			return 1
		}
		n, _ = strconv.Atoi(v)
	}
	return boolStatus(n != 0)
}

func bGetopts(_ context.Context, sh *shell, args []string) int {
	if len(args) < 3 {
		return sh.builtinErr("getopts", "usage: getopts optstring name [arg ...]")
	}
	optstring, name := args[1], args[2]
	params := sh.params
	if len(args) > 3 {
		params = args[3:]
	}
	silent := strings.HasPrefix(optstring, ":")
	optstring = strings.TrimPrefix(optstring, ":")
	optind, _ := strconv.Atoi(sh.vars.get("OPTIND").Str)
	if optind < 1 {
		optind = 1
	}
	if optind != sh.optInd {
		sh.optInd, sh.optPos = optind, 0
	}
	done := func() int {
		sh.setVar(name, "?")
		sh.vars.unset("OPTARG")
		sh.setVar("OPTIND", strconv.Itoa(optind))
		sh.optInd = optind
		return 1
	}
	if optind > len(params) {
		return done()
	}
	arg := params[optind-1]
	if sh.optPos == 0 {
		if len(arg) < 2 || arg[0] != '-' {
			return done()
		}
		if arg == "--" {
			optind++
			return done()
		}
		sh.optPos = 1
	}
	opt := arg[sh.optPos]
	sh.optPos++
	advance := func() {
		if sh.optPos >= len(arg) {
			optind++
			sh.optPos = 0
		}
	}
	i := strings.IndexByte(optstring, opt)
	if i < 0 || opt == ':' {
		advance()
		if silent {
			sh.setVar("OPTARG", string(opt))
		} else {
			fmt.Fprintf(sh.stderr(), "%s: illegal option -- %c\n", sh.arg0, opt)
			sh.vars.unset("OPTARG")
		}
		sh.setVar(name, "?")
		sh.setVar("OPTIND", strconv.Itoa(optind))
		sh.optInd = optind
		return 0
	}
	if i+1 < len(optstring) && optstring[i+1] == ':' {
		var val string
		if sh.optPos < len(arg) {
			val = arg[sh.optPos:]
			optind++
			sh.optPos = 0
		} else if optind < len(params) {
			val = params[optind]
			optind += 2
			sh.optPos = 0
		} else {
			optind++
			sh.optPos = 0
			if silent {
				sh.setVar(name, ":")
				sh.setVar("OPTARG", string(opt))
			} else {
				fmt.Fprintf(sh.stderr(), "%s: option requires an argument -- %c\n", sh.arg0, opt)
				sh.setVar(name, "?")
				sh.vars.unset("OPTARG")
			}
			sh.setVar("OPTIND", strconv.Itoa(optind))
			sh.optInd = optind
			return 0
		}
		sh.setVar("OPTARG", val)
	} else {
		advance()
		sh.vars.unset("OPTARG")
	}
	sh.setVar(name, string(opt))
	sh.setVar("OPTIND", strconv.Itoa(optind))
	sh.optInd = optind
	return 0
}

func bAlias(_ context.Context, sh *shell, args []string) int {
	if len(args) < 2 {
		for _, k := range sortedKeys(sh.aliases) {
			fmt.Fprintf(sh.stdout(), "alias %s=%s\n", k, shellQuote(sh.aliases[k]))
		}
		return 0
	}
	code := 0
	for _, a := range args[1:] {
		name, value, ok := strings.Cut(a, "=")
		if !ok {
			v, found := sh.aliases[name]
			if !found {
				sh.builtinErr("alias", "%s: not found", name)
				code = 1
				continue
			}
			fmt.Fprintf(sh.stdout(), "alias %s=%s\n", name, shellQuote(v))
			continue
		}
		sh.aliases[name] = value
	}
	return code
}

func bUnalias(_ context.Context, sh *shell, args []string) int {
	for _, a := range args[1:] {
		if a == "-a" {
			clear(sh.aliases)
			continue
		}
		delete(sh.aliases, a)
	}
	return 0
}

func bUmask(_ context.Context, sh *shell, args []string) int {
	if len(args) < 2 {
		fmt.Fprintf(sh.stdout(), "%04o\n", sh.umask())
		return 0
	}
	if args[1] == "-S" {
		fmt.Fprintln(sh.stdout(), "u=rwx,g=rx,o=rx")
		return 0
	}
	n, err := strconv.ParseUint(args[1], 8, 32)
	if err != nil {
		return sh.builtinErr("umask", "%s: octal number out of range", args[1])
	}
	sh.umaskVal = int(n) | 0o10000
	return 0
}

func (sh *shell) umask() int {
	if sh.umaskVal == 0 {
		return 0o022
	}
	return sh.umaskVal & 0o777
}

func bUlimit(_ context.Context, sh *shell, args []string) int {
	if len(args) > 1 && args[1] == "-a" {
		fmt.Fprintf(sh.stdout(), "max user processes (-u) %d\nopen files (-n) 1024\nvirtual memory (kbytes, -v) %d\n",
			sh.s.jobs.limit, sh.s.mem.limit>>10)
		return 0
	}
	if len(args) > 1 && args[len(args)-1] != "" && args[len(args)-1][0] != '-' {
		return 0 // setting a limit: the sandbox's own apply
	}
	switch {
	case len(args) > 1 && args[1] == "-u":
		fmt.Fprintln(sh.stdout(), sh.s.jobs.limit)
	case len(args) > 1 && args[1] == "-n":
		fmt.Fprintln(sh.stdout(), 1024)
	case len(args) > 1 && args[1] == "-v":
		fmt.Fprintln(sh.stdout(), sh.s.mem.limit>>10)
	default:
		fmt.Fprintln(sh.stdout(), "unlimited")
	}
	return 0
}

func bTimes(_ context.Context, sh *shell, _ []string) int {
	el := time.Since(sh.s.started)
	fmt.Fprintf(sh.stdout(), "%s 0m0.000s\n0m0.000s 0m0.000s\n", bashDuration(el))
	return 0
}

func bCaller(_ context.Context, sh *shell, _ []string) int {
	if len(sh.funcNames) == 0 {
		return 1
	}
	fmt.Fprintf(sh.stdout(), "%d main\n", sh.lineno)
	return 0
}

func bHelp(_ context.Context, sh *shell, _ []string) int {
	fmt.Fprintln(sh.stdout(), "Shell builtins: "+strings.Join(shellBuiltinNames, " "))
	return 0
}
