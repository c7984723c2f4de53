package auditlog

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Version is the record format, carried by every line as "v".
const Version = 1

// Genesis is the "prev" of a log's first line.
var Genesis = hexSum([]byte("rollbox.auditlog/v1 genesis"))

// maxLine bounds one line, for reading a log's tail and verifying it.
const maxLine = 1 << 20

// Operations a record describes.
const (
	OpCreate = "create"
	OpExec   = "exec"
	OpWrite  = "write"
	OpClose  = "close"
	// OpRotate is the first line of a log that replaced a full one
	// (Options.MaxBytes): Rotated names the full log and seals its last
	// line.
	OpRotate = "rotate"
)

// Record is one line of the log. Fields that do not apply are omitted.
type Record struct {
	V   int    `json:"v"`
	Seq uint64 `json:"seq"`
	// Time is when the operation ended, UTC.
	Time time.Time `json:"time"`
	Op   string    `json:"op"`
	// Episode is the sandbox spec's rollbox.episode label; a fork's, once
	// named (sandbox.EpisodeNamer), the episode it serves.
	Episode     string   `json:"episode,omitempty"`
	Sandbox     string   `json:"sandbox,omitempty"`
	Backend     string   `json:"backend,omitempty"`
	Image       string   `json:"image,omitempty"`
	ImageDigest string   `json:"image_digest,omitempty"`
	Runtime     string   `json:"runtime,omitempty"`
	Network     string   `json:"network,omitempty"`
	Loosened    []string `json:"loosened,omitempty"`
	// ForkedFrom is, on a create record, the sandbox this one was forked
	// from (sandbox.Forker).
	ForkedFrom string `json:"forked_from,omitempty"`
	// Argv or Shell is the command, when its bytes are at most InlineBytes;
	// otherwise InputSHA256 is the SHA-256 of the JSON of the argv, or of
	// the shell line, and InputBytes its size.
	Argv        []string `json:"argv,omitempty"`
	Shell       string   `json:"shell,omitempty"`
	InputSHA256 string   `json:"input_sha256,omitempty"`
	InputBytes  int      `json:"input_bytes,omitempty"`
	StdinSHA256 string   `json:"stdin_sha256,omitempty"`
	StdinBytes  int      `json:"stdin_bytes,omitempty"`
	Workdir     string   `json:"workdir,omitempty"`
	ExitCode    *int     `json:"exit_code,omitempty"`
	Signal      string   `json:"signal,omitempty"`
	TimedOut    bool     `json:"timed_out,omitempty"`
	OOMKilled   bool     `json:"oom_killed,omitempty"`
	StdoutBytes int64    `json:"stdout_bytes,omitempty"`
	StderrBytes int64    `json:"stderr_bytes,omitempty"`
	DurationMS  float64  `json:"duration_ms,omitempty"`
	// Path, Size, SHA256 and Mode describe a file write.
	Path   string `json:"path,omitempty"`
	Size   *int64 `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	Mode   string `json:"mode,omitempty"`
	// Error is why the operation failed, if it did.
	Error string `json:"error,omitempty"`
	// Rotated is, on a rotate record, the log this one replaced.
	Rotated *Rotated `json:"rotated,omitempty"`
	// Prev is the hash of the line before (Genesis for the first).
	Prev string `json:"prev"`
}

// InlineBytes is the largest command kept verbatim in a record.
const InlineBytes = 4 << 10

// Sync says when appended lines are forced to disk.
type Sync int

const (
	// SyncEvery (the default) returns from Append once the line is
	// fsynced: a line whose operation returned survives a power loss.
	// Appends made at the same time share one fsync (group commit, see
	// Log.Append): on a disk whose fsync takes 1.6 ms, 256 concurrent
	// appenders wrote 32 times the lines a second of one fsync per line
	// (BenchmarkConcurrentAppends).
	SyncEvery Sync = iota
	// SyncNone leaves write-back to the kernel: a crash of the process
	// loses nothing (every line is one write(2)), a crash of the machine
	// may lose the last seconds, which verify-log then cannot tell from a
	// truncation.
	SyncNone
)

// Options configure Open.
type Options struct {
	Sync Sync
	// MaxBytes, when > 0, rotates the log once it has grown past it: the
	// full file becomes PATH.1 (an older PATH.1 becomes PATH.2, and so on,
	// up to Keep files; the oldest is removed) and a new PATH starts with a
	// rotate record that names the full one and carries its last line's
	// hash, so the new file seals the old one's end.
	MaxBytes int64
	// Keep is how many rotated files are kept (default DefaultKeep).
	Keep int
}

// DefaultKeep is how many rotated files are kept when Options.Keep is 0.
const DefaultKeep = 8

// Rotated describes, in a rotate record, the log that was rotated away.
type Rotated struct {
	// LastSeq, Head and Bytes are its last line's sequence number and hash
	// and its size: compare them with the file (PATH.1 when it was rotated,
	// then PATH.2...) to detect a truncation or an edit of its end;
	// VerifyFiles and `rollbox audit verify-log OLD... NEW` do.
	LastSeq uint64 `json:"last_seq"`
	Head    string `json:"head"`
	Bytes   int64  `json:"bytes"`
}

// Log is an append-only, hash-chained JSON-lines file. Safe for concurrent
// use within a process (appends queue for one writer goroutine: see
// Append) and across processes (an flock around every batch of lines; a
// writer that finds the file grown by another re-reads the last line
// before chaining to it).
type Log struct {
	path string
	opts Options

	mu      sync.Mutex
	queue   []*pending // appends waiting for the writer
	writing bool       // a writer goroutine runs
	idle    sync.Cond  // on mu: writing became false
	closed  bool

	// The writer's, or Open's and Close's when none runs.
	f    *os.File
	prev string
	seq  uint64
	end  int64 // the file's size after this Log's last append or read

	syncs atomic.Uint64 // fsyncs of appended lines
}

// Open opens (creating it 0600) the log at path and reads its last line to
// continue the chain.
//
// # Errors
//
// A last line that is torn (no newline: a machine crash during a write) or
// whose own hash does not match is refused: run `rollbox audit verify-log`
// and move the file aside.
func Open(path string, opts Options) (*Log, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	l := &Log{path: path, opts: opts, f: f}
	l.idle.L = &l.mu
	if err := l.lock(); err != nil {
		f.Close()
		return nil, err
	}
	err = l.readTail()
	l.unlock()
	if err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

// Path is the log's file.
func (l *Log) Path() string { return l.path }

func (l *Log) lock() error {
	if err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("audit log %s: lock: %w", l.path, err)
	}
	return nil
}

func (l *Log) unlock() { syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN) }

// readTail sets prev, seq and end from the file's last line.
func (l *Log) readTail() error {
	st, err := l.f.Stat()
	if err != nil {
		return fmt.Errorf("audit log %s: %w", l.path, err)
	}
	size := st.Size()
	l.end = size
	if size == 0 {
		l.prev, l.seq = Genesis, 0
		return nil
	}
	n := min(size, maxLine+1)
	buf := make([]byte, n)
	if _, err := l.f.ReadAt(buf, size-n); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("audit log %s: %w", l.path, err)
	}
	if buf[len(buf)-1] != '\n' {
		return fmt.Errorf("audit log %s: the last line is torn (no newline at byte %d): run `rollbox audit verify-log %s` and move the file aside", l.path, size, l.path)
	}
	line := buf[:len(buf)-1]
	if i := bytes.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	} else if size > int64(len(buf)) {
		return fmt.Errorf("audit log %s: the last line is longer than %d bytes", l.path, maxLine)
	}
	rec, hash, err := parseLine(line)
	if err != nil {
		return fmt.Errorf("audit log %s: last line: %v: run `rollbox audit verify-log %s`", l.path, err, l.path)
	}
	l.prev, l.seq = hash, rec.Seq
	return nil
}

// Append completes r (version, sequence number, time if unset, the previous
// line's hash) and appends it as one line. With SyncEvery it returns once
// the line is on disk.
//
// Appends are committed in groups: they queue, and one goroutine (started
// by the first append that finds none running, gone when the queue is
// empty) takes everything queued, writes each line with its own write(2)
// under the flock and fsyncs once for the lot, then answers each append.
// Concurrent appenders so share one fsync instead of waiting in line for
// one each; an append alone costs what it did (one write, one fsync).
func (l *Log) Append(r Record) error {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	p := &pending{r: r, done: make(chan error, 1)}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("audit log %s: closed", l.path)
	}
	l.queue = append(l.queue, p)
	if !l.writing {
		l.writing = true
		go l.write()
	}
	l.mu.Unlock()
	return <-p.done
}

// pending is a queued append and where its answer goes.
type pending struct {
	r    Record
	done chan error
}

// write commits what is queued, batch after batch, until the queue is
// empty. One runs at a time (l.writing).
func (l *Log) write() {
	var spare []*pending
	for {
		l.mu.Lock()
		batch := l.queue
		if len(batch) == 0 {
			l.writing = false
			l.idle.Broadcast()
			l.mu.Unlock()
			return
		}
		l.queue = spare[:0]
		l.mu.Unlock()
		l.commit(batch)
		clear(batch)
		spare = batch
	}
}

// commit appends a batch of records and answers each: nil once its line is
// written (and, with SyncEvery, fsynced), or the error that kept it from
// being so. Before a rotation the lines already in the full file are
// fsynced and answered, so a rotation never holds a line that is not on
// disk.
func (l *Log) commit(batch []*pending) {
	answer := func(ps []*pending, err error) {
		for _, p := range ps {
			p.done <- err
		}
	}
	if err := l.lock(); err != nil {
		answer(batch, err)
		return
	}
	defer func() { l.unlock() }() // l.f may change
	if l.opts.MaxBytes > 0 {
		if err := l.followRotationLocked(); err != nil {
			answer(batch, err)
			return
		}
	}
	st, err := l.f.Stat()
	if err != nil {
		answer(batch, fmt.Errorf("audit log %s: %w", l.path, err))
		return
	}
	if st.Size() != l.end { // another writer appended: chain to its last line
		if err := l.readTail(); err != nil {
			answer(batch, err)
			return
		}
	}
	written := 0 // batch[done:written] are written, not yet answered
	done := 0
	flush := func() error {
		if written == done {
			return nil
		}
		if l.opts.Sync == SyncEvery {
			if err := l.f.Sync(); err != nil {
				err = fmt.Errorf("audit log %s: fsync: %w", l.path, err)
				answer(batch[done:written], err)
				done = written
				return err
			}
			l.syncs.Add(1)
		}
		answer(batch[done:written], nil)
		done = written
		return nil
	}
	for i, p := range batch {
		if l.opts.MaxBytes > 0 && l.end >= l.opts.MaxBytes {
			if err := flush(); err != nil {
				answer(batch[i:], err)
				return
			}
			if err := l.rotateLocked(l.end); err != nil {
				answer(batch[i:], err)
				return
			}
		}
		r := p.r
		r.V, r.Seq, r.Prev, r.Time = Version, l.seq+1, l.prev, r.Time.UTC()
		line, hash, err := encodeLine(r)
		if err != nil { // this record's own fault: the lines before it are answered first
			if err := flush(); err != nil {
				answer(batch[i:], err)
				return
			}
			p.done <- fmt.Errorf("audit log %s: %w", l.path, err)
			written++
			done++
			continue
		}
		if _, err := l.f.Write(line); err != nil {
			err = fmt.Errorf("audit log %s: %w", l.path, err)
			flush()
			answer(batch[i:], err)
			return
		}
		l.prev, l.seq, l.end = hash, r.Seq, l.end+int64(len(line))
		written++
	}
	flush()
}

// followRotationLocked: when another process rotated the log since this
// Log opened its file (PATH is now another file), it moves to the new PATH
// and takes its lock instead. Called with the old file's lock held, which
// the rotating process held throughout, so the new PATH is complete.
func (l *Log) followRotationLocked() error {
	for {
		cur, err := l.f.Stat()
		if err != nil {
			return fmt.Errorf("audit log %s: %w", l.path, err)
		}
		named, err := os.Stat(l.path)
		if err == nil && os.SameFile(cur, named) {
			return nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("audit log %s: %w", l.path, err)
		}
		f, err := os.OpenFile(l.path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
		l.unlock()
		l.f.Close()
		l.f = f
		if err := l.lock(); err != nil {
			return err
		}
		if err := l.readTail(); err != nil {
			return err
		}
	}
}

// rotateLocked replaces the full log (size bytes, this Log's lock held) by
// a new one whose first line is a rotate record sealing the full one's
// end. PATH never goes missing: the new file is written aside, locked, and
// renamed over PATH after the full one was linked to PATH.1.
func (l *Log) rotateLocked(size int64) error {
	keep := l.opts.Keep
	if keep <= 0 {
		keep = DefaultKeep
	}
	dir, base := filepath.Dir(l.path), filepath.Base(l.path)
	// O_APPEND like every writer's file: another process that follows the
	// rotation appends to it too.
	tmpName := filepath.Join(dir, fmt.Sprintf(".%s.rotate-%d-%d", base, os.Getpid(), time.Now().UnixNano()))
	tmp, err := os.OpenFile(tmpName, os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("audit log %s: rotate: %w", l.path, err)
	}
	fail := func(err error) error {
		tmp.Close()
		os.Remove(tmpName)
		return fmt.Errorf("audit log %s: rotate: %w", l.path, err)
	}
	if err := syscall.Flock(int(tmp.Fd()), syscall.LOCK_EX); err != nil {
		return fail(err)
	}
	r := Record{V: Version, Seq: 1, Time: time.Now().UTC(), Op: OpRotate, Prev: Genesis,
		Rotated: &Rotated{LastSeq: l.seq, Head: l.prev, Bytes: size}}
	line, hash, err := encodeLine(r)
	if err != nil {
		return fail(err)
	}
	if _, err := tmp.Write(line); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	// A rotation killed between its link and its rename left PATH.1 the
	// full file itself: it is linked again below, not shifted.
	if cur, err := l.f.Stat(); err == nil {
		if one, err := os.Stat(l.path + ".1"); err == nil && os.SameFile(cur, one) {
			if err := os.Remove(l.path + ".1"); err != nil {
				return fail(err)
			}
		}
	}
	os.Remove(fmt.Sprintf("%s.%d", l.path, keep))
	for i := keep - 1; i >= 1; i-- {
		os.Rename(fmt.Sprintf("%s.%d", l.path, i), fmt.Sprintf("%s.%d", l.path, i+1))
	}
	if err := os.Link(l.path, l.path+".1"); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmpName, l.path); err != nil {
		os.Remove(l.path + ".1")
		return fail(err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	// Others blocked on the full file's lock find PATH replaced and follow.
	l.unlock()
	l.f.Close()
	l.f = tmp
	l.prev, l.seq, l.end = hash, 1, int64(len(line))
	return nil
}

// Close refuses further appends, waits for those queued to be written
// (and answered) and closes the file. Idempotent.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	for l.writing {
		l.idle.Wait()
	}
	return l.f.Close()
}

// A line is the record's JSON object with one more member at the end,
// "hash": the SHA-256 of that object without it (the bytes as written).
// Each record carries the hash of the line before it in "prev", so editing
// or deleting a line breaks the chain at it or at the next one.
const hashMember = `,"hash":"`

func encodeLine(r Record) (line []byte, hash string, err error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, "", err
	}
	hash = hexSum(body)
	line = make([]byte, 0, len(body)+len(hashMember)+len(hash)+3)
	line = append(line, body[:len(body)-1]...)
	line = append(line, hashMember...)
	line = append(line, hash...)
	line = append(line, '"', '}', '\n')
	return line, hash, nil
}

