package shell

import (
	"bufio"
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// breToRE translates a POSIX basic regular expression to Go's syntax: in a
// BRE, \( \) \{ \} \| \+ \? are operators and their bare forms literals.
func breToRE(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch == '\\' && i+1 < len(s) {
			n := s[i+1]
			i++
			switch n {
			case '(', ')', '{', '}', '|', '+', '?':
				b.WriteByte(n)
			default:
				b.WriteByte('\\')
				b.WriteByte(n)
			}
			continue
		}
		switch ch {
		case '(', ')', '{', '}', '|', '+', '?':
			b.WriteByte('\\')
			b.WriteByte(ch)
		case '*':
			if i == 0 || s[i-1] == '^' && i == 1 {
				b.WriteString(`\*`)
			} else {
				b.WriteByte('*')
			}
		default:
			b.WriteByte(ch)
		}
	}
	return b.String()
}

func compileRE(pat string, extended, fixed, icase, word, line bool) (*regexp.Regexp, error) {
	switch {
	case fixed:
		pat = regexp.QuoteMeta(pat)
	case !extended:
		pat = breToRE(pat)
	}
	if word {
		pat = `\b(?:` + pat + `)\b`
	}
	if line {
		pat = `^(?:` + pat + `)$`
	}
	if icase {
		pat = "(?i)" + pat
	}
	return regexp.Compile(pat)
}

