package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/internal/lease"
)

// runMarker is OUT/run.json: written first, with O_EXCL, it claims an
// output directory for one run, so two runs never write into the same one.
type runMarker struct {
	Schema    string    `json:"schema"` // rollbox.run/v1
	RolloutID string    `json:"rollout_id"`
	StartedAt time.Time `json:"started_at"`
	Tasks     string    `json:"tasks"`
	// TasksHash fingerprints the tasks in their order (tasksHash): a
	// resumed run must have the same.
	TasksHash   string `json:"tasks_hash,omitempty"`
	Policy      string `json:"policy"`
	Group       int    `json:"group"`
	Concurrency int    `json:"concurrency"`
	Backend     string `json:"backend"`
	Version     string `json:"rollbox_version"`
	// Resumed has the times a later `rollbox run --resume` continued it.
	Resumed []time.Time `json:"resumed,omitempty"`
}

// outDir is an output directory claimed for one run. The run holds an
// exclusive flock(2) on the directory while it writes there (the kernel
// drops it however the run dies), so a `rollbox run --resume` of a run
// that is in fact still running is refused.
type outDir struct {
	path    string
	created bool // the directory did not exist before
	resumed bool // an earlier run's, continued: release leaves its files
	lock    *os.File
}

// claimOutDir makes dir the output directory of the run m describes: dir
// must not exist or be empty. A directory that holds anything (another
// run's episodes and summary.json above all) is refused, as bad input, and
// nothing in it is touched. The claim is atomic: of two runs started at
// once on the same empty directory, one gets it.
func claimOutDir(dir string, m runMarker) (*outDir, error) {
	o := &outDir{path: dir}
	if err := os.MkdirAll(filepath.Dir(filepath.Clean(dir)), 0o755); err != nil {
		return nil, usagef("--out %s: %v", dir, err)
	}
	switch err := os.Mkdir(dir, 0o755); {
	case err == nil:
		o.created = true
	case errors.Is(err, fs.ErrExist):
		if st, serr := os.Stat(dir); serr != nil || !st.IsDir() {
			return nil, usagef("--out %s: not a directory", dir)
		}
		if what := describeNonEmpty(dir); what != "" {
			return nil, usagef("--out %s: %s; each run needs a directory of its own: name a new or empty one, or leave --out off to write out/<rollout id>/", dir, what)
		}
	default:
		return nil, usagef("--out %s: %v", dir, err)
	}
	lock, err := lease.LockDir(dir)
	if err != nil { // nothing here is this run's to remove
		return nil, usagef("--out %s: another rollbox run is writing to it (%v)", dir, err)
	}
	o.lock = lock
	f, err := os.OpenFile(filepath.Join(dir, "run.json"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, usagef("--out %s: %s", dir, describeNonEmpty(dir))
		}
		o.release()
		return nil, usagef("--out %s: %v", dir, err)
	}
	m.Schema = "rollbox.run/v1"
	b, _ := json.MarshalIndent(m, "", "  ")
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		o.release()
		return nil, fmt.Errorf("--out %s: writing run.json: %w", dir, err)
	}
	return o, nil
}

// release undoes a claim when the run does not start after all: run.json
// goes, and the directory too when the claim made it.
func (o *outDir) release() {
	if !o.resumed {
		os.Remove(filepath.Join(o.path, "run.json"))
		if o.created {
			os.Remove(o.path) // only if empty
		}
	}
	o.unlock()
}

// unlock lets the directory go once the run has ended.
func (o *outDir) unlock() {
	if o.lock != nil {
		o.lock.Close()
		o.lock = nil
	}
}

// resumeOutDir claims dir, the output directory of an earlier run that a
// signal or a kill stopped, to continue it: it must hold that run's
// run.json, no summary.json of a run that ended, and no live run (the
// directory's lock). It returns the run's marker.
func resumeOutDir(dir string) (*outDir, *runMarker, error) {
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		return nil, nil, usagef("--resume %s: not the output directory of a rollbox run: %v", dir, err)
	}
	var m runMarker
	if err := json.Unmarshal(b, &m); err != nil || m.Schema != "rollbox.run/v1" || m.RolloutID == "" || m.Group < 1 {
		return nil, nil, usagef("--resume %s: run.json is not a rollbox.run/v1 marker with a rollout id and a group", dir)
	}
	o := &outDir{path: dir, resumed: true}
	if o.lock, err = lease.LockDir(dir); err != nil {
		return nil, nil, usagef("--resume %s: a rollbox run is still writing to it (%v)", dir, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "summary.json")); err == nil {
		var sum struct {
			Interrupted bool `json:"interrupted"`
		}
		if json.Unmarshal(b, &sum) == nil && !sum.Interrupted {
			o.unlock()
			return nil, nil, usagef("--resume %s: the run %s ended (its summary.json is not interrupted): nothing to resume", dir, m.RolloutID)
		}
	}
	return o, &m, nil
}

// markResumed adds this resumption to the run's run.json, once every check
// passed and the resumed run begins.
func (o *outDir) markResumed(m *runMarker) error {
	m.Resumed = append(m.Resumed, time.Now().UTC())
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := writeFileAtomic(filepath.Join(o.path, "run.json"), append(b, '\n')); err != nil {
		return fmt.Errorf("--resume %s: %w", o.path, err)
	}
	return nil
}

// holdsNoFile reports whether dir holds nothing but empty directories
// (a prepared episodes/, a mount point).
func holdsNoFile(dir string) bool {
	empty := true
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			empty = false
			return filepath.SkipAll
		}
		return nil
	})
	return empty
}

// describeNonEmpty says what dir holds ("" when it is empty): the run it
// holds, when it holds one.
func describeNonEmpty(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	if holdsNoFile(dir) {
		return ""
	}
	var id string
	for _, name := range []string{"run.json", "summary.json"} {
		var v struct {
			RolloutID string `json:"rollout_id"`
		}
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil && json.Unmarshal(b, &v) == nil && v.RolloutID != "" {
			id = v.RolloutID
			break
		}
	}
	episodes, _ := filepath.Glob(filepath.Join(dir, "episodes", "*.json"))
	switch {
	case id != "":
		return fmt.Sprintf("it holds the run %s (%d episode(s))", id, len(episodes))
	case len(episodes) > 0:
		return fmt.Sprintf("it holds %d episode(s) of another run", len(episodes))
	}
	names := make([]string, 0, 4)
	for _, e := range entries[:min(len(entries), 3)] {
		names = append(names, e.Name())
	}
	if len(entries) > 3 {
		names = append(names, fmt.Sprintf("and %d more", len(entries)-3))
	}
	return "it is not empty (" + strings.Join(names, ", ") + ")"
}

// writeFileAtomic replaces path with b: a crash leaves the old file or the
// new one, never half of one.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// tasksHash is the hex SHA-256 of the tasks' hashes in their order.
func tasksHash(tasks []*agent.Task) string {
	h := sha256.New()
	for _, t := range tasks {
		io.WriteString(h, t.Hash()+"\n")
	}
	return hex.EncodeToString(h.Sum(nil))
}
