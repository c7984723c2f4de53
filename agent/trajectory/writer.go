package trajectory

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// PartialSuffix names the append-only journal of an episode in flight.
const PartialSuffix = ".json.partial"

// journal line kinds
const (
	lineHeader  = "header"
	lineSandbox = "sandbox"
	lineStep    = "step"
	lineEvent   = "event"
	lineEnd     = "end"
	// lineSubagent: an orchestrator's sub-episode, as it ended.
	lineSubagent = "subagent"
)

type journalLine struct {
	K string          `json:"k"`
	V json.RawMessage `json:"v"`
}

type endRecord struct {
	Termination *Termination `json:"termination"`
	Reward      *Reward      `json:"reward"`
	Stats       Stats        `json:"stats"`
	EndedAt     time.Time    `json:"ended_at"`
	Monitors    *Monitors    `json:"monitors,omitempty"`
}

// Writer records one episode under Dir: every call appends one line to
// <episode_id>.json.partial with one write (a crash of the process loses at
// most the line being written; the journal stays open between lines, which
// costs a descriptor per episode in flight and saves an open and a close a
// step), and End writes <episode_id>.json atomically and removes the
// journal. Safe for concurrent use.
type Writer struct {
	mu      sync.Mutex
	dir     string
	partial string
	final   string
	f       *os.File // the journal, open from the first line to End
	t       *Trajectory
	ended   bool
	// nsteps counts the steps recorded. A running episode does not hold
	// them: a step is in its journal once written, and t.Steps is brought
	// up to date from the journal only when the record is read whole
	// (Trajectory: the monitors, the verifier and End read it as the
	// episode ends). A step is a 600-byte struct and the strings it points
	// to, the policy's raw answer among them: with thousands of episodes
	// running at once, their steps were most of the service's peak heap.
	// unwritten keeps, as JSON, the steps the journal did not take (a full
	// disk): the record still has them. base is where this writer's lines
	// start in the journal.
	nsteps    int
	unwritten map[int][]byte
	base      int64
	// tee, when set, is given every journal line after it is written.
	tee func(line []byte) error
	// outside, when set, runs End's waits for the disk (the final
	// document's write and fsyncs) (SetOutside).
	outside func(wait func())
}

// SetOutside has End run its waits for the disk (writing the final
// document, its fsync and the directory's) through outside, which calls
// wait: the rollout service gives its CPU gate's turn back for them
// (internal/cpugate), while the document's encoding stays inside.
func (w *Writer) SetOutside(outside func(wait func())) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.outside = outside
}

// NewWriter starts the record of t in dir, writing its header at once.
func NewWriter(dir string, t *Trajectory) (*Writer, error) { return NewWriterTee(dir, t, nil) }