func cmdGrep(c *cmd) int {
	args := c.args[1:]
	var pats []string
	var rest []string
	bools := map[byte]bool{}
	includes := []string{}
	switch c.args[0] {
	case "egrep":
		bools['E'] = true
	case "fgrep":
		bools['F'] = true
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			rest = append(rest, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(a, "--include="):
			includes = append(includes, strings.TrimPrefix(a, "--include="))
		case a == "--color" || strings.HasPrefix(a, "--color=") || a == "--line-buffered":
		case a == "-e" && i+1 < len(args):
			pats = append(pats, args[i+1])
			i++
		case len(a) > 1 && a[0] == '-' && a != "-":
			for j := 1; j < len(a); j++ {
				if a[j] == 'e' {
					v := a[j+1:]
					if v == "" && i+1 < len(args) {
						i++
						v = args[i]
					}
					pats = append(pats, v)
					break
				}
				if a[j] == 'm' || a[j] == 'A' || a[j] == 'B' || a[j] == 'C' {
					if a[j+1:] == "" {
						i++
					}
					break
				}
				bools[a[j]] = true
			}
		default:
			rest = append(rest, a)
		}
	}
	if len(pats) == 0 {
		if len(rest) == 0 {
			fmt.Fprintln(c.stderr, "usage: grep [OPTION]... PATTERNS [FILE]...")
			return 2
		}
		pats, rest = []string{rest[0]}, rest[1:]
	}
	var res []*regexp.Regexp
	for _, p := range pats {
		for _, pp := range strings.Split(p, "\n") {
			re, err := compileRE(pp, bools['E'] || bools['P'], bools['F'], bools['i'], bools['w'], bools['x'])
			if err != nil {
				fmt.Fprintf(c.stderr, "grep: %v\n", err)
				return 2
			}
			res = append(res, re)
		}
	}
	recursive := bools['r'] || bools['R']
	if recursive && len(rest) == 0 {
		rest = []string{"."}
	}
	var files []string
	code := 0
	for _, n := range rest {
		if !recursive {
			files = append(files, n)
			continue
		}
		fi, err := c.fs().Stat(c.abs(n))
		if err != nil {
			fmt.Fprintf(c.stderr, "grep: %s: %s\n", n, errText(err))
			code = 2
			continue
		}
		if !fi.IsDir() {
			files = append(files, n)
			continue
		}
		c.walk(n, func(p string, fi fs.FileInfo) {
			if fi.Mode().IsRegular() && (len(includes) == 0 || matchAny(includes, path.Base(p))) {
				files = append(files, p)
			}
		})
	}
	showName := (len(files) > 1 || recursive) && !bools['h'] || bools['H']
	matched := false
	w := bufio.NewWriter(c.stdout)
	defer w.Flush()
	match := func(line []byte) bool {
		for _, re := range res {
			if re.Match(line) {
				return true
			}
		}
		return false
	}
	errDone := errors.New("done")
	status := c.inputs(files, func(name string, r io.Reader) error {
		if name == "-" {
			name = "(standard input)"
		}
		count := 0
		lineNo := 0
		err := eachLine(r, func(raw []byte) error {
			lineNo++
			line := bytes.TrimSuffix(raw, []byte("\n"))
			if match(line) == bools['v'] {
				return nil
			}
			matched = true
			count++
			if bools['q'] {
				return errDone
			}
			if bools['l'] {
				fmt.Fprintln(w, name)
				return errDone
			}
			if bools['c'] {
				return nil
			}
			prefix := ""
			if showName {
				prefix = name + ":"
			}
			if bools['n'] {
				prefix += strconv.Itoa(lineNo) + ":"
			}
			if bools['o'] && !bools['v'] {
				for _, re := range res {
					for _, m := range re.FindAll(line, -1) {
						fmt.Fprintf(w, "%s%s\n", prefix, m)
					}
				}
				return nil
			}
			w.WriteString(prefix)
			w.Write(line)
			w.WriteByte('\n')
			if w.Buffered() > 32<<10 {
				return w.Flush()
			}
			return nil
		})
		if bools['c'] {
			if showName {
				fmt.Fprintf(w, "%s:%d\n", name, count)
			} else {
				fmt.Fprintf(w, "%d\n", count)
			}
		}
		if err == errDone && !bools['q'] {
			return nil
		}
		return err
	})
	if bools['q'] && matched {
		return 0
	}
	if status != 0 && status != 1 {
		return status
	}
	if status == 1 || code != 0 {
		if bools['s'] && matched {
			return 0
		}
		return 2
	}
	if !matched {
		return 1
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

func cmdDiff(c *cmd) int {
	f, err := parseFlags(c.args[1:], "U")
	if err != nil {
		return c.errf("%v", err)
	}
	if len(f.args) != 2 {
		fmt.Fprintln(c.stderr, "diff: expected two files")
		return 2
	}
	read := func(n string) ([]string, error) {
		var data []byte
		var err error
		if n == "-" {
			data, err = readAllCapped(c, c.stdin)
		} else {
			data, err = c.fs().ReadFile(c.abs(n), c.s.g.limits.MemoryBytes/4)
		}
		if err != nil {
			return nil, err
		}
		s := string(data)
		if s == "" {
			return nil, nil
		}
		lines := strings.SplitAfter(s, "\n")
		if lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		return lines, nil
	}
	a, err := read(f.args[0])
	if err != nil {
		fmt.Fprintf(c.stderr, "diff: %s: %s\n", f.args[0], errText(err))
		return 2
	}
	b, err := read(f.args[1])
	if err != nil {
		fmt.Fprintf(c.stderr, "diff: %s: %s\n", f.args[1], errText(err))
		return 2
	}
	if int64(len(a))*int64(len(b)) > 25_000_000 {
		fmt.Fprintln(c.stderr, "diff: files too large to compare in this shell")
		return 2
	}
	ops := lcsDiff(a, b)
	same := true
	for _, o := range ops {
		if o.kind != ' ' {
			same = false
		}
	}
	if same {
		return 0
	}
	if f.bools['q'] {
		fmt.Fprintf(c.stdout, "Files %s and %s differ\n", f.args[0], f.args[1])
		return 1
	}
	w := bufio.NewWriter(c.stdout)
	defer w.Flush()
	if f.bools['u'] || f.values['U'] != "" {
		ctxLines := 3
		if v, ok := f.values['U']; ok {
			ctxLines, _ = strconv.Atoi(v)
		}
		fmt.Fprintf(w, "--- %s\n+++ %s\n", f.args[0], f.args[1])
		writeUnified(w, ops, ctxLines)
		return 1
	}
	writeNormal(w, ops)
	return 1
}

type diffOp struct {
	kind byte // ' ', '-', '+'
	text string
	ai   int // line index in a (for ' ' and '-')
	bi   int // line index in b (for ' ' and '+')
}

func lcsDiff(a, b []string) []diffOp {
	n, m := len(a), len(b)
	dp := make([][]int32, n+1)
	for i := range dp {
		dp[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				dp[i][j] = dp[i+1][j+1] + 1
			} else {
				dp[i][j] = max(dp[i+1][j], dp[i][j+1])
			}
		}
	}
	var ops []diffOp
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			ops = append(ops, diffOp{' ', a[i], i, j})
			i++
			j++
		case i < n && (j == m || dp[i+1][j] >= dp[i][j+1]):
			ops = append(ops, diffOp{'-', a[i], i, j})
			i++
		default:
			ops = append(ops, diffOp{'+', b[j], i, j})
			j++
		}
	}
	return ops
}

