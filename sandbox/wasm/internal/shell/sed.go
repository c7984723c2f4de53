package shell

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// A small sed: addresses (N, $, /re/, ranges A,B, negation A!), and the
// commands s///[gpiN], d, p, q, =, y, a, i, c; options -n, -e, -f, -i, -E/-r.

type sedAddr struct {
	line int // 0: none
	last bool
	re   *regexp.Regexp
}

type sedCmd struct {
	a1, a2  *sedAddr
	neg     bool
	name    byte
	re      *regexp.Regexp
	repl    string
	global  bool
	nth     int
	print   bool
	text    string
	from    []rune
	to      []rune
	inRange bool
}

type sedParser struct {
	s   string
	i   int
	ere bool
}

func (p *sedParser) eof() bool { return p.i >= len(p.s) }
func (p *sedParser) peek() byte {
	if p.eof() {
		return 0
	}
	return p.s[p.i]
}
func (p *sedParser) skipSpace() {
	for !p.eof() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// delimited reads up to an unescaped delim; a "\delim" becomes delim.
func (p *sedParser) delimited(delim byte) (string, error) {
	var b strings.Builder
	for !p.eof() {
		ch := p.s[p.i]
		if ch == '\\' && p.i+1 < len(p.s) {
			if p.s[p.i+1] == delim {
				b.WriteByte(delim)
			} else if p.s[p.i+1] == 'n' {
				b.WriteByte('\n')
			} else {
				b.WriteByte('\\')
				b.WriteByte(p.s[p.i+1])
			}
			p.i += 2
			continue
		}
		if ch == delim {
			p.i++
			return b.String(), nil
		}
		b.WriteByte(ch)
		p.i++
	}
	return "", fmt.Errorf("unterminated `s' command")
}

func (p *sedParser) re(src string) (*regexp.Regexp, error) {
	pat := src
	if !p.ere {
		pat = breToRE(src)
	}
	return regexp.Compile(pat)
}

func (p *sedParser) addr() (*sedAddr, error) {
	switch ch := p.peek(); {
	case ch >= '0' && ch <= '9':
		j := p.i
		for !p.eof() && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
		}
		n, _ := strconv.Atoi(p.s[j:p.i])
		return &sedAddr{line: n}, nil
	case ch == '$':
		p.i++
		return &sedAddr{last: true}, nil
	case ch == '/' || ch == '\\':
		delim := byte('/')
		if ch == '\\' {
			p.i++
			delim = p.peek()
		}
		p.i++
		src, err := p.delimited(delim)
		if err != nil {
			return nil, err
		}
		re, err := p.re(src)
		if err != nil {
			return nil, err
		}
		return &sedAddr{re: re}, nil
	}
	return nil, nil
}

func parseSed(script string, ere bool) ([]*sedCmd, error) {
	p := &sedParser{s: script, ere: ere}
	var cmds []*sedCmd
	for {
		for !p.eof() && strings.IndexByte(" \t\n;", p.peek()) >= 0 {
			p.i++
		}
		if p.eof() {
			return cmds, nil
		}
		c := &sedCmd{}
		var err error
		if c.a1, err = p.addr(); err != nil {
			return nil, err
		}
		if c.a1 != nil && p.peek() == ',' {
			p.i++
			if c.a2, err = p.addr(); err != nil {
				return nil, err
			}
		}
		p.skipSpace()
		if p.peek() == '!' {
			c.neg = true
			p.i++
			p.skipSpace()
		}
		if p.eof() {
			return nil, fmt.Errorf("missing command")
		}
		c.name = p.s[p.i]
		p.i++
		switch c.name {
		case 's':
			delim := p.peek()
			p.i++
			src, err := p.delimited(delim)
			if err != nil {
				return nil, err
			}
			repl, err := p.delimited(delim)
			if err != nil {
				return nil, err
			}
			icase := false
			for !p.eof() && strings.IndexByte("gpiI0123456789", p.peek()) >= 0 {
				switch ch := p.s[p.i]; {
				case ch == 'g':
					c.global = true
				case ch == 'p':
					c.print = true
				case ch == 'i' || ch == 'I':
					icase = true
				default:
					c.nth = c.nth*10 + int(ch-'0')
				}
				p.i++
			}
			if icase {
				src = "(?i)" + src
			}
			if c.re, err = p.re(src); err != nil {
				return nil, err
			}
			c.repl = sedRepl(repl, ere)
		case 'y':
			delim := p.peek()
			p.i++
			a, err := p.delimited(delim)
			if err != nil {
				return nil, err
			}
			b, err := p.delimited(delim)
			if err != nil {
				return nil, err
			}
			c.from, c.to = []rune(a), []rune(b)
			if len(c.from) != len(c.to) {
				return nil, fmt.Errorf("strings for `y' command are different lengths")
			}
		case 'a', 'i', 'c':
			p.skipSpace()
			if p.peek() == '\\' {
				p.i++
				if p.peek() == '\n' {
					p.i++
				}
			}
			j := p.i
			for !p.eof() && p.s[p.i] != '\n' {
				p.i++
			}
			c.text = p.s[j:p.i]
		case 'd', 'p', 'q', '=', 'D', 'P':
		case '{', '}':
			return nil, fmt.Errorf("blocks ({ }) are not supported by this sed")
		default:
			return nil, fmt.Errorf("unknown command: `%c'", c.name)
		}
		cmds = append(cmds, c)
	}
}