// parseLine checks a line's own hash and decodes it.
func parseLine(line []byte) (Record, string, error) {
	const tail = 64 + 2 // hex digits, quote, brace
	if len(line) < len(hashMember)+tail+2 || !bytes.HasSuffix(line, []byte(`"}`)) {
		return Record{}, "", errors.New("does not end with its hash")
	}
	i := len(line) - tail - len(hashMember)
	if string(line[i:i+len(hashMember)]) != hashMember {
		return Record{}, "", errors.New("does not end with its hash")
	}
	hash := string(line[i+len(hashMember) : len(line)-2])
	body := append(append([]byte{}, line[:i]...), '}')
	if got := hexSum(body); got != hash {
		return Record{}, "", fmt.Errorf("its hash is %s, but its content hashes to %s: the line was edited", short(hash), short(got))
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Record{}, "", fmt.Errorf("not a record: %v", err)
	}
	if r.V != Version {
		return Record{}, "", fmt.Errorf("version %d, want %d", r.V, Version)
	}
	return r, hash, nil
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// VerifyError names the first line that breaks the chain.
type VerifyError struct {
	Line   int // 1-based
	Reason string
}

func (e *VerifyError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Reason) }

// Summary describes a log that verified.
type Summary struct {
	Lines   int
	Head    string // the last line's hash: keep it elsewhere to detect a truncation later
	First   time.Time
	Last    time.Time
	Sandbox int // sandboxes created
	Execs   int
	Writes  int
	// EpisodeIDs are the episodes named, sorted: a total over rotated
	// files counts an episode once (Total).
	EpisodeIDs []string
	// LastSeq is the last line's sequence number.
	LastSeq uint64
	// Rotated is the first line's description of the log this one
	// replaced, when it started with a rotate record.
	Rotated *Rotated
}