func nl(s string) string {
	if strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n\\ No newline at end of file\n"
}

func writeUnified(w io.Writer, ops []diffOp, ctx int) {
	for i := 0; i < len(ops); {
		if ops[i].kind == ' ' {
			i++
			continue
		}
		start := max(0, i-ctx)
		end := i
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := end
			for run < len(ops) && ops[run].kind == ' ' {
				run++
			}
			if run == len(ops) || run-end > 2*ctx {
				end = min(end+ctx, len(ops))
				break
			}
			end = run
		}
		var aStart, bStart, aLen, bLen int
		aStart, bStart = ops[start].ai+1, ops[start].bi+1
		for _, o := range ops[start:end] {
			if o.kind != '+' {
				aLen++
			}
			if o.kind != '-' {
				bLen++
			}
		}
		if aLen == 0 {
			aStart--
		}
		if bLen == 0 {
			bStart--
		}
		fmt.Fprintf(w, "@@ -%s +%s @@\n", rng(aStart, aLen), rng(bStart, bLen))
		for _, o := range ops[start:end] {
			fmt.Fprintf(w, "%c%s", o.kind, nl(o.text))
		}
		i = end
	}
}

func rng(start, n int) string {
	if n == 1 {
		return strconv.Itoa(start)
	}
	return strconv.Itoa(start) + "," + strconv.Itoa(n)
}

func writeNormal(w io.Writer, ops []diffOp) {
	for i := 0; i < len(ops); {
		if ops[i].kind == ' ' {
			i++
			continue
		}
		j := i
		var dels, adds []diffOp
		for j < len(ops) && ops[j].kind != ' ' {
			if ops[j].kind == '-' {
				dels = append(dels, ops[j])
			} else {
				adds = append(adds, ops[j])
			}
			j++
		}
		aPos, bPos := ops[i].ai, ops[i].bi
		ar := func() string {
			if len(dels) == 0 {
				return strconv.Itoa(aPos)
			}
			return span(dels[0].ai+1, dels[len(dels)-1].ai+1)
		}
		br := func() string {
			if len(adds) == 0 {
				return strconv.Itoa(bPos)
			}
			return span(adds[0].bi+1, adds[len(adds)-1].bi+1)
		}
		switch {
		case len(dels) > 0 && len(adds) > 0:
			fmt.Fprintf(w, "%sc%s\n", ar(), br())
		case len(dels) > 0:
			fmt.Fprintf(w, "%sd%s\n", ar(), br())
		default:
			fmt.Fprintf(w, "%sa%s\n", ar(), br())
		}
		for _, d := range dels {
			fmt.Fprintf(w, "< %s", nl(d.text))
		}
		if len(dels) > 0 && len(adds) > 0 {
			fmt.Fprintln(w, "---")
		}
		for _, a := range adds {
			fmt.Fprintf(w, "> %s", nl(a.text))
		}
		i = j
	}
}

func span(a, b int) string {
	if a == b {
		return strconv.Itoa(a)
	}
	return strconv.Itoa(a) + "," + strconv.Itoa(b)
}

// expandSet expands a tr set: ranges (a-z), classes ([:upper:]) and
// escapes (\n, \t, \\).
func expandSet(s string) []rune {
	var out []rune
	rs := []rune(s)
	classes := map[string]string{
		"[:upper:]": "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "[:lower:]": "abcdefghijklmnopqrstuvwxyz",
		"[:digit:]": "0123456789", "[:space:]": " \t\n\r\v\f", "[:blank:]": " \t",
		"[:punct:]": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
	}
	classes["[:alpha:]"] = classes["[:upper:]"] + classes["[:lower:]"]
	classes["[:alnum:]"] = classes["[:alpha:]"] + classes["[:digit:]"]
	for i := 0; i < len(rs); i++ {
		if rs[i] == '[' {
			rest := string(rs[i:])
			found := false
			for name, set := range classes {
				if strings.HasPrefix(rest, name) {
					out = append(out, []rune(set)...)
					i += len(name) - 1
					found = true
					break
				}
			}
			if found {
				continue
			}
		}
		ch := rs[i]
		if ch == '\\' && i+1 < len(rs) {
			i++
			switch rs[i] {
			case 'n':
				ch = '\n'
			case 't':
				ch = '\t'
			case 'r':
				ch = '\r'
			default:
				ch = rs[i]
			}
		}
		if i+2 < len(rs) && rs[i+1] == '-' {
			for r := ch; r <= rs[i+2]; r++ {
				out = append(out, r)
			}
			i += 2
			continue
		}
		out = append(out, ch)
	}
	return out
}

