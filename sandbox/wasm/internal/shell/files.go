package shell

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"
)

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
	in, err := c.fs().OpenFile(src, os.O_RDONLY, 0)
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

func matchAny(globs []string, name string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}

// walk visits dir's tree depth-first in name order (not following links).
func (c *cmd) walk(dir string, fn func(p string, fi fs.FileInfo)) {
	fi, err := c.fs().Lstat(c.abs(dir))
	if err != nil {
		return
	}
	fn(dir, fi)
	if !fi.IsDir() {
		return
	}
	ents, err := c.fs().ReadDir(c.abs(dir))
	if err != nil {
		return
	}
	for _, e := range ents {
		c.walk(path.Join(dir, e.Name()), fn)
	}
}

func cmdFind(c *cmd) int {
	args := c.args[1:]
	var roots []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") && args[0] != "!" && args[0] != "(" {
		roots = append(roots, args[0])
		args = args[1:]
	}
	if len(roots) == 0 {
		roots = []string{"."}
	}
	type pred func(p string, fi fs.FileInfo, depth int) bool
	var preds []pred
	maxDepth, minDepth := -1, 0
	var execArgs []string
	del := false
	for i := 0; i < len(args); i++ {
		neg := false
		if args[i] == "!" || args[i] == "-not" {
			neg = true
			i++
			if i >= len(args) {
				break
			}
		}
		var p pred
		val := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch args[i] {
		case "-name", "-iname":
			icase := args[i] == "-iname"
			g := val()
			p = func(pth string, _ fs.FileInfo, _ int) bool {
				b := path.Base(pth)
				if icase {
					ok, _ := path.Match(strings.ToLower(g), strings.ToLower(b))
					return ok
				}
				ok, _ := path.Match(g, b)
				return ok
			}
		case "-path", "-wholename":
			g := val()
			p = func(pth string, _ fs.FileInfo, _ int) bool { ok, _ := path.Match(g, pth); return ok }
		case "-type":
			t := val()
			p = func(_ string, fi fs.FileInfo, _ int) bool {
				switch t {
				case "f":
					return fi.Mode().IsRegular()
				case "d":
					return fi.IsDir()
				case "l":
					return fi.Mode()&fs.ModeSymlink != 0
				}
				return false
			}
		case "-maxdepth":
			maxDepth, _ = strconv.Atoi(val())
		case "-mindepth":
			minDepth, _ = strconv.Atoi(val())
		case "-empty":
			p = func(pth string, fi fs.FileInfo, _ int) bool {
				if fi.IsDir() {
					ents, _ := c.fs().ReadDir(c.abs(pth))
					return len(ents) == 0
				}
				return fi.Size() == 0
			}
		case "-print", "-a", "-and":
		case "-delete":
			del = true
		case "-exec":
			for i++; i < len(args) && args[i] != ";" && args[i] != "+"; i++ {
				execArgs = append(execArgs, args[i])
			}
		default:
			fmt.Fprintf(c.stderr, "find: unknown predicate '%s'\n", args[i])
			return 1
		}
		if p != nil {
			if neg {
				inner := p
				p = func(a string, b fs.FileInfo, d int) bool { return !inner(a, b, d) }
			}
			preds = append(preds, p)
		}
	}
	code := 0
	var matches []string
	for _, root := range roots {
		var visit func(p string, depth int)
		visit = func(p string, depth int) {
			fi, err := c.fs().Lstat(c.abs(p))
			if err != nil {
				fmt.Fprintf(c.stderr, "find: '%s': %s\n", p, errText(err))
				code = 1
				return
			}
			ok := depth >= minDepth
			for _, pr := range preds {
				if !ok {
					break
				}
				ok = pr(p, fi, depth)
			}
			if ok {
				matches = append(matches, p)
			}
			if fi.IsDir() && (maxDepth < 0 || depth < maxDepth) {
				ents, _ := c.fs().ReadDir(c.abs(p))
				for _, e := range ents {
					visit(path.Join(p, e.Name()), depth+1)
				}
			}
		}
		visit(root, 0)
	}
	for _, m := range matches {
		switch {
		case del:
			c.fs().RemoveAll(c.abs(m))
		case len(execArgs) > 0:
			argv := make([]string, len(execArgs))
			for i, a := range execArgs {
				argv[i] = strings.ReplaceAll(a, "{}", m)
			}
			if st := c.sub(c.ctx, argv, nil, nil); st != 0 {
				code = 1
			}
		default:
			fmt.Fprintln(c.stdout, m)
		}
	}
	return code
}