// Verify reads a whole log and checks every line's own hash, that its prev
// is the hash of the line before (Genesis for the first) and that sequence
// numbers count up from 1. The error is a *VerifyError naming the first bad
// line, or the reader's error.
//
// # Notes
//
// A chain cannot show that lines were cut off its end: compare Head with a
// copy kept elsewhere (the last hash a monitoring system saw).
func Verify(r io.Reader) (Summary, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var s Summary
	prev, seq := Genesis, uint64(0)
	episodes := map[string]bool{}
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		for errors.Is(err, bufio.ErrBufferFull) {
			more, err2 := br.ReadSlice('\n')
			line = append(append([]byte{}, line...), more...)
			if len(line) > maxLine {
				return s, &VerifyError{Line: n, Reason: fmt.Sprintf("longer than %d bytes", maxLine)}
			}
			err = err2
		}
		if len(line) == 0 && errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return s, err
		}
		if !bytes.HasSuffix(line, []byte("\n")) {
			return s, &VerifyError{Line: n, Reason: "torn: no newline at the end of the file"}
		}
		rec, hash, perr := parseLine(bytes.TrimSuffix(line, []byte("\n")))
		switch {
		case perr != nil:
			return s, &VerifyError{Line: n, Reason: perr.Error()}
		case rec.Prev != prev:
			reason := fmt.Sprintf("prev is %s, but the line before hashes to %s: a line before it was edited, deleted or inserted", short(rec.Prev), short(prev))
			if n == 1 {
				reason = fmt.Sprintf("prev is %s, not the genesis hash: the log's first lines were removed", short(rec.Prev))
			}
			return s, &VerifyError{Line: n, Reason: reason}
		case rec.Seq != seq+1:
			return s, &VerifyError{Line: n, Reason: fmt.Sprintf("seq %d follows %d", rec.Seq, seq)}
		}
		prev, seq = hash, rec.Seq
		s.Lines, s.Head, s.LastSeq = n, hash, rec.Seq
		if n == 1 {
			s.First = rec.Time
			if rec.Op == OpRotate {
				s.Rotated = rec.Rotated
			}
		}
		s.Last = rec.Time
		switch rec.Op {
		case OpCreate:
			s.Sandbox++
		case OpExec:
			s.Execs++
		case OpWrite:
			s.Writes++
		}
		if rec.Episode != "" {
			episodes[rec.Episode] = true
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	s.EpisodeIDs = slices.Sorted(maps.Keys(episodes))
	return s, nil
}