// NewWriterTee is NewWriter whose every journal line (header, sandbox,
// steps, events, sub-agents, end; without its newline) is also given to tee
// once written, in order, under the writer's lock: a cluster worker streams
// the journal to its coordinator this way. An error of tee is the line's.
func NewWriterTee(dir string, t *Trajectory, tee func(line []byte) error) (*Writer, error) {
	if t.EpisodeID == "" || strings.ContainsAny(t.EpisodeID, `/\`) || strings.HasPrefix(t.EpisodeID, ".") {
		return nil, fmt.Errorf("trajectory: episode id %q is not a safe file name", t.EpisodeID)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	t.Schema = Schema
	if t.Steps == nil {
		t.Steps = []Step{}
	}
	if t.ContextEvents == nil {
		t.ContextEvents = []ContextEvent{}
	}
	w := &Writer{dir: dir, t: t, tee: tee,
		partial: filepath.Join(dir, t.EpisodeID+PartialSuffix),
		final:   filepath.Join(dir, t.EpisodeID+".json"), nsteps: len(t.Steps)}
	head := *t
	head.Steps, head.ContextEvents = nil, nil
	if err := w.append(lineHeader, head); err != nil {
		w.discard()
		return nil, err
	}
	return w, nil
}

// discard closes and removes the journal and any half-written final
// document: a record that could not be written leaves nothing behind that a
// later recovery would take for the episode's (an empty or torn journal on
// a full disk).
func (w *Writer) discard() {
	w.closeJournal()
	os.Remove(w.partial)
	os.Remove(w.final + tmpSuffix)
}

// Discard removes a record that will never end (a fork abandoned midway):
// its journal and any half-written document.
func (w *Writer) Discard() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	w.discard()
}

// Path is the final document's path.
func (w *Writer) Path() string { return w.final }

// Trajectory returns the record as it stands (not a copy: don't mutate).
func (w *Writer) Trajectory() *Trajectory {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.decodeStepsLocked()
	return w.t
}

// Steps is the number of steps recorded so far.
func (w *Writer) Steps() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nsteps
}

// decodeStepsLocked brings t.Steps up to date: the steps recorded since
// are read back from the journal (or from unwritten).
func (w *Writer) decodeStepsLocked() {
	have := len(w.t.Steps)
	if have >= w.nsteps {
		return
	}
	got := make([]Step, w.nsteps-have)
	found := make([]bool, len(got))
	place := func(b []byte) {
		var st Step
		if json.Unmarshal(b, &st) == nil && st.Index >= have && st.Index < w.nsteps {
			got[st.Index-have], found[st.Index-have] = st, true
		}
	}
	var readErr error
	if w.f != nil {
		var b []byte
		if b, readErr = readFrom(w.partial, w.base); readErr == nil {
			for line := range bytes.Lines(b) {
				if v, ok := bytes.CutPrefix(bytes.TrimSuffix(line, []byte("\n")), stepLinePrefix); ok && len(v) > 0 && v[len(v)-1] == '}' {
					place(v[:len(v)-1])
				}
			}
		}
	}
	for _, b := range w.unwritten {
		place(b)
	}
	w.unwritten = nil
	for i := range got {
		if !found[i] {
			// The journal was removed or cut from outside.
			msg := "rollbox could not read this step back from the episode's journal"
			if readErr != nil {
				msg += ": " + readErr.Error()
			}
			got[i] = Step{Index: have + i, Type: StepTool, Error: msg}
		}
	}
	w.t.Steps = append(w.t.Steps, got...)
}

// stepLinePrefix starts a step's journal line (appendJSON's).
var stepLinePrefix = []byte(`{"k":"` + lineStep + `","v":`)

// readFrom reads the file at path from offset on.
func readFrom(path string, offset int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

func (w *Writer) append(kind string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("trajectory %s: %w", kind, err)
	}
	return w.appendJSON(kind, b)
}

// appendJSON appends a line of kind whose value is b (json.Marshal's: compact).
func (w *Writer) appendJSON(kind string, b []byte) error {
	line := make([]byte, 0, len(b)+len(kind)+len(`{"k":"","v":}`)+1)
	line = append(append(append(append(line, `{"k":"`...), kind...), `","v":`...), b...)
	line = append(line, '}')
	if w.f == nil {
		f, err := os.OpenFile(w.partial, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("trajectory: %w", err)
		}
		w.f = f
		if fi, err := f.Stat(); err == nil {
			w.base = fi.Size()
		}
	}
	if _, err := w.f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("trajectory: %w", err)
	}
	if w.tee != nil {
		if err := w.tee(line); err != nil {
			return fmt.Errorf("trajectory %s: %w", kind, err)
		}
	}
	return nil
}

// closeJournal closes the journal file (End, or a failed NewWriter).
func (w *Writer) closeJournal() error {
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// SetSandbox records the sandbox as it really runs.
func (w *Writer) SetSandbox(s Sandbox) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Sandbox = s
	return w.append(lineSandbox, s)
}

// SetMonitors sets the episode's monitors, recorded with its end (call it
// before End).
func (w *Writer) SetMonitors(m *Monitors) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Monitors = m
}

// Subagent records one of an orchestrator's sub-episodes as it ends.
func (w *Writer) Subagent(s Subagent) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return errors.New("trajectory: subagent after end")
	}
	w.t.Subagents = append(w.t.Subagents, s)
	return w.append(lineSubagent, s)
}

// Step appends a step, numbering it.
func (w *Writer) Step(s Step) (Step, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return s, errors.New("trajectory: step after end")
	}
	s.Index = w.nsteps
	w.nsteps++
	b, err := json.Marshal(s)
	if err != nil {
		// Kept whole: the record has it even if the journal cannot.
		w.decodeStepsLocked()
		w.t.Steps = append(w.t.Steps, s)
		return s, fmt.Errorf("trajectory %s: %w", lineStep, err)
	}
	if err := w.appendJSON(lineStep, b); err != nil {
		if w.unwritten == nil {
			w.unwritten = map[int][]byte{}
		}
		w.unwritten[s.Index] = b
		return s, err
	}
	return s, nil
}

// Event appends a context event.
func (w *Writer) Event(e ContextEvent) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.ContextEvents = append(w.t.ContextEvents, e)
	return w.append(lineEvent, e)
}

// End records the termination and reward and writes the final document,
// durable when End returns nil (written, fsynced, renamed into place, the
// directory fsynced), so that an index may then say the episode ended.
// When it fails, the journal is removed too: the episode has no record.
// It is idempotent: a second End is ignored.
func (w *Writer) End(term *Termination, reward *Reward, stats Stats) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return nil
	}
	w.ended = true
	now := time.Now().UTC()
	w.t.Termination, w.t.Reward, w.t.Stats, w.t.EndedAt = term, reward, stats, &now
	w.decodeStepsLocked()
	w.t.Segments, _ = BuildSegments(w.t.Steps) // the steps are the record; a bad segment leaves none
	if w.t.Parent != nil {
		// A sub-episode's turns are the frozen sub-agent policy's: none
		// of its ids is trained on.
		for i := range w.t.Segments {
			clear(w.t.Segments[i].LossMask)
		}
	}
	if err := w.append(lineEnd, endRecord{term, reward, stats, now, w.t.Monitors}); err != nil {
		w.discard()
		return err
	}
	if err := w.closeJournal(); err != nil {
		w.discard()
		return fmt.Errorf("trajectory: %w", err)
	}
	doc, err := marshalDocument(w.t)
	if err == nil {
		write := func() { err = WriteDocument(w.final, doc) }
		if w.outside != nil {
			w.outside(write)
		} else {
			write()
		}
	}
	if err != nil {
		w.discard()
		return err
	}
	return os.Remove(w.partial)
}

// tmpSuffix names a final document being written.
const tmpSuffix = ".tmp"

// WriteFile writes t to path durably and atomically: a temp file written
// and fsynced, renamed into place, the directory fsynced. A failure leaves
// no temp file.
func WriteFile(path string, t *Trajectory) error {
	if err := writeTemp(path, t, true); err != nil {
		return err
	}
	return commitTemp(path)
}

// WriteDocument writes a final document WriteFile wrote elsewhere (doc,
// without its closing newline, as ReadDocument gives it) to path, as
// durably and atomically as WriteFile, without decoding or encoding it: a
// cluster coordinator stores the record its worker wrote.
func WriteDocument(path string, doc []byte) error {
	if err := writeTempBytes(path, doc, true); err != nil {
		return err
	}
	return commitTemp(path)
}

// CommitDocument is WriteDocument in a group commit: the documents
// committed to one directory while a commit runs are written together, made
// durable by one syncfs(2) of their file system instead of an fsync each,
// then renamed into place and the directory fsynced once (dirSyncs). It
// returns once doc is durable and whole at path, as WriteDocument does. A
// cluster coordinator stores its workers' records so: their fsyncs, one an
// episode, were its largest cost per episode.
func CommitDocument(path string, doc []byte) error { return docCommits.commit(path, doc) }

// docCommits are CommitDocument's group commits, one a directory.
var docCommits = &docCommitter{dirs: map[string]*docQueue{}}

type docCommitter struct {
	mu   sync.Mutex
	dirs map[string]*docQueue
	// syncs counts the file-system syncs made; hook, if set, runs before
	// each batch is written (tests).
	syncs atomic.Int64
	hook  func()
}

// docQueue is one directory's documents to commit (under docCommitter.mu);
// busy while a goroutine commits a batch of them.
type docQueue struct {
	busy    bool
	pending []*docWrite
}

type docWrite struct {
	path string
	doc  []byte
	err  error
	done chan struct{}
}

func (x *docCommitter) commit(path string, doc []byte) error {
	dir := filepath.Dir(path)
	w := &docWrite{path: path, doc: doc, done: make(chan struct{})}
	x.mu.Lock()
	q := x.dirs[dir]
	if q == nil {
		q = &docQueue{}
		x.dirs[dir] = q
	}
	q.pending = append(q.pending, w)
	lead := !q.busy
	q.busy = true
	x.mu.Unlock()
	if lead {
		x.lead(dir, q)
	}
	<-w.done
	return w.err
}

// lead commits q's pending documents as one batch; those that came
// meanwhile are the next batch, led by a goroutine of its own (the caller
// returns with its own batch).
func (x *docCommitter) lead(dir string, q *docQueue) {
	x.mu.Lock()
	batch := q.pending
	q.pending = nil
	x.mu.Unlock()
	x.write(dir, batch)
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(q.pending) == 0 {
		q.busy = false
		delete(x.dirs, dir)
		return
	}
	go x.lead(dir, q)
}

// write commits a batch: each document to its temp file, one syncfs of the
// file system (an fsync of each temp file, should it fail: which one failed
// is not known), the renames, one fsync of the directory.
func (x *docCommitter) write(dir string, batch []*docWrite) {
	defer func() {
		for _, w := range batch {
			close(w.done)
		}
	}()
	if x.hook != nil {
		x.hook()
	}
	var written []*docWrite
	for _, w := range batch {
		if w.err = writeTempBytes(w.path, w.doc, false); w.err == nil {
			written = append(written, w)
		}
	}
	if len(written) == 0 {
		return
	}
	x.syncs.Add(1)
	if err := SyncFS(dir); err != nil {
		for _, w := range written {
			w.err = fsyncFile(w.path + tmpSuffix)
		}
	}
	var renamed []*docWrite
	for _, w := range written {
		if w.err == nil {
			if w.err = os.Rename(w.path+tmpSuffix, w.path); w.err == nil {
				renamed = append(renamed, w)
				continue
			}
		}
		os.Remove(w.path + tmpSuffix)
	}
	if len(renamed) == 0 {
		return
	}
	if err := dirSyncs.sync(dir); err != nil {
		for _, w := range renamed {
			w.err = err
		}
	}
}

// fsyncFile fsyncs the file at path.
func fsyncFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// commitTemp renames path's fsynced temp file into place and fsyncs the
// directory; a failed rename removes the temp file.
func commitTemp(path string) error {
	if err := os.Rename(path+tmpSuffix, path); err != nil {
		os.Remove(path + tmpSuffix)
		return err
	}
	return dirSyncs.sync(filepath.Dir(path))
}

// dirSyncs makes the renames of commitTemp durable with as few directory
// fsyncs as callers allow: a group commit per directory. Each caller
// returns once an fsync of the directory that began after its rename has
// ended; the callers that arrive while one runs share the next. (A
// coordinator storing the records of hundreds of workers' episodes at once
// paid an open, an fsync and a close of DATA/episodes for each.)
var dirSyncs = &dirSyncer{dirs: map[string]*dirSync{}}

type dirSyncer struct {
	mu   sync.Mutex
	dirs map[string]*dirSync
	// fsyncs counts the directory fsyncs made; hook, if set, runs before
	// each (tests).
	fsyncs atomic.Int64
	hook   func()
}

// dirSync is one directory's group commit (under dirSyncer.mu).
type dirSync struct {
	cond    *sync.Cond
	busy    bool
	started uint64 // fsyncs begun
	ended   uint64 // fsyncs ended
	err     error  // of the last ended
	waiters int
}

func (x *dirSyncer) sync(dir string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	d := x.dirs[dir]
	if d == nil {
		d = &dirSync{cond: sync.NewCond(&x.mu)}
		x.dirs[dir] = d
	}
	d.waiters++
	defer func() {
		if d.waiters--; d.waiters == 0 && !d.busy {
			delete(x.dirs, dir)
		}
	}()
	want := d.started + 1 // the next fsync to begin: it begins after this rename
	for d.ended < want {
		if d.busy {
			d.cond.Wait()
			continue
		}
		d.busy = true
		d.started++
		n := d.started
		x.mu.Unlock()
		if x.hook != nil {
			x.hook()
		}
		err := syncDir(dir)
		x.fsyncs.Add(1)
		x.mu.Lock()
		d.busy, d.ended, d.err = false, n, err
		d.cond.Broadcast()
	}
	return d.err
}

// writeTemp writes t to path + tmpSuffix (fsynced when sync is set).
func writeTemp(path string, t *Trajectory, sync bool) (err error) {
	b, err := marshalDocument(t)
	if err != nil {
		return err
	}
	return writeTempBytes(path, b, sync)
}

// marshalDocument encodes t as its final document (without the newline).
func marshalDocument(t *Trajectory) ([]byte, error) {
	// A token-mode record (one with segments) is written compact: its id
	// arrays indented would take a line an id.
	marshal := func(v any) ([]byte, error) { return json.MarshalIndent(v, "", " ") }
	if len(t.Segments) > 0 {
		marshal = json.Marshal
	}
	b, err := marshal(t)
	if err != nil {
		return nil, fmt.Errorf("trajectory %s: %w", t.EpisodeID, err)
	}
	return b, nil
}

// writeTempBytes writes b and a newline to path + tmpSuffix (fsynced when
// sync is set).
func writeTempBytes(path string, b []byte, sync bool) (err error) {
	tmp := path + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(append(b, '\n')); err != nil {
		return err
	}
	if sync {
		return f.Sync()
	}
	return nil
}

// syncDir fsyncs a directory, so the renames into it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// writeFilesAtOnce is how many records WriteFiles writes at once.
const writeFilesAtOnce = 8

// WriteFiles writes each trajectory to dir/<episode_id>.json as WriteFile
// does, but makes them durable together: one sync of the file system after
// every rename instead of two fsyncs each, for the thousands of records a
// recovery or a cancellation writes at once. errs[i] is ts[i]'s failure
// (every one fails when the final sync does). Until it returns, any of them
// may be missing or empty after a crash: index them only afterwards.
func WriteFiles(dir string, ts []*Trajectory) (errs []error) {
	errs = make([]error, len(ts))
	var wrote atomic.Bool
	write := func(i int) {
		t := ts[i]
		if t.EpisodeID == "" || strings.ContainsAny(t.EpisodeID, `/\`) || strings.HasPrefix(t.EpisodeID, ".") {
			errs[i] = fmt.Errorf("trajectory: episode id %q is not a safe file name", t.EpisodeID)
			return
		}
		path := filepath.Join(dir, t.EpisodeID+".json")
		if errs[i] = writeTemp(path, t, false); errs[i] != nil {
			return
		}
		if errs[i] = os.Rename(path+tmpSuffix, path); errs[i] != nil {
			os.Remove(path + tmpSuffix)
			return
		}
		wrote.Store(true)
	}
	// A few at a time: each file is an encoding (CPU) and three system
	// calls that may wait on the file system's journal, and the records of
	// thousands of episodes (a cancellation, a recovery) written one after
	// the other took 2.7 s for 4,088 on an idle disk, 12-35 s on a busy one.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(writeFilesAtOnce, len(ts)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(ts); i = int(next.Add(1) - 1) {
				write(i)
			}
		}()
	}
	wg.Wait()
	if !wrote.Load() {
		return errs
	}
	if err := SyncFS(dir); err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	return errs
}

// SyncFS flushes the file system holding dir to disk (syncfs(2)): every
// file written there so far, and every rename, is durable when it returns.
func SyncFS(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// ErrNewerSchema is returned for a document written by a newer Rollbox.
var ErrNewerSchema = errors.New("trajectory written by a newer schema")

// Read reads a trajectory document, refusing schemas it does not know.
func Read(path string) (*Trajectory, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Decode(b)
}

// Decode parses a trajectory document.
func Decode(b []byte) (*Trajectory, error) {
	var probe struct {
		Schema string `json:"schema"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("trajectory: not JSON: %w", err)
	}
	if probe.Schema != Schema {
		if strings.HasPrefix(probe.Schema, "rollbox.trajectory/") {
			return nil, fmt.Errorf("trajectory schema %q (this rollbox reads %s): %w; upgrade rollbox", probe.Schema, Schema, ErrNewerSchema)
		}
		return nil, fmt.Errorf("trajectory: schema %q is not %s", probe.Schema, Schema)
	}
	var t Trajectory
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("trajectory: %w", err)
	}
	return &t, nil
}

// noHeaderError is a journal with nothing in it to recover.
type noHeaderError struct{ path string }

func (e *noHeaderError) Error() string {
	return fmt.Sprintf("trajectory journal %s: no header", e.path)
}

// Recover rebuilds the trajectory a crashed writer left in a journal. An
// episode that had not ended is marked interrupted; a torn last line (the
// step in flight) is dropped and counted in the termination message.
func Recover(partial string) (*Trajectory, error) {
	f, err := os.Open(partial)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var t *Trajectory
	torn := 0
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var jl journalLine
			if jerr := json.Unmarshal(line, &jl); jerr != nil {
				torn++
			} else if t == nil && jl.K != lineHeader {
				return nil, fmt.Errorf("trajectory journal %s: first line is %q, not a header", partial, jl.K)
			} else {
				if derr := apply(&t, jl); derr != nil {
					torn++
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if t == nil {
		return nil, &noHeaderError{partial}
	}
	if t.Termination == nil {
		now := time.Now().UTC()
		t.EndedAt = &now
		msg := "the process recording this episode stopped before it ended"
		if torn > 0 {
			msg += fmt.Sprintf("; %d torn journal line(s) dropped", torn)
		}
		t.Termination = &Termination{Reason: EndInterrupted, Message: msg, Step: len(t.Steps) - 1}
		t.Reward = nil
		t.Stats = statsOf(t)
	}
	t.Segments, _ = BuildSegments(t.Steps)
	if t.Parent != nil {
		// A sub-episode's turns are the frozen sub-agent policy's (see End).
		for i := range t.Segments {
			clear(t.Segments[i].LossMask)
		}
	}
	return t, nil
}

// statsOf totals the steps of a trajectory that never recorded its end.
func statsOf(t *Trajectory) Stats {
	st := Stats{ToolErrors: map[string]int{}}
	for _, s := range t.Steps {
		switch s.Type {
		case StepModel:
			st.Turns++
			st.PolicyMS += s.DurationMS
			if s.Usage != nil {
				st.PromptTokens += s.Usage.PromptTokens
				st.CompletionTokens += s.Usage.CompletionTokens
			}
			if s.PolicyVersion != "" {
				if st.PolicyVersions == nil {
					st.PolicyVersions = map[string]int{}
				}
				st.PolicyVersions[s.PolicyVersion]++
			}
		case StepTool:
			st.ToolCalls++
			st.ToolMS += s.DurationMS
			if s.ErrorKind != nil {
				st.ToolErrors[*s.ErrorKind]++
			}
			if s.OutputCut() {
				if st.Truncated == nil {
					st.Truncated = &Truncations{}
				}
				st.Truncated.Count(s.Name)
			}
		}
	}
	if t.EndedAt != nil {
		st.DurationMS = float64(t.EndedAt.Sub(t.StartedAt)) / float64(time.Millisecond)
	}
	if t.IsOrchestrator() {
		crit, total, n := CriticalSteps(t), st.Turns, len(t.Subagents)
		for _, sa := range t.Subagents {
			total += sa.Steps
		}
		st.CriticalSteps, st.TotalSteps, st.Subagents = &crit, &total, &n
	}
	return st
}

// IsOrchestrator says whether the record is an orchestrator episode's (its
// task has an orchestrator object, or it lists sub-agents).
func (t *Trajectory) IsOrchestrator() bool {
	if len(t.Subagents) > 0 {
		return true
	}
	var task struct {
		Orchestrator json.RawMessage `json:"orchestrator"`
	}
	return json.Unmarshal(t.Task, &task) == nil && len(task.Orchestrator) > 0 && string(task.Orchestrator) != "null"
}

// CriticalSteps computes an orchestrator record's critical steps from its
// tree: its model turns plus, for each stage, the most turns of the
// stage's sub-agents on the critical path. It is what stats.critical_steps
// holds.
func CriticalSteps(t *Trajectory) int {
	turns := 0
	for _, st := range t.Steps {
		if st.Type == StepModel {
			turns++
		}
	}
	most := map[int]int{}
	for _, sa := range t.Subagents {
		if sa.OnCriticalPath() {
			most[sa.Stage] = max(most[sa.Stage], sa.Steps)
		}
	}
	for _, m := range most {
		turns += m
	}
	return turns
}

// AppendSubagents adds sub-agent lines to the journal of an episode that
// is not running (a recovery: the sub-episodes its process left without
// telling it), made durable before it returns. A torn last line stays a
// line of its own (dropped by Recover).
func AppendSubagents(partial string, subs []Subagent) error {
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var buf bytes.Buffer
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err == nil && last[0] != '\n' {
			buf.WriteByte('\n')
		}
	}
	for _, s := range subs {
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		line, _ := json.Marshal(journalLine{K: lineSubagent, V: b})
		buf.Write(append(line, '\n'))
	}
	if _, err := f.Write(buf.Bytes()); err != nil {
		return err
	}
	return f.Sync()
}

func apply(t **Trajectory, jl journalLine) error {
	switch jl.K {
	case lineHeader:
		var h Trajectory
		if err := json.Unmarshal(jl.V, &h); err != nil {
			return err
		}
		h.Steps, h.ContextEvents = []Step{}, []ContextEvent{}
		*t = &h
	case lineSandbox:
		return json.Unmarshal(jl.V, &(*t).Sandbox)
	case lineStep:
		var s Step
		if err := json.Unmarshal(jl.V, &s); err != nil {
			return err
		}
		(*t).Steps = append((*t).Steps, s)
	case lineEvent:
		var e ContextEvent
		if err := json.Unmarshal(jl.V, &e); err != nil {
			return err
		}
		(*t).ContextEvents = append((*t).ContextEvents, e)
	case lineSubagent:
		var s Subagent
		if err := json.Unmarshal(jl.V, &s); err != nil {
			return err
		}
		(*t).Subagents = append((*t).Subagents, s)
	case lineEnd:
		var e endRecord
		if err := json.Unmarshal(jl.V, &e); err != nil {
			return err
		}
		(*t).Termination, (*t).Reward, (*t).Stats, (*t).EndedAt, (*t).Monitors = e.Termination, e.Reward, e.Stats, &e.EndedAt, e.Monitors
	}
	return nil
}

// Leftovers are the files a stopped process left in an episodes
// directory: its episodes' journals and half-written final documents. A
// process that starts episodes in the directory while it recovers lists
// them before it starts any (FindLeftovers) and recovers just those
// (Recover): its own episodes' journals are never finalized under them.
type Leftovers struct {
	Dir      string
	Journals []string // <episode_id>.json.partial
	Temps    []string // <episode_id>.json.tmp
}

// FindLeftovers lists the journals and half-written documents in dir (none
// when dir does not exist).
func FindLeftovers(dir string) (*Leftovers, error) {
	l := &Leftovers{Dir: dir}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		switch name := e.Name(); {
		case strings.HasSuffix(name, PartialSuffix):
			l.Journals = append(l.Journals, filepath.Join(dir, name))
		case strings.HasSuffix(name, ".json"+tmpSuffix):
			l.Temps = append(l.Temps, filepath.Join(dir, name))
		}
	}
	return l, nil
}

// RecoverDir finalizes every journal left in dir (FindLeftovers, then
// Recover): for a directory no process writes to meanwhile.
func RecoverDir(dir string) (recovered []*Trajectory, dropped []string, err error) {
	l, err := FindLeftovers(dir)
	if err != nil {
		return nil, nil, err
	}
	return l.Recover()
}

// Recover finalizes the journals listed: each becomes a <episode_id>.json
// (interrupted unless it had ended) and the journal is removed; the
// documents are made durable together (WriteFiles) before any journal goes.
// A journal without a header (empty, or torn at its first line: the disk
// filled as the episode began) holds nothing to keep: it is removed and its
// episode id returned in dropped. A journal whose final document is already
// there (a crash between the two) is removed, and so is every half-written
// final document listed. Journals are read in parallel.
func (l *Leftovers) Recover() (recovered []*Trajectory, dropped []string, err error) {
	dir, matches := l.Dir, l.Journals
	for _, p := range l.Temps {
		os.Remove(p)
	}
	type result struct {
		t    *Trajectory
		err  error
		drop bool
	}
	results := make([]result, len(matches))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(len(matches), max(2, runtime.GOMAXPROCS(0))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				p := matches[i]
				final := strings.TrimSuffix(p, PartialSuffix) + ".json"
				if _, err := Read(final); err == nil {
					results[i].drop = true // ended; the journal outlived its document
					continue
				}
				t, err := Recover(p)
				var nh *noHeaderError
				switch {
				case errors.As(err, &nh):
					results[i].drop = true
				case err != nil:
					results[i].err = err
				default:
					results[i].t = t
				}
			}
		}()
	}
	for i := range matches {
		next <- i
	}
	close(next)
	wg.Wait()
	var errs []error
	var ts []*Trajectory
	var from []int
	for i, r := range results {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.drop:
			if r.t == nil {
				if _, err := os.Stat(strings.TrimSuffix(matches[i], PartialSuffix) + ".json"); err != nil {
					dropped = append(dropped, strings.TrimSuffix(filepath.Base(matches[i]), PartialSuffix))
				}
			}
			if err := os.Remove(matches[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		default:
			ts = append(ts, r.t)
			from = append(from, i)
		}
	}
	for k, werr := range WriteFiles(dir, ts) {
		if werr != nil {
			errs = append(errs, fmt.Errorf("%s: %w", matches[from[k]], werr))
			continue
		}
		os.Remove(matches[from[k]])
		recovered = append(recovered, ts[k])
	}
	return recovered, dropped, errors.Join(errs...)
}
