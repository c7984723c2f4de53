package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// runMarker is OUT/run.json: written first, with O_EXCL, it claims an
// output directory for one run, so two runs never write into the same one.
type runMarker struct {
	Schema      string    `json:"schema"` // rollbox.run/v1
	RolloutID   string    `json:"rollout_id"`
	StartedAt   time.Time `json:"started_at"`
	Tasks       string    `json:"tasks"`
	Policy      string    `json:"policy"`
	Group       int       `json:"group"`
	Concurrency int       `json:"concurrency"`
	Backend     string    `json:"backend"`
	Version     string    `json:"rollbox_version"`
}

// outDir is an output directory claimed for one run.
type outDir struct {
	path    string
	created bool // the directory did not exist before
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
	os.Remove(filepath.Join(o.path, "run.json"))
	if o.created {
		os.Remove(o.path) // only if empty
	}
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
