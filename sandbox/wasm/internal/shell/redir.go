package shell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"mvdan.cc/sh/v3/syntax"
)

// fdEnt is an open file descriptor of a shell: a reader, a writer or both,
// and what closes it. Entries are shared between the descriptors that dup
// them and the commands that inherit them, like open file descriptions.
type fdEnt struct {
	r    io.Reader
	w    io.Writer
	c    io.Closer
	name string
	// procSubst marks the end of a process substitution just opened: its
	// opener closes it.
	procSubst bool
}

// fdTable maps descriptor numbers to entries.
type fdTable struct {
	low  [10]*fdEnt
	high map[int]*fdEnt
}

func newFDTable() *fdTable { return &fdTable{} }

func (t *fdTable) clone() *fdTable {
	c := &fdTable{low: t.low}
	if len(t.high) > 0 {
		c.high = make(map[int]*fdEnt, len(t.high))
		for k, v := range t.high {
			c.high[k] = v
		}
	}
	return c
}

func (t *fdTable) get(n int) *fdEnt {
	if n >= 0 && n < len(t.low) {
		return t.low[n]
	}
	return t.high[n]
}

func (t *fdTable) set(n int, e *fdEnt) {
	if n >= 0 && n < len(t.low) {
		t.low[n] = e
		return
	}
	if e == nil {
		delete(t.high, n)
		return
	}
	if t.high == nil {
		t.high = map[int]*fdEnt{}
	}
	t.high[n] = e
}

// free returns the lowest descriptor >= 10 not in use ({var}> redirections).
func (t *fdTable) free() int {
	for n := 10; ; n++ {
		if t.get(n) == nil {
			return n
		}
	}
}

func (t *fdTable) reader(n int) io.Reader {
	if e := t.get(n); e != nil && e.r != nil {
		return e.r
	}
	return badFD{n}
}

func (t *fdTable) writer(n int) io.Writer {
	if e := t.get(n); e != nil && e.w != nil {
		return e.w
	}
	return badFD{n}
}

// badFD is a closed or write-only/read-only descriptor.
type badFD struct{ n int }

func (b badFD) Read([]byte) (int, error)  { return 0, syscall.EBADF }
func (b badFD) Write([]byte) (int, error) { return 0, syscall.EBADF }

func closeAll(cs []io.Closer) {
	for _, c := range cs {
		c.Close()
	}
}

// sharedReader buffers a descriptor's input for every reader of it (read
// reads byte by byte; commands read blocks), so nothing read ahead is lost
// to the next reader of the same descriptor.
type sharedReader struct {
	mu  sync.Mutex
	r   io.Reader
	buf []byte
	off int
	err error
}

func newSharedReader(r io.Reader) *sharedReader {
	if sr, ok := r.(*sharedReader); ok {
		return sr
	}
	return &sharedReader{r: r}
}

func (s *sharedReader) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off < len(s.buf) {
		n := copy(p, s.buf[s.off:])
		s.off += n
		return n, nil
	}
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, err
	}
	if err != nil && n == 0 {
		return 0, err
	}
	return n, nil
}

// ReadByte reads one byte, filling a small buffer from the source.
func (s *sharedReader) ReadByte() (byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off >= len(s.buf) {
		if s.err != nil {
			return 0, s.err
		}
		if cap(s.buf) == 0 {
			s.buf = make([]byte, 0, 4096)
		}
		n, err := s.r.Read(s.buf[:cap(s.buf)])
		s.buf, s.off = s.buf[:n], 0
		if n == 0 {
			if err == nil {
				err = io.ErrNoProgress
			}
			if errors.Is(err, io.EOF) {
				s.err = io.EOF
			}
			return 0, err
		}
	}
	b := s.buf[s.off]
	s.off++
	return b, nil
}

// redirect applies redirections to fds (a copy of the shell's) and returns
// it with what must be closed after the command.
func (sh *shell) redirect(ctx context.Context, rds []*syntax.Redirect, fds *fdTable) (*fdTable, []io.Closer, error) {
	var closers []io.Closer
	for _, rd := range rds {
		if err := sh.redirectOne(ctx, rd, fds, &closers); err != nil {
			return fds, closers, err
		}
	}
	return fds, closers, nil
}

