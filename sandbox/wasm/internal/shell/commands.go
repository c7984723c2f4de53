package shell

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/interp"
	"mvdan.cc/sh/v3/syntax"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// cmd is one builtin command's invocation.
type cmd struct {
	ctx    context.Context
	s      *session
	args   []string
	dir    string
	env    expand.Environ
	extra  []string // KEY=VALUE added by env(1)
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

type builtin func(c *cmd) int

var builtins map[string]builtin

func init() {
	builtins = map[string]builtin{
		"cat": cmdCat, "ls": cmdLs, "grep": cmdGrep, "egrep": cmdGrep, "fgrep": cmdGrep,
		"head": cmdHead, "tail": cmdTail, "wc": cmdWc, "sed": cmdSed, "sort": cmdSort,
		"uniq": cmdUniq, "mkdir": cmdMkdir, "rmdir": cmdRmdir, "rm": cmdRm, "cp": cmdCp,
		"mv": cmdMv, "touch": cmdTouch, "find": cmdFind, "diff": cmdDiff, "sleep": cmdSleep,
		"yes": cmdYes, "env": cmdEnv, "printenv": cmdPrintenv, "seq": cmdSeq, "tr": cmdTr,
		"cut": cmdCut, "xargs": cmdXargs, "basename": cmdBasename, "dirname": cmdDirname,
		"tee": cmdTee, "ln": cmdLn, "chmod": cmdChmod, "date": cmdDate, "readlink": cmdReadlink,
		"realpath": cmdRealpath, "nproc": cmdConst("1\n"), "uname": cmdUname,
		"whoami": cmdConst("user\n"), "id": cmdConst("uid=1000(user) gid=1000(user) groups=1000(user)\n"),
		"hostname": cmdConst("sandbox\n"), "rev": cmdRev, "tac": cmdTac, "nl": cmdNl,
		"md5sum": cmdSum("md5"), "sha1sum": cmdSum("sha1"), "sha256sum": cmdSum("sha256"),
		"base64": cmdBase64, "timeout": cmdTimeout, "sh": cmdSh, "bash": cmdSh,
		"stat": cmdStat, "du": cmdDu, "expr": cmdExpr, "paste": cmdPaste,
		"__rb_line": cmdLine(false), "__rb_line_raw": cmdLine(true), "__rb_cap": cmdCap,
		"__rb_refuse": cmdRefuse, "__rb_which": cmdWhich,
		"__rb_job_begin": func(c *cmd) int {
			if !c.s.g.jobBegin() {
				return 137
			}
			return 0
		},
		"__rb_job_end": func(c *cmd) int {
			c.s.g.jobEnd()
			code, _ := strconv.Atoi(c.args[len(c.args)-1])
			return code
		},
	}
}

// Names lists the builtin commands, for documentation and tests.
func Names() []string {
	var out []string
	for n := range builtins {
		if !strings.HasPrefix(n, "__") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func (c *cmd) errf(format string, args ...any) int {
	fmt.Fprintf(c.stderr, c.args[0]+": "+format+"\n", args...)
	return 1
}

func (c *cmd) abs(p string) string { return abs(c.dir, p) }
func (c *cmd) fs() *vfs.FS         { return c.s.cfg.FS }

// dispatch runs c.args: a builtin, a program the ProgramRunner knows, or a
// script in the episode filesystem.
func (c *cmd) dispatch() int {
	name := c.args[0]
	if b := builtins[name]; b != nil {
		return b(c)
	}
	if strings.Contains(name, "/") {
		return c.runPath()
	}
	if c.s.cfg.Program != nil {
		if prog, ok := c.s.cfg.Program.Lookup(c.fs(), c.dir, name); ok {
			return c.runProgram(prog)
		}
	}
	// A script named by PATH inside the episode.
	for _, d := range strings.Split(c.env.Get("PATH").String(), ":") {
		if d == "" {
			continue
		}
		p := path.Join(d, name)
		if fi, err := c.fs().Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			c.args[0] = p
			return c.runPath()
		}
	}
	fmt.Fprintf(c.stderr, "sh: %s: command not found\n", name)
	return exitNotFound
}

func (c *cmd) environ() []string {
	env := environ(c.env)
	if len(c.extra) == 0 {
		return env
	}
	m := map[string]string{}
	for _, kv := range append(env, c.extra...) {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func (c *cmd) runProgram(prog string) int {
	code, err := c.s.cfg.Program.Run(c.ctx, Proc{Args: append([]string{prog}, c.args[1:]...), Dir: c.dir,
		Env: c.environ(), Stdin: c.stdin, Stdout: c.stdout, Stderr: c.stderr})
	if err != nil {
		if c.ctx.Err() != nil {
			return 137
		}
		return c.errf("%v", err)
	}
	return code
}

// runPath runs a file of the episode: a .wasm module or a script.
func (c *cmd) runPath() int {
	p := c.abs(c.args[0])
	fi, err := c.fs().Stat(p)
	if err != nil {
		fmt.Fprintf(c.stderr, "sh: %s: No such file or directory\n", c.args[0])
		return exitNotFound
	}
	if fi.IsDir() {
		fmt.Fprintf(c.stderr, "sh: %s: Is a directory\n", c.args[0])
		return 126
	}
	f, err := c.fs().Open(p)
	if err != nil {
		return c.errf("%v", err)
	}
	head := make([]byte, 256)
	n, _ := io.ReadFull(f, head)
	f.Close()
	head = head[:n]
	if bytes.HasPrefix(head, []byte("\x00asm")) && c.s.cfg.Program != nil {
		return c.runProgram(p)
	}
	interp := interpreterOf(head)
	switch interp {
	case "sh", "bash", "dash":
		c.args = append([]string{"sh", p}, c.args[1:]...)
		return cmdSh(c)
	}
	if c.s.cfg.Program != nil {
		if prog, ok := c.s.cfg.Program.Lookup(c.fs(), c.dir, interp); ok {
			c.args = append([]string{prog, p}, c.args[1:]...)
			return c.runProgram(prog)
		}
	}
	fmt.Fprintf(c.stderr, "sh: %s: bad interpreter %s\n", c.args[0], interp)
	return 126
}

// sub runs args as a command of its own (xargs, env, timeout).
func (c *cmd) sub(ctx context.Context, args []string, stdin io.Reader, extra []string) int {
	c2 := *c
	c2.ctx, c2.args, c2.extra = ctx, args, append(append([]string(nil), c.extra...), extra...)
	if stdin != nil {
		c2.stdin = stdin
	}
	if len(args) > 0 && (interp.IsBuiltin(args[0]) || args[0] == "echo" || args[0] == "printf" || args[0] == "test" || args[0] == "[") {
		// Interpreter builtins: run them through a tiny shell.
		return c.s.subshell(ctx, &c2, args)
	}
	return c2.dispatch()
}

// subshell runs argv as one simple command in a fresh interpreter.
func (s *session) subshell(ctx context.Context, c *cmd, argv []string) int {
	call := &syntax.CallExpr{}
	for _, a := range argv {
		call.Args = append(call.Args, &syntax.Word{Parts: []syntax.WordPart{&syntax.SglQuoted{Value: a}}})
	}
	file := &syntax.File{Stmts: []*syntax.Stmt{{Cmd: call}}}
	env := envMap(c.environ())
	stdin, closeIn := asFile(ctx, c.stdin)
	defer closeIn()
	return s.run(ctx, func() (syntax.Node, error) { return file, nil }, c.dir, env, nil, stdin, c.stdout, c.stderr)
}

func envMap(kvs []string) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// asFile gives the interpreter an *os.File for r, copying through a pipe
// when r is not one; close ends the copy.
func asFile(ctx context.Context, r io.Reader) (*os.File, func()) {
	if f, ok := r.(*os.File); ok {
		return f, func() {}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(pw, r)
		pw.Close()
	}()
	return pr, func() {
		pr.Close()
		pw.Close()
		<-done
	}
}

// cmdSh is sh and bash: -c SCRIPT [NAME [ARGS]], FILE [ARGS], or a script
// on stdin.
func cmdSh(c *cmd) int {
	args := c.args[1:]
	var flags []string
	var script, name string
	haveScript := false
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "-" && args[0] != "--" {
		a := args[0]
		args = args[1:]
		if a == "-c" {
			if len(args) == 0 {
				return c.errf("-c: option requires an argument")
			}
			script, args, haveScript = args[0], args[1:], true
			name = "sh"
			if len(args) > 0 {
				name, args = args[0], args[1:]
			}
			break
		}
		if a == "-o" || a == "+o" {
			if len(args) > 0 {
				flags = append(flags, a, args[0])
				args = args[1:]
			}
			continue
		}
		flags = append(flags, a)
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if !haveScript {
		if len(args) > 0 {
			name = args[0]
			data, err := c.fs().ReadFile(c.abs(name), 0)
			if err != nil {
				fmt.Fprintf(c.stderr, "sh: %s: No such file or directory\n", name)
				return exitNotFound
			}
			script, args = string(data), args[1:]
		} else {
			data, err := readAllCapped(c, c.stdin)
			if err != nil {
				return 137
			}
			script, name = string(data), "sh"
		}
	}
	g := c.s.g
	load := func() (syntax.Node, error) { return parse(g, script, name) }
	env := envMap(c.environ())
	stdin, closeIn := asFile(c.ctx, c.stdin)
	defer closeIn()
	params := append([]string{}, args...)
	if len(flags) > 0 {
		return c.s.runFlags(c.ctx, load, c.dir, env, flags, params, stdin, c.stdout, c.stderr)
	}
	return c.s.run(c.ctx, load, c.dir, env, params, stdin, c.stdout, c.stderr)
}

// runFlags is run with set options (-e, -x, -u, -o pipefail).
func (s *session) runFlags(ctx context.Context, load func() (syntax.Node, error), dir string, env map[string]string, flags, params []string, stdin *os.File, stdout, stderr io.Writer) int {
	return s.run(ctx, func() (syntax.Node, error) {
		n, err := load()
		if err != nil {
			return nil, err
		}
		// Prepend "set FLAGS" to the program.
		f := n.(*syntax.File)
		call := &syntax.CallExpr{Args: []*syntax.Word{lit("set")}}
		for _, fl := range flags {
			call.Args = append(call.Args, lit(fl))
		}
		f.Stmts = append([]*syntax.Stmt{{Cmd: call}}, f.Stmts...)
		return f, nil
	}, dir, env, params, stdin, stdout, stderr)
}

// readAllCapped reads r whole, within the memory cap.
func readAllCapped(c *cmd, r io.Reader) ([]byte, error) {
	limit := c.s.g.limits.MemoryBytes
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if int64(len(data)) > limit {
		name := c.args[0]
		if name == "__rb_cap" {
			name = "mapfile"
		}
		return nil, c.s.g.outOfMemory("%s: input larger than the %d MB memory limit", name, limit>>20)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return data, err
	}
	return data, nil
}

// inputs opens each operand (or stdin when there are none, or for "-").
func (c *cmd) inputs(names []string, each func(name string, r io.Reader) error) int {
	if len(names) == 0 {
		names = []string{"-"}
	}
	code := 0
	for _, n := range names {
		if n == "-" {
			if err := each(n, c.stdin); err != nil {
				return c.ioErr(err)
			}
			continue
		}
		f, err := c.fs().Open(c.abs(n))
		if err != nil {
			c.errf("%s: %s", n, errText(err))
			code = 1
			continue
		}
		if fi, _ := f.Stat(); fi != nil && fi.IsDir() {
			f.Close()
			c.errf("%s: Is a directory", n)
			code = 1
			continue
		}
		err = each(n, f)
		f.Close()
		if err != nil {
			return c.ioErr(err)
		}
	}
	return code
}

// ioErr turns a write or read error into a status: a closed pipe ends the
// command quietly, like SIGPIPE would.
func (c *cmd) ioErr(err error) int {
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
		return 141
	}
	if errors.Is(err, ErrOOM) || c.ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
		return 137
	}
	c.errf("%s", errText(err))
	return 1
}

func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	switch {
	case errors.Is(err, syscall.ENOENT):
		return "No such file or directory"
	case errors.Is(err, syscall.EISDIR):
		return "Is a directory"
	case errors.Is(err, syscall.ENOTDIR):
		return "Not a directory"
	case errors.Is(err, syscall.ENOSPC):
		return "No space left on device"
	case errors.Is(err, syscall.EEXIST):
		return "File exists"
	case errors.Is(err, syscall.ENOTEMPTY):
		return "Directory not empty"
	}
	return err.Error()
}

func cmdConst(s string) builtin {
	return func(c *cmd) int {
		io.WriteString(c.stdout, s)
		return 0
	}
}

func cmdRefuse(c *cmd) int {
	fmt.Fprintf(c.stderr, "sh: %s\n", strings.Join(c.args[1:], " "))
	return exitUsage
}

// cmdWhich serves command -v/-V, type, hash and which from the episode's
// namespace (the interpreter's own would look at the host's PATH).
func cmdWhich(c *cmd) int {
	mode := c.args[1]
	names := c.args[2:]
	if strings.HasPrefix(mode, "-t:") {
		mode = mode[3:]
		for len(names) > 0 && strings.HasPrefix(names[0], "-") {
			names = names[1:]
		}
	}
	code := 0
	for _, n := range names {
		kind, where := c.lookup(n)
		switch {
		case kind == "":
			if mode != "-v" && mode != "hash" {
				fmt.Fprintf(c.stderr, "%s: %s: not found\n", strings.TrimPrefix(mode, "-"), n)
			}
			code = 1
		case mode == "-v" || mode == "which":
			fmt.Fprintln(c.stdout, where)
		case mode == "hash":
		default:
			fmt.Fprintf(c.stdout, "%s is %s\n", n, kind)
		}
	}
	return code
}

func (c *cmd) lookup(n string) (kind, where string) {
	switch {
	case interp.IsBuiltin(n) || n == "echo" || n == "printf" || n == "test" || n == "[":
		return "a shell builtin", n
	case builtins[n] != nil && !strings.HasPrefix(n, "__"):
		return "/bin/" + n, "/bin/" + n
	}
	if c.s.cfg.Program != nil {
		if _, ok := c.s.cfg.Program.Lookup(c.fs(), c.dir, n); ok {
			return "/usr/bin/" + n, "/usr/bin/" + n
		}
	}
	if strings.Contains(n, "/") {
		if fi, err := c.fs().Stat(c.abs(n)); err == nil && !fi.IsDir() {
			return c.abs(n), c.abs(n)
		}
	}
	return "", ""
}

// cmdLine copies one line of stdin (a backslash-newline continues it unless
// raw) to stdout, within the memory cap: it feeds read.
func cmdLine(raw bool) builtin {
	return func(c *cmd) int {
		// The line is held here, in the pipe and by read (which grows
		// its buffer by doubling): a quarter of the cap each.
		limit := c.s.g.limits.MemoryBytes / 4
		var line []byte
		var b [1]byte
		esc := false
		for {
			n, err := c.stdin.Read(b[:])
			if n > 0 {
				line = append(line, b[0])
				if int64(len(line)) > limit {
					c.s.g.outOfMemory("read: a line longer than the %d MB memory limit", limit>>20)
					return 137
				}
				if b[0] == '\n' && !(esc && !raw) {
					break
				}
				esc = !raw && b[0] == '\\' && !esc
				if b[0] != '\\' {
					esc = false
				}
			}
			if err != nil {
				break
			}
		}
		c.stdout.Write(line)
		return 0
	}
}

// cmdCap copies stdin to stdout within the memory cap: it feeds mapfile.
func cmdCap(c *cmd) int {
	data, err := readAllCapped(c, c.stdin)
	if err != nil {
		return 137
	}
	c.stdout.Write(data)
	return 0
}

// flags parses single-letter flags (combined like -rf) and flags with a
// value; it stops at the first operand or "--".
type flagSet struct {
	bools  map[byte]bool
	values map[byte]string
	args   []string
}

func parseFlags(args []string, withValue string) (*flagSet, error) {
	fs := &flagSet{bools: map[byte]bool{}, values: map[byte]string{}}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			fs.args = append(fs.args, args[i+1:]...)
			return fs, nil
		}
		if len(a) < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9' && !strings.Contains(withValue, "#")) {
			fs.args = append(fs.args, a)
			continue
		}
		for j := 1; j < len(a); j++ {
			ch := a[j]
			if strings.IndexByte(withValue, ch) >= 0 {
				v := a[j+1:]
				if v == "" {
					if i+1 >= len(args) {
						return nil, fmt.Errorf("option requires an argument -- '%c'", ch)
					}
					i++
					v = args[i]
				}
				fs.values[ch] = v
				break
			}
			fs.bools[ch] = true
		}
	}
	return fs, nil
}

