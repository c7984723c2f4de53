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
	"slices"
	"strings"
	"syscall"

	"mvdan.cc/sh/v3/expand"
)

// cmd is one command's invocation: a process, as far as the command can
// tell. It sees the exported variables (env), never the shell's.
type cmd struct {
	ctx    context.Context
	sh     *shell // the shell that started it
	s      *session
	args   []string
	dir    string
	env    expand.Environ
	extra  []string // KEY=VALUE added by env(1)
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// held is what the command charged to the memory budget; released
	// when it ends.
	held int64
}

type builtin func(c *cmd) int

// commandNamed returns the Go builtin command called name (nil if none).
// A switch rather than a map filled at init: builtins that run commands
// (xargs, env, timeout, find -exec) refer back to it.
func commandNamed(name string) builtin {
	switch name {
	case "cat":
		return cmdCat
	case "ls":
		return cmdLs
	case "grep", "egrep", "fgrep":
		return cmdGrep
	case "head":
		return cmdHead
	case "tail":
		return cmdTail
	case "wc":
		return cmdWc
	case "sed":
		return cmdSed
	case "sort":
		return cmdSort
	case "uniq":
		return cmdUniq
	case "mkdir":
		return cmdMkdir
	case "rmdir":
		return cmdRmdir
	case "rm":
		return cmdRm
	case "cp":
		return cmdCp
	case "mv":
		return cmdMv
	case "touch":
		return cmdTouch
	case "find":
		return cmdFind
	case "diff":
		return cmdDiff
	case "sleep":
		return cmdSleep
	case "yes":
		return cmdYes
	case "env":
		return cmdEnv
	case "printenv":
		return cmdPrintenv
	case "seq":
		return cmdSeq
	case "tr":
		return cmdTr
	case "cut":
		return cmdCut
	case "xargs":
		return cmdXargs
	case "basename":
		return cmdBasename
	case "dirname":
		return cmdDirname
	case "tee":
		return cmdTee
	case "ln":
		return cmdLn
	case "chmod":
		return cmdChmod
	case "date":
		return cmdDate
	case "readlink":
		return cmdReadlink
	case "realpath":
		return cmdRealpath
	case "nproc":
		return cmdConst("1\n")
	case "uname":
		return cmdUname
	case "whoami":
		return cmdConst(sandboxUser + "\n")
	case "id":
		return cmdConst("uid=1000(user) gid=1000(user) groups=1000(user)\n")
	case "hostname":
		return cmdConst(sandboxHost + "\n")
	case "rev":
		return cmdRev
	case "tac":
		return cmdTac
	case "nl":
		return cmdNl
	case "md5sum":
		return cmdSum("md5")
	case "sha1sum":
		return cmdSum("sha1")
	case "sha256sum":
		return cmdSum("sha256")
	case "base64":
		return cmdBase64
	case "timeout":
		return cmdTimeout
	case "sh", "bash":
		return cmdSh
	case "stat":
		return cmdStat
	case "du":
		return cmdDu
	case "expr":
		return cmdExpr
	case "paste":
		return cmdPaste
	case "which":
		return cmdWhich
	case "df":
		return cmdDf
	case "ps":
		return cmdPs
	}
	return nil
}

// commandNames are the Go builtin commands, for documentation and tests.
var commandNames = []string{"base64", "basename", "bash", "cat", "chmod", "cp", "cut", "date", "df", "diff",
	"dirname", "du", "egrep", "env", "expr", "fgrep", "find", "grep", "head", "hostname", "id", "ln", "ls",
	"md5sum", "mkdir", "mv", "nl", "nproc", "paste", "printenv", "ps", "readlink", "realpath", "rev", "rm",
	"rmdir", "sed", "seq", "sh", "sha1sum", "sha256sum", "sleep", "sort", "stat", "tac", "tail", "tee",
	"timeout", "touch", "tr", "uname", "uniq", "wc", "which", "whoami", "xargs", "yes", "head"}