func (sh *shell) redirectOne(ctx context.Context, rd *syntax.Redirect, fds *fdTable, closers *[]io.Closer) error {
	n := -1
	varName := ""
	if rd.N != nil {
		v := rd.N.Value
		if strings.HasPrefix(v, "{") && strings.HasSuffix(v, "}") {
			varName = v[1 : len(v)-1]
		} else {
			var err error
			if n, err = strconv.Atoi(v); err != nil || n < 0 || n > 1<<16 {
				return fmt.Errorf("%s: bad file descriptor", v)
			}
		}
	}
	def := func(d int) int {
		if n >= 0 {
			return n
		}
		if varName != "" {
			fd := fds.free()
			sh.setVar(varName, strconv.Itoa(fd))
			return fd
		}
		return d
	}
	switch rd.Op {
	case syntax.Hdoc, syntax.DashHdoc:
		body, err := sh.hdoc(ctx, rd)
		if err != nil {
			return err
		}
		*closers = append(*closers, releaser{sh.s.mem, int64(len(body))})
		fds.set(def(0), &fdEnt{r: newSharedReader(strings.NewReader(body)), name: "here-document"})
		return nil
	case syntax.WordHdoc:
		s, release, err := sh.literal(ctx, rd.Word)
		if err != nil {
			return err
		}
		release()
		if err := sh.s.mem.charge(int64(len(s))+1, "a here-string"); err != nil {
			return err
		}
		*closers = append(*closers, releaser{sh.s.mem, int64(len(s)) + 1})
		fds.set(def(0), &fdEnt{r: newSharedReader(strings.NewReader(s + "\n")), name: "here-string"})
		return nil
	}
	target, release, err := sh.literal(ctx, rd.Word)
	if err != nil {
		return err
	}
	defer release() // after the open: a process substitution's end is taken by then
	switch rd.Op {
	case syntax.DplIn, syntax.DplOut:
		d := 0
		if rd.Op == syntax.DplOut {
			d = 1
		}
		if target == "-" {
			fds.set(def(d), nil)
			return nil
		}
		src, err := strconv.Atoi(strings.TrimSuffix(target, "-"))
		if err != nil {
			if rd.Op == syntax.DplOut && n < 0 && varName == "" {
				// >& file: stdout and stderr to file.
				e, err := sh.openRedir(target, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, closers, false)
				if err != nil {
					return err
				}
				fds.set(1, e)
				fds.set(2, e)
				return nil
			}
			return fmt.Errorf("%s: ambiguous redirect", target)
		}
		e := fds.get(src)
		if e == nil {
			return fmt.Errorf("%d: Bad file descriptor", src)
		}
		fds.set(def(d), e)
		if strings.HasSuffix(target, "-") {
			fds.set(src, nil)
		}
		return nil
	case syntax.RdrIn:
		e, err := sh.openRedir(target, syscall.O_RDONLY, closers, true)
		if err != nil {
			return err
		}
		fds.set(def(0), e)
	case syntax.RdrInOut:
		e, err := sh.openRedir(target, syscall.O_RDWR|syscall.O_CREAT, closers, true)
		if err != nil {
			return err
		}
		fds.set(def(0), e)
	case syntax.RdrOut, syntax.RdrClob:
		e, err := sh.openRedir(target, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, closers, rd.Op == syntax.RdrOut)
		if err != nil {
			return err
		}
		fds.set(def(1), e)
	case syntax.AppOut, syntax.AppClob:
		e, err := sh.openRedir(target, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_APPEND, closers, false)
		if err != nil {
			return err
		}
		fds.set(def(1), e)
	case syntax.RdrAll, syntax.RdrAllClob:
		e, err := sh.openRedir(target, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, closers, rd.Op == syntax.RdrAll)
		if err != nil {
			return err
		}
		fds.set(1, e)
		fds.set(2, e)
	case syntax.AppAll, syntax.AppAllClob:
		e, err := sh.openRedir(target, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_APPEND, closers, false)
		if err != nil {
			return err
		}
		fds.set(1, e)
		fds.set(2, e)
	default:
		return fmt.Errorf("redirection %s is not supported in this shell", rd.Op)
	}
	return nil
}

// releaser returns bytes to the budget when closed.
type releaser struct {
	b *budget
	n int64
}

func (r releaser) Close() error { r.b.release(r.n); return nil }

// openRedir opens a redirection target: a process substitution, a
// standard stream of this shell, or a file of the episode.
func (sh *shell) openRedir(name string, flag int, closers *[]io.Closer, noclobberApplies bool) (*fdEnt, error) {
	if e, ok := sh.special(name, flag); ok {
		if e == nil {
			return nil, fmt.Errorf("%s: No such file or directory", name)
		}
		if e.procSubst { // a process substitution's end, now ours to close
			*closers = append(*closers, e.c)
		}
		return e, nil
	}
	if name == "" {
		return nil, fmt.Errorf("ambiguous redirect")
	}
	p := abs(sh.dir, name)
	if noclobberApplies && sh.opts.noclobber && flag&syscall.O_TRUNC != 0 {
		if fi, err := sh.s.cfg.FS.Stat(p); err == nil && fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: cannot overwrite existing file", name)
		}
	}
	f, err := sh.s.cfg.FS.OpenFile(p, flag, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", name, pathErrText(err))
	}
	if flag&(syscall.O_WRONLY|syscall.O_RDWR) == 0 {
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			f.Close()
			return nil, fmt.Errorf("%s: Is a directory", name)
		}
	}
	*closers = append(*closers, f)
	e := &fdEnt{name: name}
	if flag&syscall.O_WRONLY == 0 {
		e.r = newSharedReader(f)
	}
	if flag&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		e.w = f
	}
	return e, nil
}