// Total sums the summaries of a log's files, oldest first (VerifyFiles'
// answer): counts added up, an episode whose records span a rotation
// counted once, First from the oldest and Last, Head and LastSeq from the
// newest.
func Total(sums []Summary) Summary {
	var t Summary
	if len(sums) == 0 {
		return t
	}
	episodes := map[string]bool{}
	for _, s := range sums {
		t.Lines += s.Lines
		t.Sandbox += s.Sandbox
		t.Execs += s.Execs
		t.Writes += s.Writes
		for _, id := range s.EpisodeIDs {
			episodes[id] = true
		}
	}
	first, last := sums[0], sums[len(sums)-1]
	t.First, t.Rotated = first.First, first.Rotated
	t.Last, t.Head, t.LastSeq = last.Last, last.Head, last.LastSeq
	t.EpisodeIDs = slices.Sorted(maps.Keys(episodes))
	return t
}

// VerifyFiles verifies a log and the files it rotated away, given oldest
// first (PATH.2, PATH.1, PATH): each on its own as Verify does, and each
// after the first must start with a rotate record sealing the end of the
// one before it. The error names the file (*FileError).
func VerifyFiles(paths []string) ([]Summary, error) {
	var out []Summary
	for i, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return out, err
		}
		s, err := Verify(f)
		f.Close()
		out = append(out, s)
		if err != nil {
			return out, &FileError{Path: p, Err: err}
		}
		if i == 0 {
			continue
		}
		before := out[i-1]
		switch r := s.Rotated; {
		case r == nil:
			return out, &FileError{Path: p, Err: &VerifyError{Line: 1, Reason: fmt.Sprintf("not a rotate record: this log does not continue %s", paths[i-1])}}
		case r.LastSeq != before.LastSeq || r.Head != before.Head:
			return out, &FileError{Path: p, Err: &VerifyError{Line: 1, Reason: fmt.Sprintf("the log it continues ended at seq %d, hash %s, but %s ends at seq %d, hash %s: its end was cut or edited, or it is not the file before",
				r.LastSeq, short(r.Head), paths[i-1], before.LastSeq, short(before.Head))}}
		}
	}
	return out, nil
}

// FileError is a VerifyFiles error with the file it is about.
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }
