package shell

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
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
		err := c.eachLine(r, func(raw []byte) error {
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
			data, err = c.readAll(c.stdin)
		} else {
			data, err = c.readFile(n)
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