// special resolves the names a shell gives meaning without a file:
// /dev/stdin, /dev/stdout, /dev/stderr, /dev/fd/N (its own descriptors
// and process substitutions). ok is false for anything else.
func (sh *shell) special(name string, flag int) (*fdEnt, bool) {
	p := abs(sh.dir, name)
	switch p {
	case "/dev/stdin":
		return sh.fds.get(0), true
	case "/dev/stdout":
		return sh.fds.get(1), true
	case "/dev/stderr":
		return sh.fds.get(2), true
	}
	if rest, ok := strings.CutPrefix(p, "/dev/fd/"); ok {
		if end := sh.s.procSubstEnd(p); end != nil {
			return end, true
		}
		n, err := strconv.Atoi(rest)
		if err != nil {
			return nil, true
		}
		return sh.fds.get(n), true
	}
	return nil, false
}

// hdoc expands a here-document's body (literally when its delimiter is
// quoted), stripping leading tabs for <<-. The body is charged while the
// command runs.
func (sh *shell) hdoc(ctx context.Context, rd *syntax.Redirect) (string, error) {
	if rd.Hdoc == nil {
		return "", nil
	}
	word := rd.Hdoc
	if rd.Op == syntax.DashHdoc {
		word = stripTabs(word)
	}
	var body string
	if hdocQuoted(rd.Word) {
		var b strings.Builder
		for _, p := range word.Parts {
			if l, ok := p.(*syntax.Lit); ok {
				b.WriteString(l.Value)
			}
		}
		body = b.String()
	} else {
		s, release, err := sh.document(ctx, word)
		if err != nil {
			return "", err
		}
		release()
		body = s
	}
	if err := sh.s.mem.charge(int64(len(body)), "a here-document"); err != nil {
		return "", err
	}
	return body, nil // released with the statement's redirections
}

func hdocQuoted(w *syntax.Word) bool {
	if w == nil {
		return false
	}
	for _, p := range w.Parts {
		switch p := p.(type) {
		case *syntax.Lit:
			if strings.Contains(p.Value, "\\") {
				return true
			}
		case *syntax.SglQuoted, *syntax.DblQuoted:
			return true
		}
	}
	return false
}

// stripTabs removes the leading tabs of every line of a here-document's
// literal parts.
func stripTabs(w *syntax.Word) *syntax.Word {
	out := &syntax.Word{}
	atStart := true
	for _, p := range w.Parts {
		l, ok := p.(*syntax.Lit)
		if !ok {
			out.Parts = append(out.Parts, p)
			atStart = false
			continue
		}
		var b strings.Builder
		for i, line := range strings.SplitAfter(l.Value, "\n") {
			if i > 0 || atStart {
				line = strings.TrimLeft(line, "\t")
			}
			b.WriteString(line)
		}
		atStart = strings.HasSuffix(l.Value, "\n")
		out.Parts = append(out.Parts, &syntax.Lit{Value: b.String()})
	}
	return out
}

// isExecRedirOnly reports an "exec >file" with no command: its
// redirections stay in effect for the rest of the shell.
func isExecRedirOnly(c *syntax.CallExpr) bool {
	return len(c.Args) == 1 && c.Args[0].Lit() == "exec"
}

// procSubstEnd returns the open end of a process substitution by path.
func (s *session) procSubstEnd(p string) *fdEnt {
	s.psMu.Lock()
	defer s.psMu.Unlock()
	end := s.procSubst[p]
	delete(s.procSubst, p) // the opener owns it now
	switch e := end.(type) {
	case *pipeReader:
		return &fdEnt{r: newSharedReader(e), c: e, name: p, procSubst: true}
	case *pipeWriter:
		return &fdEnt{w: e, c: e, name: p, procSubst: true}
	}
	return nil
}

func (s *session) closeProcSubsts() {
	s.psMu.Lock()
	defer s.psMu.Unlock()
	for k, e := range s.procSubst {
		if c, ok := e.(io.Closer); ok {
			c.Close()
		}
		delete(s.procSubst, k)
	}
}
