package taskimport

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/tools"
)

// Severity says what a Problem means for its task.
type Severity string

// Severities.
const (
	// SeverityError: the task is not imported (it could not run as its
	// source means it to).
	SeverityError Severity = "error"
	// SeverityWarning: imported, but it will not behave exactly as in its
	// source (a field not mapped, a network it will not have).
	SeverityWarning Severity = "warning"
	// SeverityNote: mapped, with a change worth knowing.
	SeverityNote Severity = "note"
)

// Problem is one thing about a source task that could not be mapped, or
// was mapped with a change. Field names it in the source's own terms
// (`task.toml [environment].gpus`, `FAIL_TO_PASS[2]`).
type Problem struct {
	Severity Severity `json:"severity"`
	Field    string   `json:"field,omitempty"`
	Message  string   `json:"message"`
}

// Result is one source task's import.
type Result struct {
	// Source is where the task came from (a directory, or FILE:LINE).
	Source string `json:"source"`
	ID     string `json:"id"`
	// Imported is true when the task was written to the task file: no
	// problem of severity error.
	Imported bool `json:"imported"`
	// Image is the sandbox image the task names (built by the import for a
	// Dockerfile environment).
	Image string `json:"image,omitempty"`
	// Workspace is the snapshot the task's workspace comes from, relative
	// to the task file.
	Workspace string    `json:"workspace,omitempty"`
	Problems  []Problem `json:"problems"`
	// Task is the Rollbox task (nil when not imported).
	Task *agent.Task `json:"-"`
}

func (r *Result) add(sev Severity, field, format string, args ...any) {
	r.Problems = append(r.Problems, Problem{Severity: sev, Field: field, Message: fmt.Sprintf(format, args...)})
}

func (r *Result) errorf(field, format string, args ...any) {
	r.add(SeverityError, field, format, args...)
}
func (r *Result) warnf(field, format string, args ...any) {
	r.add(SeverityWarning, field, format, args...)
}
func (r *Result) notef(field, format string, args ...any) {
	r.add(SeverityNote, field, format, args...)
}

func (r *Result) failed() bool {
	for _, p := range r.Problems {
		if p.Severity == SeverityError {
			return true
		}
	}
	return false
}

// Report is an import's account of every source task.
type Report struct {
	Format   string    `json:"format"`
	Source   string    `json:"source"`
	Out      string    `json:"out"`
	Imported int       `json:"imported"`
	Skipped  int       `json:"skipped"`
	Tasks    []*Result `json:"tasks"`
}

// WriteText prints the report for a person: a line per task and a line
// per problem.
func (rep *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "%s %s: %d of %d tasks imported into %s\n", rep.Format, rep.Source, rep.Imported, len(rep.Tasks), rep.Out)
	width := 0
	for _, r := range rep.Tasks {
		width = max(width, len(r.ID))
	}
	for _, r := range rep.Tasks {
		state := "imported"
		if !r.Imported {
			state = "NOT IMPORTED"
		}
		line := fmt.Sprintf("  %-*s  %s", width, r.ID, state)
		if r.Image != "" {
			line += "  image " + r.Image
		}
		if r.Workspace != "" {
			line += "  workspace " + r.Workspace
		}
		fmt.Fprintln(w, line)
		for _, p := range r.Problems {
			field := p.Field
			if field != "" {
				field += ": "
			}
			fmt.Fprintf(w, "      %-7s %s%s\n", p.Severity, field, p.Message)
		}
	}
}

// Options are what every importer takes.
type Options struct {
	// OutFile is the task file the import writes: workspace snapshots go
	// to OutFile's directory, under <name>.workspaces/, and tasks name them
	// relative to it.
	OutFile string
	// Images builds and inspects images (the local Docker engine); nil
	// when no engine is reachable, and NoImages says why.
	Images   ImageBuilder
	NoImages error
	// Progress gets image builds' output.
	Progress io.Writer
	// MaxTurns, when set, is every task's limits.max_turns.
	MaxTurns int
}

func (o *Options) progress() io.Writer {
	if o.Progress == nil {
		return io.Discard
	}
	return o.Progress
}

// workspaceDir is where snapshots go, and its path relative to the task
// file's directory.
func (o *Options) workspaceDir() (abs, rel string) {
	base := strings.TrimSuffix(filepath.Base(o.OutFile), filepath.Ext(o.OutFile))
	rel = base + ".workspaces"
	return filepath.Join(filepath.Dir(o.OutFile), rel), rel
}