// sedRepl converts a sed replacement (& and \1..\9) to Go's template.
func sedRepl(s string, ere bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case ch == '\\' && i+1 < len(s):
			n := s[i+1]
			i++
			switch {
			case n >= '0' && n <= '9':
				b.WriteString("${" + string(n) + "}")
			case n == '&':
				b.WriteByte('&')
			case n == 'n':
				b.WriteByte('\n')
			case n == 't':
				b.WriteByte('\t')
			case n == '$':
				b.WriteString("$$")
			default:
				b.WriteByte(n)
			}
		case ch == '&':
			b.WriteString("${0}")
		case ch == '$':
			b.WriteString("$$")
		default:
			b.WriteByte(ch)
		}
	}
	return b.String()
}

func (a *sedAddr) match(line string, n int, last bool) bool {
	switch {
	case a.last:
		return last
	case a.re != nil:
		return a.re.MatchString(line)
	}
	return a.line == n
}

func (c *sedCmd) selects(line string, n int, last bool) bool {
	sel := false
	switch {
	case c.a1 == nil:
		sel = true
	case c.a2 == nil:
		sel = c.a1.match(line, n, last)
	case c.inRange:
		sel = true
		if c.a2.match(line, n, last) || (c.a2.line > 0 && n >= c.a2.line) {
			c.inRange = false
		}
	case c.a1.match(line, n, last):
		sel = true
		c.inRange = !(c.a2.line > 0 && n >= c.a2.line) && !c.a2.last || c.a2.last && !last
		if c.a2.re == nil && c.a2.line > 0 && n >= c.a2.line {
			c.inRange = false
		}
	}
	return sel != c.neg
}

// runSed runs the script over r. Lines (the one read ahead and the one
// being edited, which substitutions may grow) are charged to c's memory
// budget while held.
func runSed(c0 *cmd, cmds []*sedCmd, quiet bool, r io.Reader, w *bufio.Writer) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var held int64
	defer func() { c0.unhold(held) }()
	readLine := func() (string, error) {
		var b strings.Builder
		for {
			chunk, err := br.ReadSlice('\n')
			if err := c0.hold(int64(len(chunk)), "a line"); err != nil {
				return "", err
			}
			held += int64(len(chunk))
			b.Write(chunk)
			if !errors.Is(err, bufio.ErrBufferFull) {
				return b.String(), err
			}
		}
	}
	next, nextErr := readLine()
	if errors.Is(nextErr, ErrOOM) {
		return nextErr
	}
	n := 0
	for next != "" || nextErr == nil {
		raw := next
		if nextErr != nil && raw == "" {
			break
		}
		c0.unhold(held)
		held = 0
		c0.hold(int64(len(raw)), "a line")
		held += int64(len(raw))
		next, nextErr = readLine()
		if errors.Is(nextErr, ErrOOM) {
			return nextErr
		}
		last := next == "" && nextErr != nil
		n++
		hadNL := strings.HasSuffix(raw, "\n")
		line := strings.TrimSuffix(raw, "\n")
		deleted, quit := false, false
		var appendText []string
	cmds:
		for _, c := range cmds {
			if !c.selects(line, n, last) {
				continue
			}
			switch c.name {
			case 's':
				count := 0
				replaced := false
				line = c.re.ReplaceAllStringFunc(line, func(m string) string {
					count++
					if (c.nth > 0 && count != c.nth) || (!c.global && c.nth == 0 && count > 1) {
						return m
					}
					replaced = true
					sub := c.re.FindStringSubmatchIndex(m)
					var dst []byte
					return string(c.re.ExpandString(dst, c.repl, m, sub))
				})
				if grow := int64(len(line)) - int64(len(raw)); grow > 0 {
					if err := c0.hold(grow, "a substitution"); err != nil {
						return err
					}
					held += grow
				}
				if replaced && c.print {
					w.WriteString(line + "\n")
				}
			case 'y':
				rs := []rune(line)
				for i, ch := range rs {
					for j, f := range c.from {
						if ch == f {
							rs[i] = c.to[j]
							break
						}
					}
				}
				line = string(rs)
			case 'd', 'D':
				deleted = true
				break cmds
			case 'p', 'P':
				w.WriteString(line + "\n")
			case '=':
				fmt.Fprintf(w, "%d\n", n)
			case 'a':
				appendText = append(appendText, c.text)
			case 'i':
				w.WriteString(c.text + "\n")
			case 'c':
				if c.a2 == nil || !c.inRange {
					w.WriteString(c.text + "\n")
				}
				deleted = true
				break cmds
			case 'q':
				quit = true
				break cmds
			}
		}
		if !deleted && !quiet {
			w.WriteString(line)
			if hadNL || len(appendText) > 0 {
				w.WriteByte('\n')
			}
		}
		for _, t := range appendText {
			w.WriteString(t + "\n")
		}
		if w.Buffered() > 32<<10 {
			if err := w.Flush(); err != nil {
				return err
			}
		}
		if quit || (nextErr != nil && next == "") {
			break
		}
	}
	return w.Flush()
}