// Names lists the commands the shell provides (its own builtins and the Go
// builtin commands), for documentation and tests.
func Names() []string {
	out := slices.Clone(commandNames)
	for _, n := range shellBuiltinNames {
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (c *cmd) errf(format string, args ...any) int {
	fmt.Fprintf(c.stderr, c.args[0]+": "+format+"\n", args...)
	return 1
}

func (c *cmd) abs(p string) string { return abs(c.dir, p) }
func (c *cmd) fs() FS              { return c.s.cfg.FS }

// abs resolves p against dir in the episode's namespace.
func abs(dir, p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(dir, p)
}

// hold charges n bytes the command is about to keep; they are released
// when it ends.
func (c *cmd) hold(n int64, what string) error {
	if err := c.s.mem.charge(n, c.args[0]+": "+what); err != nil {
		return err
	}
	c.held += n
	return nil
}

func (c *cmd) unhold(n int64) {
	n = min(n, c.held)
	c.s.mem.release(n)
	c.held -= n
}

// dispatch runs c.args: a Go builtin, a program the ProgramRunner knows, or
// a script in the episode filesystem.
func (c *cmd) dispatch() int {
	defer func() { c.unhold(c.held) }()
	name := c.args[0]
	if b := commandNamed(name); b != nil {
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
	if p := c.pathLookup(name); p != "" {
		c.args[0] = p
		return c.runPath()
	}
	fmt.Fprintf(c.stderr, "sh: %s: command not found\n", name)
	return exitNotFound
}

// pathLookup finds an executable script named by PATH inside the episode.
func (c *cmd) pathLookup(name string) string {
	for _, d := range strings.Split(c.env.Get("PATH").String(), ":") {
		if d == "" {
			continue
		}
		p := path.Join(d, name)
		if fi, err := c.fs().Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// which is what which(1) and command -v say of a command name.
func (c *cmd) which(n string) string {
	switch {
	case commandNamed(n) != nil:
		return "/bin/" + n
	case strings.Contains(n, "/"):
		if fi, err := c.fs().Stat(c.abs(n)); err == nil && !fi.IsDir() {
			return c.abs(n)
		}
		return ""
	}
	if c.s.cfg.Program != nil {
		if _, ok := c.s.cfg.Program.Lookup(c.fs(), c.dir, n); ok {
			return "/usr/bin/" + n
		}
	}
	return c.pathLookup(n)
}

func cmdWhich(c *cmd) int {
	code := 0
	for _, n := range c.args[1:] {
		if strings.HasPrefix(n, "-") {
			continue
		}
		p := c.which(n)
		if p == "" {
			code = 1
			continue
		}
		fmt.Fprintln(c.stdout, p)
	}
	return code
}

// environ lists the command's environment as KEY=VALUE, sorted.
func (c *cmd) environ() []string {
	m := map[string]string{}
	c.env.Each(func(name string, vr expand.Variable) bool {
		if vr.IsSet() && vr.Exported && vr.Kind == expand.String {
			m[name] = vr.Str
		}
		return true
	})
	for _, kv := range c.extra {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

func (c *cmd) runProgram(prog string) int {
	code, err := c.s.cfg.Program.Run(c.ctx, Proc{Args: append([]string{prog}, c.args[1:]...), Dir: c.dir,
		Env: c.environ(), Stdin: c.stdin, Stdout: c.stdout, Stderr: c.stderr})
	if err != nil {
		if c.ctx.Err() != nil {
			return exitKilled
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
	f, err := c.fs().OpenFile(p, os.O_RDONLY, 0)
	if err != nil {
		return c.errf("%s", pathErrText(err))
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

// interpreterOf reads a script's shebang: the program that runs it.
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

// sub runs args as a command of its own (xargs, env, timeout, find -exec).
func (c *cmd) sub(ctx context.Context, args []string, stdin io.Reader, extra []string) int {
	if stdin == nil {
		stdin = c.stdin
	}
	env := c.environ()
	if len(extra) > 0 {
		c2 := *c
		c2.extra = append(append([]string(nil), c.extra...), extra...)
		env = c2.environ()
	}
	return c.s.runArgv(ctx, c, args, env, stdin, c.stdout, c.stderr)
}

// cmdSh is sh and bash: -c SCRIPT [NAME [ARGS]], FILE [ARGS], or a script
// on stdin. It is a new shell: the caller's exported variables only.
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
		if strings.Trim(a[1:], "eux") == "" || a == "-s" {
			if a != "-s" {
				flags = append(flags, a)
			}
			continue
		}
		if a == "--norc" || a == "--noprofile" || a == "-l" || a == "--login" || a == "-i" {
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
			data, err := c.readFile(name)
			if err != nil {
				fmt.Fprintf(c.stderr, "sh: %s: %s\n", name, pathErrText(err))
				if errors.Is(err, ErrOOM) {
					return exitKilled
				}
				return exitNotFound
			}
			script, args = string(data), args[1:]
		} else {
			data, err := c.readAll(c.stdin)
			if err != nil {
				return exitKilled
			}
			script, name = string(data), "sh"
		}
	}
	m := map[string]string{}
	for _, kv := range c.environ() {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	sh, err := newShell(c.s, m, c.dir)
	if err != nil {
		return exitKilled
	}
	defer sh.vars.drop()
	if c.sh != nil {
		sh.depth = c.sh.depth + 1
	}
	if sh.depth > c.s.cfg.Limits.Depth {
		c.s.mem.fail("%v", errNesting)
		return exitKilled
	}
	sh.arg0 = name
	if haveScript {
		sh.flagC = "c"
	}
	sh.params = append([]string(nil), args...)
	sh.fds.set(0, &fdEnt{r: newSharedReader(c.stdin)})
	sh.fds.set(1, &fdEnt{w: c.stdout})
	sh.fds.set(2, &fdEnt{w: c.stderr})
	if len(flags) > 0 {
		if code := bSet(c.ctx, sh, append([]string{"set"}, flags...)); code != 0 {
			return code
		}
	}
	f, err := sh.parse(script, name)
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: %v\n", name, err)
		return sh.parseStatus(err)
	}
	sh.runMain(c.ctx, f.Stmts)
	return sh.exit
}

// readAll reads r whole, charging it to the memory budget.
func (c *cmd) readAll(r io.Reader) ([]byte, error) {
	var buf bytes.Buffer
	chunk := make([]byte, 64<<10)
	for {
		n, err := r.Read(chunk)
		if n > 0 {
			if herr := c.hold(int64(n), "input"); herr != nil {
				return nil, herr
			}
			buf.Write(chunk[:n])
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return buf.Bytes(), nil
			}
			return buf.Bytes(), err
		}
		if err := c.ctx.Err(); err != nil {
			return nil, context.Cause(c.ctx)
		}
	}
}

// open opens a file operand for reading: "-" is stdin, /dev/stdin and
// /dev/fd/N are the shell's descriptors and process substitutions.
func (c *cmd) open(name string) (io.ReadCloser, error) {
	if name == "-" {
		return io.NopCloser(c.stdin), nil
	}
	if c.sh != nil {
		if e, ok := c.sh.special(name, os.O_RDONLY); ok {
			if e == nil || e.r == nil {
				return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
			}
			if e.procSubst {
				return struct {
					io.Reader
					io.Closer
				}{e.r, e.c}, nil
			}
			return io.NopCloser(e.r), nil
		}
	}
	// A directory opens, and its first read fails with EISDIR.
	return c.fs().OpenFile(c.abs(name), os.O_RDONLY, 0)
}

// readFile reads a file operand whole, charged.
func (c *cmd) readFile(name string) ([]byte, error) {
	f, err := c.open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return c.readAll(f)
}

// inputs opens each operand (or stdin when there are none, or for "-").
func (c *cmd) inputs(names []string, each func(name string, r io.Reader) error) int {
	if len(names) == 0 {
		names = []string{"-"}
	}
	code := 0
	for _, n := range names {
		f, err := c.open(n)
		if err != nil {
			c.errf("%s: %s", n, pathErrText(err))
			code = 1
			continue
		}
		err = each(n, f)
		f.Close()
		if errors.Is(err, syscall.EISDIR) {
			c.errf("%s: Is a directory", n)
			code = 1
			continue
		}
		if err != nil {
			return c.ioErr(err)
		}
	}
	return code
}

// ioErr turns a write or read error into a status: a closed pipe ends the
// command quietly, like SIGPIPE would.
func (c *cmd) ioErr(err error) int {
	if isEPIPE(err) {
		return 141
	}
	if errors.Is(err, ErrOOM) || c.ctx.Err() != nil {
		return exitKilled
	}
	c.errf("%s", errText(err))
	return 1
}

func isEPIPE(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrClosedPipe) || errors.Is(err, fs.ErrClosed)
}

// eachLine calls fn with every line of r (the newline kept), charging a
// line longer than the read buffer while it is gathered.
func (c *cmd) eachLine(r io.Reader, fn func(line []byte) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		var held int64
		if errors.Is(err, bufio.ErrBufferFull) {
			buf := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				if herr := c.hold(int64(len(line)), "a line"); herr != nil {
					c.unhold(held)
					return herr
				}
				held += int64(len(line))
				line, err = br.ReadSlice('\n')
				buf = append(buf, line...)
			}
			line = buf
		}
		if len(line) > 0 {
			if ferr := fn(line); ferr != nil {
				c.unhold(held)
				return ferr
			}
		}
		c.unhold(held)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func cmdConst(s string) builtin {
	return func(c *cmd) int {
		io.WriteString(c.stdout, s)
		return 0
	}
}

// realpath resolves every symlink of p in the episode's filesystem (never
// the host's), clamping .. at the root.
func realpath(fsys FS, p string) (string, error) {
	cur := "/"
	comps := strings.Split(p, "/")
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
		fi, err := fsys.Lstat(next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		t, err := fsys.Readlink(next)
		if err != nil {
			return "", err
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

func cmdDf(c *cmd) int {
	used, limit := c.fs().Usage()
	fmt.Fprintf(c.stdout, "Filesystem     1K-blocks  Used Available Use%% Mounted on\nepisode        %9d %5d %9d %3d%% /\n",
		limit>>10, used>>10, (limit-used)>>10, used*100/max(limit, 1))
	return 0
}

func cmdPs(c *cmd) int {
	fmt.Fprintf(c.stdout, "  PID TTY          TIME CMD\n%5d ?        00:00:00 sh\n", sandboxPID)
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