func cmdTr(c *cmd) int {
	f, err := parseFlags(c.args[1:], "")
	if err != nil {
		return c.errf("%v", err)
	}
	if len(f.args) < 1 {
		return c.errf("missing operand")
	}
	set1 := expandSet(f.args[0])
	var set2 []rune
	if len(f.args) > 1 {
		set2 = expandSet(f.args[1])
	}
	in1 := map[rune]bool{}
	for _, r := range set1 {
		in1[r] = true
	}
	member := func(r rune) bool { return in1[r] != f.bools['c'] }
	mapping := map[rune]rune{}
	if !f.bools['d'] && len(set2) > 0 {
		for i, r := range set1 {
			mapping[r] = set2[min(i, len(set2)-1)]
		}
	}
	squeeze := map[rune]bool{}
	if f.bools['s'] {
		src := set2
		if len(src) == 0 || f.bools['d'] {
			src = set1
		}
		for _, r := range src {
			squeeze[r] = true
		}
	}
	br := bufio.NewReaderSize(c.stdin, 64<<10)
	w := bufio.NewWriterSize(c.stdout, 64<<10)
	var last rune = -1
	for {
		r, _, err := br.ReadRune()
		if err != nil {
			break
		}
		if f.bools['d'] && member(r) {
			continue
		}
		if m, ok := mapping[r]; ok && !f.bools['c'] {
			r = m
		} else if f.bools['c'] && member(r) && len(set2) > 0 && !f.bools['d'] {
			r = set2[len(set2)-1]
		}
		if squeeze[r] && r == last {
			continue
		}
		last = r
		w.WriteRune(r)
		if w.Buffered() > 32<<10 {
			if err := w.Flush(); err != nil {
				return c.ioErr(err)
			}
		}
	}
	if err := w.Flush(); err != nil {
		return c.ioErr(err)
	}
	return 0
}

// parseList parses cut's LIST: 1,3-5,7-.
func parseList(s string) (func(i int) bool, error) {
	type r struct{ a, b int }
	var rs []r
	for _, part := range strings.Split(s, ",") {
		a, b, isRange := strings.Cut(part, "-")
		x, y := 1, 1<<30
		var err error
		if a != "" {
			if x, err = strconv.Atoi(a); err != nil {
				return nil, err
			}
		}
		if !isRange {
			y = x
		} else if b != "" {
			if y, err = strconv.Atoi(b); err != nil {
				return nil, err
			}
		}
		rs = append(rs, r{x, y})
	}
	return func(i int) bool {
		for _, x := range rs {
			if i >= x.a && i <= x.b {
				return true
			}
		}
		return false
	}, nil
}

func cmdCut(c *cmd) int {
	f, err := parseFlags(c.args[1:], "dfcb")
	if err != nil {
		return c.errf("%v", err)
	}
	delim := "\t"
	if d, ok := f.values['d']; ok {
		delim = d
	}
	spec, chars := f.values['f'], false
	if v, ok := f.values['c']; ok {
		spec, chars = v, true
	}
	if v, ok := f.values['b']; ok {
		spec, chars = v, true
	}
	if spec == "" {
		return c.errf("you must specify a list of bytes, characters, or fields")
	}
	sel, err := parseList(spec)
	if err != nil {
		return c.errf("invalid list: %s", spec)
	}
	w := bufio.NewWriter(c.stdout)
	defer w.Flush()
	return c.inputs(f.args, func(_ string, r io.Reader) error {
		return eachLine(r, func(raw []byte) error {
			line := strings.TrimSuffix(string(raw), "\n")
			var out string
			if chars {
				var b strings.Builder
				for i, ch := range []rune(line) {
					if sel(i + 1) {
						b.WriteRune(ch)
					}
				}
				out = b.String()
			} else {
				if !strings.Contains(line, delim) {
					if f.bools['s'] {
						return nil
					}
					out = line
				} else {
					var keep []string
					for i, p := range strings.Split(line, delim) {
						if sel(i + 1) {
							keep = append(keep, p)
						}
					}
					out = strings.Join(keep, delim)
				}
			}
			w.WriteString(out)
			return w.WriteByte('\n')
		})
	})
}