func cmdSed(c *cmd) int {
	args := c.args[1:]
	var scripts []string
	var files []string
	quiet, inPlace, ere := false, false, false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-e" || a == "--expression":
			if i+1 >= len(args) {
				return c.errf("option requires an argument -- 'e'")
			}
			scripts = append(scripts, args[i+1])
			i++
		case a == "-f":
			if i+1 >= len(args) {
				return c.errf("option requires an argument -- 'f'")
			}
			data, err := c.readFile(args[i+1])
			if err != nil {
				return c.errf("couldn't open file %s: %s", args[i+1], errText(err))
			}
			scripts = append(scripts, string(data))
			i++
		case strings.HasPrefix(a, "-i") || a == "--in-place":
			inPlace = true
		case a == "-n" || a == "--quiet" || a == "--silent":
			quiet = true
		case a == "-E" || a == "-r" || a == "--regexp-extended":
			ere = true
		case len(a) > 1 && a[0] == '-' && strings.Trim(a[1:], "nEris") == "":
			quiet = quiet || strings.Contains(a, "n")
			ere = ere || strings.ContainsAny(a, "Er")
			inPlace = inPlace || strings.Contains(a, "i")
		default:
			files = append(files, a)
		}
	}
	if len(scripts) == 0 {
		if len(files) == 0 {
			fmt.Fprintln(c.stderr, "Usage: sed [OPTION]... {script} [input-file]...")
			return 1
		}
		scripts, files = files[:1], files[1:]
	}
	cmds, err := parseSed(strings.Join(scripts, "\n"), ere)
	if err != nil {
		fmt.Fprintf(c.stderr, "sed: -e expression #1: %v\n", err)
		return 1
	}
	if inPlace {
		code := 0
		for _, f := range files {
			data, err := c.readFile(f)
			if err != nil {
				code = c.errf("can't read %s: %s", f, errText(err))
				continue
			}
			var out bytes.Buffer
			bw := bufio.NewWriter(&heldWriter{w: &out, c: c})
			for _, cm := range cmds {
				cm.inRange = false
			}
			if err := runSed(c, cmds, quiet, bytes.NewReader(data), bw); err != nil {
				return c.ioErr(err)
			}
			fi, _ := c.fs().Stat(c.abs(f))
			if err := c.fs().WriteFile(c.abs(f), out.Bytes(), fi.Mode().Perm()); err != nil {
				code = c.errf("couldn't write %s: %s", f, errText(err))
			}
		}
		return code
	}
	w := bufio.NewWriterSize(c.stdout, 64<<10)
	var readers []io.Reader
	code := 0
	if len(files) == 0 {
		readers = append(readers, c.stdin)
	}
	for _, f := range files {
		if f == "-" {
			readers = append(readers, c.stdin)
			continue
		}
		h, err := c.open(f)
		if err != nil {
			code = c.errf("can't read %s: %s", f, errText(err))
			continue
		}
		defer h.Close()
		readers = append(readers, h)
	}
	if err := runSed(c, cmds, quiet, io.MultiReader(readers...), w); err != nil {
		return c.ioErr(err)
	}
	return code
}

// heldWriter charges what it writes to the command's memory budget (sed -i
// builds the new file in memory).
type heldWriter struct {
	w io.Writer
	c *cmd
}

func (h *heldWriter) Write(p []byte) (int, error) {
	if err := h.c.hold(int64(len(p)), "its output"); err != nil {
		return 0, err
	}
	return h.w.Write(p)
}