func cmdCat(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	number := f.bools['n']
	lineNo := 0
	return c.inputs(f.args, func(_ string, r io.Reader) error {
		if !number {
			_, err := io.Copy(c.stdout, r)
			return err
		}
		return eachLine(r, func(line []byte) error {
			lineNo++
			_, err := fmt.Fprintf(c.stdout, "%6d\t%s", lineNo, line)
			return err
		})
	})
}

// eachLine calls fn with each line including its newline.
func eachLine(r io.Reader, fn func(line []byte) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A long line: gather it whole.
			buf := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				buf = append(buf, line...)
			}
			line = buf
		}
		if len(line) > 0 {
			if ferr := fn(line); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func cmdLs(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	long, all, recursive, dirOnly := f.bools['l'], f.bools['a'] || f.bools['A'], f.bools['R'], f.bools['d']
	names := f.args
	if len(names) == 0 {
		names = []string{"."}
	}
	code := 0
	var files []string
	var dirs []string
	for _, n := range names {
		fi, err := c.fs().Stat(c.abs(n))
		if err != nil {
			c.errf("cannot access '%s': %s", n, errText(err))
			code = 2
			continue
		}
		if fi.IsDir() && !dirOnly {
			dirs = append(dirs, n)
		} else {
			files = append(files, n)
		}
	}
	show := func(name string, fi fs.FileInfo) {
		if long {
			link := ""
			if fi.Mode()&fs.ModeSymlink != 0 {
				link = " -> ?"
			}
			fmt.Fprintf(c.stdout, "%s 1 user user %8d %s %s%s\n", fi.Mode().String(), fi.Size(), fi.ModTime().UTC().Format("Jan _2 15:04"), name, link)
			return
		}
		fmt.Fprintln(c.stdout, name)
	}
	for _, n := range files {
		fi, _ := c.fs().Lstat(c.abs(n))
		show(n, fi)
	}
	var listDir func(n string, header bool)
	listDir = func(n string, header bool) {
		if header {
			fmt.Fprintf(c.stdout, "%s:\n", n)
		}
		ents, err := c.fs().ReadDir(c.abs(n))
		if err != nil {
			c.errf("cannot open directory '%s': %s", n, errText(err))
			code = 2
			return
		}
		if long {
			var total int64
			for _, e := range ents {
				if fi, err := e.Info(); err == nil {
					total += (fi.Size() + 1023) / 1024
				}
			}
			fmt.Fprintf(c.stdout, "total %d\n", total)
		}
		for _, e := range ents {
			if !all && strings.HasPrefix(e.Name(), ".") {
				continue
			}
			fi, _ := e.Info()
			show(e.Name(), fi)
		}
		if recursive {
			for _, e := range ents {
				if e.IsDir() && (all || !strings.HasPrefix(e.Name(), ".")) {
					fmt.Fprintln(c.stdout)
					listDir(path.Join(n, e.Name()), true)
				}
			}
		}
	}
	for i, n := range dirs {
		if i > 0 || len(files) > 0 {
			fmt.Fprintln(c.stdout)
		}
		listDir(n, len(names) > 1 || recursive)
	}
	return code
}

func parseCount(s string) (int64, bool) {
	mult := int64(1)
	for suf, m := range map[string]int64{"K": 1 << 10, "k": 1 << 10, "M": 1 << 20, "G": 1 << 30} {
		if strings.HasSuffix(s, suf) {
			s, mult = strings.TrimSuffix(s, suf), m
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err == nil
}

func cmdHead(c *cmd) int {
	args := c.args[1:]
	if len(args) > 0 && len(args[0]) > 1 && args[0][0] == '-' && args[0][1] >= '0' && args[0][1] <= '9' {
		args = append([]string{"-n", args[0][1:]}, args[1:]...)
	}
	f, err := parseFlags(args, "nc")
	if err != nil {
		return c.errf("%v", err)
	}
	lines, bytesMode := int64(10), int64(-1)
	if v, ok := f.values['n']; ok {
		if lines, ok = parseCount(v); !ok {
			return c.errf("invalid number of lines: '%s'", v)
		}
	}
	if v, ok := f.values['c']; ok {
		if bytesMode, ok = parseCount(v); !ok {
			return c.errf("invalid number of bytes: '%s'", v)
		}
	}
	multi := len(f.args) > 1
	first := true
	return c.inputs(f.args, func(name string, r io.Reader) error {
		if multi {
			if !first {
				fmt.Fprintln(c.stdout)
			}
			fmt.Fprintf(c.stdout, "==> %s <==\n", name)
		}
		first = false
		if bytesMode >= 0 {
			_, err := copyBuf(c.stdout, io.LimitReader(r, bytesMode))
			return err
		}
		n := int64(0)
		if n >= lines {
			return nil
		}
		errStop := errors.New("stop")
		err := eachLine(r, func(line []byte) error {
			if _, err := c.stdout.Write(line); err != nil {
				return err
			}
			if n++; n >= lines {
				return errStop
			}
			return nil
		})
		if err == errStop {
			return nil
		}
		return err
	})
}

// copyBuf copies with a large buffer, so that floods move quickly.
func copyBuf(w io.Writer, r io.Reader) (int64, error) {
	buf := make([]byte, 256<<10)
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{r}, buf)
}

func cmdTail(c *cmd) int {
	args := c.args[1:]
	if len(args) > 0 && len(args[0]) > 1 && (args[0][0] == '-' || args[0][0] == '+') && args[0][1] >= '0' && args[0][1] <= '9' {
		args = append([]string{"-n", args[0]}, args[1:]...)
		if args[1][0] == '-' {
			args[1] = args[1][1:]
		}
	}
	f, err := parseFlags(args, "nc")
	if err != nil {
		return c.errf("%v", err)
	}
	spec, isBytes := "10", false
	if v, ok := f.values['n']; ok {
		spec = v
	}
	if v, ok := f.values['c']; ok {
		spec, isBytes = v, true
	}
	fromStart := strings.HasPrefix(spec, "+")
	n, ok := parseCount(strings.TrimPrefix(spec, "+"))
	if !ok {
		return c.errf("invalid number: '%s'", spec)
	}
	return c.inputs(f.args, func(_ string, r io.Reader) error {
		if isBytes {
			if fromStart {
				io.CopyN(io.Discard, r, max(n-1, 0))
				_, err := copyBuf(c.stdout, r)
				return err
			}
			// Keep the last n bytes in a ring.
			ring := make([]byte, 0, min(n, c.s.g.limits.MemoryBytes))
			buf := make([]byte, 64<<10)
			for {
				k, err := r.Read(buf)
				ring = append(ring, buf[:k]...)
				if int64(len(ring)) > n {
					ring = append(ring[:0], ring[int64(len(ring))-n:]...)
				}
				if err != nil {
					break
				}
			}
			_, err := c.stdout.Write(ring)
			return err
		}
		if fromStart {
			i := int64(0)
			return eachLine(r, func(line []byte) error {
				if i++; i >= n {
					_, err := c.stdout.Write(line)
					return err
				}
				return nil
			})
		}
		var ring [][]byte
		var held int64
		err := eachLine(r, func(line []byte) error {
			ring = append(ring, append([]byte(nil), line...))
			held += int64(len(line))
			if int64(len(ring)) > n {
				held -= int64(len(ring[0]))
				ring = ring[1:]
			}
			if held > c.s.g.limits.MemoryBytes {
				return c.s.g.outOfMemory("tail: more than the %d MB memory limit held", c.s.g.limits.MemoryBytes>>20)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, l := range ring {
			if _, err := c.stdout.Write(l); err != nil {
				return err
			}
		}
		return nil
	})
}

func cmdWc(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	show := []bool{f.bools['l'], f.bools['w'], f.bools['c'] || f.bools['m']}
	if !show[0] && !show[1] && !show[2] {
		show = []bool{true, true, true}
	}
	nshow := 0
	for _, s := range show {
		if s {
			nshow++
		}
	}
	type counts [3]int64
	var rows []counts
	var names []string
	var total counts
	code := c.inputs(f.args, func(name string, r io.Reader) error {
		var k counts
		buf := make([]byte, 64<<10)
		inWord := false
		for {
			n, err := r.Read(buf)
			for _, b := range buf[:n] {
				if b == '\n' {
					k[0]++
				}
				space := b == ' ' || b == '\n' || b == '\t' || b == '\r' || b == '\v' || b == '\f'
				if !space && !inWord {
					k[1]++
				}
				inWord = !space
			}
			k[2] += int64(n)
			if err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return err
			}
		}
		rows = append(rows, k)
		names = append(names, name)
		for i := range total {
			total[i] += k[i]
		}
		return nil
	})
	if len(rows) > 1 {
		rows = append(rows, total)
		names = append(names, "total")
	}
	width := 1
	for _, r := range rows {
		for i, v := range r {
			if show[i] {
				width = max(width, len(strconv.FormatInt(v, 10)))
			}
		}
	}
	if nshow > 1 && len(f.args) == 0 {
		width = max(width, 7)
	}
	for i, r := range rows {
		var parts []string
		for j, v := range r {
			if show[j] {
				if nshow == 1 && len(rows) == 1 {
					parts = append(parts, strconv.FormatInt(v, 10))
				} else {
					parts = append(parts, fmt.Sprintf("%*d", width, v))
				}
			}
		}
		line := strings.Join(parts, " ")
		if names[i] != "-" {
			line += " " + names[i]
		}
		fmt.Fprintln(c.stdout, line)
	}
	return code
}

func cmdSort(c *cmd) int {
	f, err := parseFlags(c.args[1:], "ktoT")
	if err != nil {
		return c.errf("%v", err)
	}
	var lines []string
	var held int64
	code := c.inputs(f.args, func(_ string, r io.Reader) error {
		return eachLine(r, func(line []byte) error {
			held += int64(len(line)) + 16
			if held > c.s.g.limits.MemoryBytes {
				return c.s.g.outOfMemory("sort: input larger than the %d MB memory limit", c.s.g.limits.MemoryBytes>>20)
			}
			lines = append(lines, strings.TrimSuffix(string(line), "\n"))
			return nil
		})
	})
	if code != 0 && c.s.g.oom.Load() {
		return code
	}
	sep, hasSep := f.values['t']
	keyStart, keyEnd := 0, 0
	if k, ok := f.values['k']; ok {
		a, b, _ := strings.Cut(k, ",")
		keyStart, _ = strconv.Atoi(strings.TrimRight(a, "bdfgiMhnRrV"))
		keyEnd, _ = strconv.Atoi(strings.TrimRight(b, "bdfgiMhnRrV"))
		if strings.ContainsAny(a, "n") {
			f.bools['n'] = true
		}
		if strings.ContainsAny(a, "r") {
			f.bools['r'] = true
		}
	}
	key := func(s string) string {
		if keyStart == 0 {
			return s
		}
		var fields []string
		if hasSep {
			fields = strings.Split(s, sep)
		} else {
			fields = strings.Fields(s)
		}
		if keyStart > len(fields) {
			return ""
		}
		end := len(fields)
		if keyEnd > 0 && keyEnd < end {
			end = keyEnd
		}
		j := " "
		if hasSep {
			j = sep
		}
		return strings.Join(fields[keyStart-1:end], j)
	}
	num := func(s string) float64 {
		s = strings.TrimSpace(s)
		end := 0
		for end < len(s) && (s[end] == '-' && end == 0 || s[end] == '.' || s[end] >= '0' && s[end] <= '9') {
			end++
		}
		v, _ := strconv.ParseFloat(s[:end], 64)
		return v
	}
	less := func(a, b string) bool {
		ka, kb := key(a), key(b)
		if f.bools['f'] {
			ka, kb = strings.ToLower(ka), strings.ToLower(kb)
		}
		if f.bools['n'] || f.bools['g'] {
			na, nb := num(ka), num(kb)
			if na != nb {
				return na < nb
			}
			return a < b
		}
		if ka != kb {
			return ka < kb
		}
		return a < b
	}
	sort.SliceStable(lines, func(i, j int) bool {
		if f.bools['r'] {
			return less(lines[j], lines[i])
		}
		return less(lines[i], lines[j])
	})
	w := bufio.NewWriter(c.stdout)
	prev := "\x00none"
	for _, l := range lines {
		if f.bools['u'] && key(l) == prev {
			continue
		}
		prev = key(l)
		w.WriteString(l)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		return c.ioErr(err)
	}
	return code
}

func cmdUniq(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	w := bufio.NewWriter(c.stdout)
	var prev string
	count := 0
	flush := func() {
		if count == 0 {
			return
		}
		if f.bools['d'] && count < 2 || f.bools['u'] && count > 1 {
			return
		}
		if f.bools['c'] {
			fmt.Fprintf(w, "%7d %s\n", count, prev)
		} else {
			w.WriteString(prev)
			w.WriteByte('\n')
		}
	}
	eq := func(a, b string) bool {
		if f.bools['i'] {
			return strings.EqualFold(a, b)
		}
		return a == b
	}
	code := c.inputs(f.args[:min(len(f.args), 1)], func(_ string, r io.Reader) error {
		return eachLine(r, func(line []byte) error {
			l := strings.TrimSuffix(string(line), "\n")
			if count > 0 && eq(l, prev) {
				count++
				return nil
			}
			flush()
			prev, count = l, 1
			return nil
		})
	})
	flush()
	if err := w.Flush(); err != nil {
		return c.ioErr(err)
	}
	return code
}

func cmdMkdir(c *cmd) int {
	f, err := parseFlags(c.args[1:], "m")
	if err != nil {
		return c.errf("%v", err)
	}
	code := 0
	for _, n := range f.args {
		if f.bools['p'] {
			err = c.fs().MkdirAll(c.abs(n), 0o755)
		} else {
			err = c.fs().Mkdir(c.abs(n), 0o755)
		}
		if err != nil {
			code = c.errf("cannot create directory '%s': %s", n, errText(err))
		}
	}
	return code
}

func cmdRmdir(c *cmd) int {
	code := 0
	for _, n := range c.args[1:] {
		fi, err := c.fs().Lstat(c.abs(n))
		if err == nil && !fi.IsDir() {
			err = syscall.ENOTDIR
		}
		if err == nil {
			err = c.fs().Remove(c.abs(n))
		}
		if err != nil {
			code = c.errf("failed to remove '%s': %s", n, errText(err))
		}
	}
	return code
}

func cmdRm(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	recursive, force := f.bools['r'] || f.bools['R'], f.bools['f']
	code := 0
	for _, n := range f.args {
		p := c.abs(n)
		fi, err := c.fs().Lstat(p)
		if err != nil {
			if !force {
				code = c.errf("cannot remove '%s': %s", n, errText(err))
			}
			continue
		}
		if fi.IsDir() && !recursive {
			code = c.errf("cannot remove '%s': Is a directory", n)
			continue
		}
		if p == "/" {
			code = c.errf("it is dangerous to operate recursively on '/'")
			continue
		}
		if err := c.fs().RemoveAll(p); err != nil {
			code = c.errf("cannot remove '%s': %s", n, errText(err))
		}
	}
	return code
}

func (c *cmd) copyTree(src, dst string, recursive bool) error {
	fi, err := c.fs().Stat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if !recursive {
			return fmt.Errorf("-r not specified; omitting directory '%s'", src)
		}
		if err := c.fs().MkdirAll(dst, fi.Mode().Perm()); err != nil {
			return err
		}
		ents, err := c.fs().ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := c.copyTree(path.Join(src, e.Name()), path.Join(dst, e.Name()), true); err != nil {
				return err
			}
		}
		return nil
	}
	in, err := c.fs().Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := c.fs().OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	defer out.Close()
	_, err = io.Copy(out, in)
	return err
}

// targets resolves cp/mv operands: the last is a directory or the single
// destination.
func (c *cmd) targets(ops []string) (srcs []string, dst func(src string) string, err error) {
	if len(ops) < 2 {
		return nil, nil, errors.New("missing destination file operand")
	}
	srcs, last := ops[:len(ops)-1], c.abs(ops[len(ops)-1])
	if fi, err := c.fs().Stat(last); err == nil && fi.IsDir() {
		return srcs, func(s string) string { return path.Join(last, path.Base(c.abs(s))) }, nil
	}
	if len(srcs) > 1 {
		return nil, nil, fmt.Errorf("target '%s' is not a directory", ops[len(ops)-1])
	}
	return srcs, func(string) string { return last }, nil
}

func cmdCp(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	srcs, dst, err := c.targets(f.args)
	if err != nil {
		return c.errf("%v", err)
	}
	code := 0
	for _, s := range srcs {
		if err := c.copyTree(c.abs(s), dst(s), f.bools['r'] || f.bools['R'] || f.bools['a']); err != nil {
			code = c.errf("cannot copy '%s': %s", s, errText(err))
		}
	}
	return code
}

func cmdMv(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	srcs, dst, err := c.targets(f.args)
	if err != nil {
		return c.errf("%v", err)
	}
	code := 0
	for _, s := range srcs {
		if err := c.fs().Rename(c.abs(s), dst(s)); err != nil {
			code = c.errf("cannot move '%s': %s", s, errText(err))
		}
	}
	return code
}

func cmdTouch(c *cmd) int {
	f, err := parseFlags(c.args[1:], "dtr")
	if err != nil {
		return c.errf("%v", err)
	}
	code := 0
	for _, n := range f.args {
		p := c.abs(n)
		if _, err := c.fs().Stat(p); err == nil {
			c.fs().Chtimes(p, time.Now())
			continue
		}
		if f.bools['c'] {
			continue
		}
		h, err := c.fs().OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			code = c.errf("cannot touch '%s': %s", n, errText(err))
			continue
		}
		h.Close()
	}
	return code
}

func cmdSleep(c *cmd) int {
	var total time.Duration
	for _, a := range c.args[1:] {
		unit := time.Second
		switch {
		case strings.HasSuffix(a, "s"):
			a = strings.TrimSuffix(a, "s")
		case strings.HasSuffix(a, "m"):
			a, unit = strings.TrimSuffix(a, "m"), time.Minute
		case strings.HasSuffix(a, "h"):
			a, unit = strings.TrimSuffix(a, "h"), time.Hour
		case strings.HasSuffix(a, "d"):
			a, unit = strings.TrimSuffix(a, "d"), 24*time.Hour
		}
		v, err := strconv.ParseFloat(a, 64)
		if err != nil || v < 0 {
			return c.errf("invalid time interval '%s'", a)
		}
		total += time.Duration(v * float64(unit))
	}
	t := time.NewTimer(total)
	defer t.Stop()
	select {
	case <-t.C:
		return 0
	case <-c.ctx.Done():
		return 137
	}
}

func cmdYes(c *cmd) int {
	s := "y"
	if len(c.args) > 1 {
		s = strings.Join(c.args[1:], " ")
	}
	line := []byte(s + "\n")
	buf := bytes.Repeat(line, max(1, (64<<10)/len(line)))
	for {
		if c.ctx.Err() != nil {
			return 137
		}
		if _, err := c.stdout.Write(buf); err != nil {
			return c.ioErr(err)
		}
	}
}

func cmdEnv(c *cmd) int {
	args := c.args[1:]
	var extra []string
	for len(args) > 0 {
		if args[0] == "-i" || args[0] == "-" {
			args = args[1:]
			continue
		}
		if strings.Contains(args[0], "=") && !strings.HasPrefix(args[0], "=") {
			extra = append(extra, args[0])
			args = args[1:]
			continue
		}
		break
	}
	if len(args) == 0 {
		c2 := *c
		c2.extra = append(append([]string(nil), c.extra...), extra...)
		for _, kv := range c2.environ() {
			fmt.Fprintln(c.stdout, kv)
		}
		return 0
	}
	return c.sub(c.ctx, args, nil, extra)
}

func cmdPrintenv(c *cmd) int {
	env := envMap(c.environ())
	if len(c.args) == 1 {
		for _, kv := range c.environ() {
			fmt.Fprintln(c.stdout, kv)
		}
		return 0
	}
	code := 0
	for _, n := range c.args[1:] {
		v, ok := env[n]
		if !ok {
			code = 1
			continue
		}
		fmt.Fprintln(c.stdout, v)
	}
	return code
}

func cmdSeq(c *cmd) int {
	args := c.args[1:]
	sep := "\n"
	width := false
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && len(args[0]) > 1 && (args[0][1] < '0' || args[0][1] > '9') {
		switch {
		case strings.HasPrefix(args[0], "-s") && len(args[0]) > 2:
			sep = args[0][2:]
		case args[0] == "-s":
			if len(args) < 2 {
				return c.errf("option requires an argument -- 's'")
			}
			sep, args = args[1], args[1:]
		case args[0] == "-w":
			width = true
		}
		args = args[1:]
	}
	nums := make([]float64, len(args))
	isInt := true
	for i, a := range args {
		v, err := strconv.ParseFloat(a, 64)
		if err != nil {
			return c.errf("invalid floating point argument: '%s'", a)
		}
		nums[i] = v
		if strings.Contains(a, ".") {
			isInt = false
		}
	}
	first, inc, last := 1.0, 1.0, 0.0
	switch len(nums) {
	case 1:
		last = nums[0]
	case 2:
		first, last = nums[0], nums[1]
	case 3:
		first, inc, last = nums[0], nums[1], nums[2]
	default:
		return c.errf("missing operand")
	}
	if inc == 0 {
		return c.errf("invalid Zero increment value")
	}
	w := bufio.NewWriterSize(c.stdout, 64<<10)
	wd := 0
	if width {
		wd = max(len(strconv.FormatFloat(first, 'f', -1, 64)), len(strconv.FormatFloat(last, 'f', -1, 64)))
	}
	firstOut := true
	for i := 0; ; i++ {
		v := first + float64(i)*inc
		if inc > 0 && v > last || inc < 0 && v < last {
			break
		}
		if i%4096 == 0 && c.ctx.Err() != nil {
			return 137
		}
		if !firstOut {
			w.WriteString(sep)
		}
		firstOut = false
		if isInt {
			fmt.Fprintf(w, "%0*d", wd, int64(v))
		} else {
			w.WriteString(strconv.FormatFloat(v, 'f', -1, 64))
		}
		if w.Buffered() > 32<<10 {
			if err := w.Flush(); err != nil {
				return c.ioErr(err)
			}
		}
	}
	if !firstOut {
		w.WriteString("\n")
	}
	if err := w.Flush(); err != nil {
		return c.ioErr(err)
	}
	return 0
}

func cmdBasename(c *cmd) int {
	if len(c.args) < 2 {
		return c.errf("missing operand")
	}
	b := path.Base(c.args[1])
	if len(c.args) > 2 && b != c.args[2] {
		b = strings.TrimSuffix(b, c.args[2])
	}
	fmt.Fprintln(c.stdout, b)
	return 0
}

func cmdDirname(c *cmd) int {
	if len(c.args) < 2 {
		return c.errf("missing operand")
	}
	for _, a := range c.args[1:] {
		fmt.Fprintln(c.stdout, path.Dir(a))
	}
	return 0
}

func cmdTee(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if f.bools['a'] {
		flag = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	ws := []io.Writer{c.stdout}
	code := 0
	for _, n := range f.args {
		h, err := c.fs().OpenFile(c.abs(n), flag, 0o644)
		if err != nil {
			code = c.errf("%s: %s", n, errText(err))
			continue
		}
		defer h.Close()
		ws = append(ws, h)
	}
	if _, err := copyBuf(io.MultiWriter(ws...), c.stdin); err != nil {
		return c.ioErr(err)
	}
	return code
}

func cmdLn(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	if len(f.args) != 2 {
		return c.errf("expected TARGET and LINK_NAME")
	}
	link := c.abs(f.args[1])
	if fi, err := c.fs().Stat(link); err == nil && fi.IsDir() {
		link = path.Join(link, path.Base(f.args[0]))
	}
	if f.bools['f'] {
		c.fs().Remove(link)
	}
	if f.bools['s'] {
		err = c.fs().Symlink(f.args[0], link)
	} else {
		err = c.copyTree(c.abs(f.args[0]), link, false) // hard links are copies here
	}
	if err != nil {
		return c.errf("failed to create link '%s': %s", f.args[1], errText(err))
	}
	return 0
}

func cmdChmod(c *cmd) int {
	args := c.args[1:]
	for len(args) > 0 && (args[0] == "-R" || args[0] == "-f" || args[0] == "-v") {
		args = args[1:]
	}
	if len(args) < 2 {
		return c.errf("missing operand")
	}
	mode := args[0]
	code := 0
	for _, n := range args[1:] {
		p := c.abs(n)
		fi, err := c.fs().Stat(p)
		if err != nil {
			code = c.errf("cannot access '%s': %s", n, errText(err))
			continue
		}
		perm, ok := applyMode(fi.Mode().Perm(), mode)
		if !ok {
			return c.errf("invalid mode: '%s'", mode)
		}
		c.fs().Chmod(p, perm)
	}
	return code
}

func applyMode(cur fs.FileMode, spec string) (fs.FileMode, bool) {
	if v, err := strconv.ParseUint(spec, 8, 32); err == nil {
		return fs.FileMode(v) & fs.ModePerm, true
	}
	for _, clause := range strings.Split(spec, ",") {
		i := strings.IndexAny(clause, "+-=")
		if i < 0 {
			return cur, false
		}
		who, op, perms := clause[:i], clause[i], clause[i+1:]
		if who == "" || who == "a" {
			who = "ugo"
		}
		var bits fs.FileMode
		for _, w := range who {
			shift := map[rune]uint{'u': 6, 'g': 3, 'o': 0}[w]
			for _, p := range perms {
				switch p {
				case 'r':
					bits |= 4 << shift
				case 'w':
					bits |= 2 << shift
				case 'x':
					bits |= 1 << shift
				}
			}
		}
		switch op {
		case '+':
			cur |= bits
		case '-':
			cur &^= bits
		case '=':
			cur = bits
		}
	}
	return cur, true
}

func cmdDate(c *cmd) int {
	now := time.Now().UTC()
	for _, a := range c.args[1:] {
		if strings.HasPrefix(a, "+") {
			fmt.Fprintln(c.stdout, strftime(now, a[1:]))
			return 0
		}
	}
	fmt.Fprintln(c.stdout, now.Format("Mon Jan _2 15:04:05 UTC 2006"))
	return 0
}

func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			b.WriteString(t.Format("2006"))
		case 'm':
			b.WriteString(t.Format("01"))
		case 'd':
			b.WriteString(t.Format("02"))
		case 'H':
			b.WriteString(t.Format("15"))
		case 'M':
			b.WriteString(t.Format("04"))
		case 'S':
			b.WriteString(t.Format("05"))
		case 's':
			b.WriteString(strconv.FormatInt(t.Unix(), 10))
		case 'N':
			fmt.Fprintf(&b, "%09d", t.Nanosecond())
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case 'a':
			b.WriteString(t.Format("Mon"))
		case 'b':
			b.WriteString(t.Format("Jan"))
		case 'Z':
			b.WriteString("UTC")
		case 'z':
			b.WriteString("+0000")
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

func (c *cmd) resolve(p string) (string, error) {
	cur := "/"
	comps := strings.Split(c.abs(p), "/")
	for hops := 0; len(comps) > 0; {
		comp := comps[0]
		comps = comps[1:]
		if comp == "" || comp == "." {
			continue
		}
		if comp == ".." {
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, comp)
		t, err := c.fs().Readlink(next)
		if err != nil {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", syscall.ELOOP
		}
		if !path.IsAbs(t) {
			t = path.Join(cur, t)
		}
		comps = append(strings.Split(t, "/"), comps...)
		cur = "/"
	}
	return cur, nil
}

func cmdReadlink(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	code := 0
	for _, n := range f.args {
		if f.bools['f'] || f.bools['e'] || f.bools['m'] {
			r, err := c.resolve(n)
			if err != nil {
				code = 1
				continue
			}
			fmt.Fprintln(c.stdout, r)
			continue
		}
		t, err := c.fs().Readlink(c.abs(n))
		if err != nil {
			code = 1
			continue
		}
		fmt.Fprintln(c.stdout, t)
	}
	return code
}

func cmdRealpath(c *cmd) int {
	code := 0
	for _, n := range c.args[1:] {
		if strings.HasPrefix(n, "-") {
			continue
		}
		r, err := c.resolve(n)
		if err == nil {
			_, err = c.fs().Stat(r)
		}
		if err != nil {
			code = c.errf("%s: %s", n, errText(err))
			continue
		}
		fmt.Fprintln(c.stdout, r)
	}
	return code
}

func cmdUname(c *cmd) int {
	if len(c.args) > 1 && (c.args[1] == "-a" || c.args[1] == "--all") {
		fmt.Fprintln(c.stdout, "WASI sandbox 1.0 rollbox wasm32 WASI")
		return 0
	}
	if len(c.args) > 1 && c.args[1] == "-m" {
		fmt.Fprintln(c.stdout, "wasm32")
		return 0
	}
	fmt.Fprintln(c.stdout, "WASI")
	return 0
}

func cmdRev(c *cmd) int {
	return c.inputs(c.args[1:], func(_ string, r io.Reader) error {
		return eachLine(r, func(line []byte) error {
			nl := bytes.HasSuffix(line, []byte("\n"))
			rs := []rune(strings.TrimSuffix(string(line), "\n"))
			for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
				rs[i], rs[j] = rs[j], rs[i]
			}
			s := string(rs)
			if nl {
				s += "\n"
			}
			_, err := io.WriteString(c.stdout, s)
			return err
		})
	})
}

func cmdTac(c *cmd) int {
	var all [][]byte
	var held int64
	code := c.inputs(c.args[1:], func(_ string, r io.Reader) error {
		return eachLine(r, func(line []byte) error {
			if held += int64(len(line)); held > c.s.g.limits.MemoryBytes {
				return c.s.g.outOfMemory("tac: input larger than the memory limit")
			}
			all = append(all, append([]byte(nil), line...))
			return nil
		})
	})
	for i := len(all) - 1; i >= 0; i-- {
		l := all[i]
		if !bytes.HasSuffix(l, []byte("\n")) {
			l = append(l, '\n')
		}
		c.stdout.Write(l)
	}
	return code
}

func cmdNl(c *cmd) int {
	n := 0
	return c.inputs(c.args[1:], func(_ string, r io.Reader) error {
		return eachLine(r, func(line []byte) error {
			if len(bytes.TrimSpace(line)) == 0 {
				_, err := c.stdout.Write(line)
				return err
			}
			n++
			_, err := fmt.Fprintf(c.stdout, "%6d\t%s", n, line)
			return err
		})
	})
}

func cmdTimeout(c *cmd) int {
	args := c.args[1:]
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		if args[0] == "-s" || args[0] == "-k" {
			args = args[1:]
		}
		args = args[1:]
	}
	if len(args) < 2 {
		return c.errf("missing operand")
	}
	d, err := time.ParseDuration(args[0])
	if err != nil {
		v, err2 := strconv.ParseFloat(args[0], 64)
		if err2 != nil {
			return c.errf("invalid time interval '%s'", args[0])
		}
		d = time.Duration(v * float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(c.ctx, d)
	defer cancel()
	code := c.sub(ctx, args[1:], nil, nil)
	if ctx.Err() != nil && c.ctx.Err() == nil {
		return 124
	}
	return code
}

func cmdStat(c *cmd) int {
	code := 0
	for _, n := range c.args[1:] {
		if strings.HasPrefix(n, "-") {
			continue
		}
		fi, err := c.fs().Lstat(c.abs(n))
		if err != nil {
			code = c.errf("cannot stat '%s': %s", n, errText(err))
			continue
		}
		fmt.Fprintf(c.stdout, "  File: %s\n  Size: %d\n  Mode: %s\nModify: %s\n", n, fi.Size(), fi.Mode(), fi.ModTime().UTC().Format(time.RFC3339))
	}
	return code
}

func cmdDu(c *cmd) int {
	f, _ := parseFlags(c.args[1:], "d")
	names := f.args
	if len(names) == 0 {
		names = []string{"."}
	}
	for _, n := range names {
		var total int64
		var walk func(p string)
		walk = func(p string) {
			fi, err := c.fs().Lstat(p)
			if err != nil {
				return
			}
			total += fi.Size()
			if fi.IsDir() {
				ents, _ := c.fs().ReadDir(p)
				for _, e := range ents {
					walk(path.Join(p, e.Name()))
				}
			}
		}
		walk(c.abs(n))
		if f.bools['h'] {
			fmt.Fprintf(c.stdout, "%dK\t%s\n", (total+1023)/1024, n)
		} else {
			fmt.Fprintf(c.stdout, "%d\t%s\n", (total+1023)/1024, n)
		}
	}
	return 0
}

func cmdPaste(c *cmd) int {
	f, err := parseFlags(c.args[1:], "d")
	if err != nil {
		return c.errf("%v", err)
	}
	delim := "\t"
	if d, ok := f.values['d']; ok {
		delim = d
	}
	if f.bools['s'] {
		return c.inputs(f.args, func(_ string, r io.Reader) error {
			var parts []string
			eachLine(r, func(line []byte) error {
				parts = append(parts, strings.TrimSuffix(string(line), "\n"))
				return nil
			})
			_, err := fmt.Fprintln(c.stdout, strings.Join(parts, delim))
			return err
		})
	}
	var cols [][]string
	code := c.inputs(f.args, func(_ string, r io.Reader) error {
		var col []string
		eachLine(r, func(line []byte) error {
			col = append(col, strings.TrimSuffix(string(line), "\n"))
			return nil
		})
		cols = append(cols, col)
		return nil
	})
	rows := 0
	for _, col := range cols {
		rows = max(rows, len(col))
	}
	for i := range rows {
		var parts []string
		for _, col := range cols {
			if i < len(col) {
				parts = append(parts, col[i])
			} else {
				parts = append(parts, "")
			}
		}
		fmt.Fprintln(c.stdout, strings.Join(parts, delim))
	}
	return code
}