func cmdXargs(c *cmd) int {
	args := c.args[1:]
	maxArgs := 0
	replace := ""
	nul := false
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch {
		case args[0] == "-n" && len(args) > 1:
			maxArgs, _ = strconv.Atoi(args[1])
			args = args[1:]
		case strings.HasPrefix(args[0], "-n"):
			maxArgs, _ = strconv.Atoi(args[0][2:])
		case args[0] == "-I" && len(args) > 1:
			replace = args[1]
			args = args[1:]
		case args[0] == "-0":
			nul = true
		case args[0] == "-r":
		default:
			return c.errf("unsupported option %s", args[0])
		}
		args = args[1:]
	}
	if len(args) == 0 {
		args = []string{"echo"}
	}
	data, err := readAllCapped(c, c.stdin)
	if err != nil {
		return 137
	}
	var items []string
	if nul {
		for _, s := range strings.Split(string(data), "\x00") {
			if s != "" {
				items = append(items, s)
			}
		}
	} else if replace != "" {
		for _, s := range strings.Split(string(data), "\n") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
	} else {
		items = strings.Fields(string(data))
	}
	code := 0
	run := func(argv []string) {
		if st := c.sub(c.ctx, argv, strings.NewReader(""), nil); st != 0 {
			code = 123
		}
	}
	if replace != "" {
		for _, it := range items {
			argv := make([]string, len(args))
			for i, a := range args {
				argv[i] = strings.ReplaceAll(a, replace, it)
			}
			run(argv)
		}
		return code
	}
	if maxArgs <= 0 {
		maxArgs = max(len(items), 1)
	}
	if len(items) == 0 {
		run(append([]string(nil), args...))
		return code
	}
	for i := 0; i < len(items); i += maxArgs {
		run(append(append([]string(nil), args...), items[i:min(i+maxArgs, len(items))]...))
	}
	return code
}

func cmdSum(kind string) builtin {
	return func(c *cmd) int {
		return c.inputs(c.args[1:], func(name string, r io.Reader) error {
			var h hash.Hash
			switch kind {
			case "md5":
				h = md5.New()
			case "sha1":
				h = sha1.New()
			default:
				h = sha256.New()
			}
			if _, err := io.Copy(h, r); err != nil {
				return err
			}
			_, err := fmt.Fprintf(c.stdout, "%x  %s\n", h.Sum(nil), name)
			return err
		})
	}
}

func cmdBase64(c *cmd) int {
	f, err := parseFlags(c.args[1:], "w")
	if err != nil {
		return c.errf("%v", err)
	}
	return c.inputs(f.args, func(_ string, r io.Reader) error {
		data, err := readAllCapped(c, r)
		if err != nil {
			return err
		}
		if f.bools['d'] {
			out, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(data)), ""))
			if err != nil {
				return errors.New("invalid input")
			}
			_, err = c.stdout.Write(out)
			return err
		}
		enc := base64.StdEncoding.EncodeToString(data)
		for len(enc) > 76 {
			fmt.Fprintln(c.stdout, enc[:76])
			enc = enc[76:]
		}
		_, err = fmt.Fprintln(c.stdout, enc)
		return err
	})
}

func cmdExpr(c *cmd) int {
	a := c.args[1:]
	if len(a) == 3 {
		x, err1 := strconv.ParseInt(a[0], 10, 64)
		y, err2 := strconv.ParseInt(a[2], 10, 64)
		if err1 == nil && err2 == nil {
			var v int64
			switch a[1] {
			case "+":
				v = x + y
			case "-":
				v = x - y
			case "*":
				v = x * y
			case "/", "%":
				if y == 0 {
					fmt.Fprintln(c.stderr, "expr: division by zero")
					return 2
				}
				if a[1] == "/" {
					v = x / y
				} else {
					v = x % y
				}
			default:
				goto str
			}
			fmt.Fprintln(c.stdout, v)
			if v == 0 {
				return 1
			}
			return 0
		}
	}
str:
	if len(a) == 2 && a[0] == "length" {
		fmt.Fprintln(c.stdout, len(a[1]))
		return 0
	}
	if len(a) == 1 {
		fmt.Fprintln(c.stdout, a[0])
		return 0
	}
	fmt.Fprintln(c.stderr, "expr: unsupported expression")
	return 2
}