// Build is a Dockerfile build with no network.
type Build struct {
	// ContextDir is the build context ("" for none).
	ContextDir string
	Dockerfile string
	Tag        string
	Labels     map[string]string
	Timeout    time.Duration
}

// Image is an image the engine has.
type Image struct {
	// Ref is how a task names it (docker:NAME:TAG, or a recipe name).
	Ref        string
	ID         string
	WorkingDir string
}

// ImageBuilder is the part of a container engine the importers use.
type ImageBuilder interface {
	// Build builds a Dockerfile without network; the image is named by
	// Image.Ref.
	Build(ctx context.Context, b Build, progress io.Writer) (Image, error)
	// Inspect finds an image by the name a task would give it (a recipe
	// name or docker:NAME:TAG); the error wraps sandbox.ErrImageNotFound
	// when there is none.
	Inspect(ctx context.Context, ref string) (Image, error)
	// CopyDir writes directory dir of the image as a tar (entries relative
	// to dir); the error wraps sandbox.ErrNotFound when there is none.
	CopyDir(ctx context.Context, ref, dir string, w io.Writer) error
}

var idRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// taskID turns a source name into a task id, noting a change.
func taskID(r *Result, field, name string) string {
	if idRe.MatchString(name) {
		return name
	}
	var b strings.Builder
	for _, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
			b.WriteRune(c)
		default:
			b.WriteByte('-')
		}
	}
	id := strings.TrimLeft(b.String(), "._-")
	if len(id) > 100 {
		sum := sha256.Sum256([]byte(name))
		id = id[:100] + "-" + hex.EncodeToString(sum[:4])
	}
	if id == "" {
		sum := sha256.Sum256([]byte(name))
		id = "task-" + hex.EncodeToString(sum[:6])
	}
	r.notef(field, "%q is not a task id: the task is %q", name, id)
	return id
}

// claimID gives r.ID to r unless an earlier task of the same import has
// it: a second task with the id is an error found before anything of it is
// written (its workspace would replace the first's).
func claimID(r *Result, ids map[string]string) bool {
	if prev, dup := ids[r.ID]; dup {
		r.errorf("id", "task id %q is also %s's", r.ID, prev)
		return false
	}
	ids[r.ID] = r.Source
	return true
}

// importTools are the tools an imported task offers: the defaults without
// run_tests (its command runs the verifier's tests, which are hidden until
// the agent has finished).
func importTools() []string {
	var out []string
	for _, n := range tools.DefaultNames(false) {
		out = append(out, n)
	}
	return out
}

// finalize validates each imported task as a task file line would be, and
// counts.
func finalize(rep *Report, dir string) {
	seen := map[string]string{}
	for _, r := range rep.Tasks {
		if r.Task != nil && !r.failed() {
			if prev, dup := seen[r.Task.ID]; dup {
				r.errorf("id", "task id %q is also %s's", r.Task.ID, prev)
			} else {
				seen[r.Task.ID] = r.Source
			}
		}
		if r.Task != nil && !r.failed() {
			line, err := json.Marshal(r.Task)
			if err == nil {
				_, err = agent.ParseTask(line, dir, tools.Known)
			}
			if err != nil {
				r.errorf("", "the mapped task is not valid: %v", err)
			}
		}
		r.Imported = r.Task != nil && !r.failed()
		if !r.Imported {
			r.Task = nil
			rep.Skipped++
		} else {
			rep.Imported++
		}
		if r.Problems == nil {
			r.Problems = []Problem{}
		}
	}
}

// WriteTasks writes the imported tasks, one JSON line each, to path (via a
// temporary file renamed into place, so a failed write leaves no partial
// task file).
func WriteTasks(path string, rep *Report) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	for _, r := range rep.Tasks {
		if !r.Imported {
			continue
		}
		if err := enc.Encode(r.Task); err != nil {
			return fmt.Errorf("task %q: %w", r.ID, err)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.partial")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// writeTarAtomic writes a file at path through a temporary file.
func writeTarAtomic(path string, fill func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.partial")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := fill(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// tarStats counts a tar's regular files and their bytes.
func tarStats(path string) (files int, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, size, nil
		}
		if err != nil {
			return files, size, err
		}
		if h.Typeflag == tar.TypeReg {
			files++
			size += h.Size
		}
	}
}
