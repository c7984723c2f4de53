package inspect

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/tools"
)

//go:embed web
var webFS embed.FS

// Server serves the episodes of one run as a web page (embedded: it works
// offline) and a JSON API:
//
//	GET /api/episodes        the run's summary.json (if any) and one summary per episode;
//	                         ?task=, end=, error= (a tool error kind, or "none"),
//	                         min_reward=, max_reward= filter them
//	GET /api/episodes/{id}   one trajectory document, as written
//
// Trajectories are read again when their files change, so a run still in
// progress can be watched.
type Server struct {
	dir    string // the episodes
	runDir string // summary.json, when there is one

	mu    sync.Mutex
	cache map[string]cached // file → its summary at a size and mtime
}

type cached struct {
	size    int64
	mtime   time.Time
	summary *Episode
	err     error
}

// Episode is one row of the episode list.
type Episode struct {
	ID         string    `json:"id"`
	TaskID     string    `json:"task_id"`
	GroupID    string    `json:"group_id"`
	GroupIndex int       `json:"group_index"`
	Backend    string    `json:"backend"`
	Policy     string    `json:"policy"`
	StartedAt  time.Time `json:"started_at"`
	DurationMS float64   `json:"duration_ms"`
	End        string    `json:"end"`
	EndMessage string    `json:"end_message,omitempty"`
	Reward     *float64  `json:"reward"`
	// RewardError is the reward's error kind when it has no total
	// (judge_error): unscored, not 0.
	RewardError string             `json:"reward_error,omitempty"`
	Components  map[string]float64 `json:"components,omitempty"`
	Turns       int                `json:"turns"`
	ToolCalls   int                `json:"tool_calls"`
	ToolErrors  map[string]int     `json:"tool_errors"`
	// Truncations counts tool outputs cut for the model.
	Truncations int `json:"truncations"`
	Steps       int `json:"steps"`
}

// List is the answer of GET /api/episodes.
type List struct {
	Dir      string          `json:"dir"`
	Run      json.RawMessage `json:"run"`
	Total    int             `json:"total"`
	Episodes []*Episode      `json:"episodes"`
	// Skipped are files that are not readable trajectories.
	Skipped []Skipped `json:"skipped"`
}

// Skipped is a file the list leaves out, and why.
type Skipped struct {
	File  string `json:"file"`
	Error string `json:"error"`
}

// NewServer serves dir: a run's output directory (with episodes/ and
// summary.json) or a directory of trajectories.
func NewServer(dir string) (*Server, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory (want a run's out dir or its episodes/)", dir)
	}
	s := &Server{dir: dir, cache: map[string]cached{}}
	if st, err := os.Stat(filepath.Join(dir, "episodes")); err == nil && st.IsDir() {
		s.dir, s.runDir = filepath.Join(dir, "episodes"), dir
	} else if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "summary.json")); err == nil && filepath.Base(dir) == "episodes" {
		s.runDir = filepath.Dir(dir)
	}
	return s, nil
}

// Handler is the page and the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	web, _ := fs.Sub(webFS, "web")
	static := http.FileServerFS(web)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, web, "index.html")
	})
	mux.Handle("GET /static/", http.StripPrefix("/static/", static))
	mux.HandleFunc("GET /api/episodes", s.list)
	mux.HandleFunc("GET /api/episodes/{id}", s.episode)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		apiError(w, http.StatusNotFound, "not_found", "no such page: "+r.URL.Path)
	})
	return mux
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// Load reads every trajectory of the directory (again where a file
// changed) and returns the list by task, then group and place in it.
func (s *Server) Load() (*List, error) {
	files, err := filepath.Glob(filepath.Join(s.dir, "*.json"))
	if err != nil {
		return nil, err
	}
	out := &List{Dir: s.dir, Episodes: []*Episode{}, Skipped: []Skipped{}}
	if s.runDir != "" {
		if b, err := os.ReadFile(filepath.Join(s.runDir, "summary.json")); err == nil && json.Valid(b) {
			out.Run = b
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	for _, f := range files {
		if filepath.Base(f) == "summary.json" {
			continue
		}
		seen[f] = true
		st, err := os.Stat(f)
		if err != nil {
			continue
		}
		c, ok := s.cache[f]
		if !ok || c.size != st.Size() || !c.mtime.Equal(st.ModTime()) {
			c = cached{size: st.Size(), mtime: st.ModTime()}
			c.summary, c.err = summarize(f)
			s.cache[f] = c
		}
		if c.err != nil {
			out.Skipped = append(out.Skipped, Skipped{File: filepath.Base(f), Error: c.err.Error()})
			continue
		}
		out.Episodes = append(out.Episodes, c.summary)
	}
	for f := range s.cache {
		if !seen[f] {
			delete(s.cache, f)
		}
	}
	sort.SliceStable(out.Episodes, func(i, j int) bool {
		a, b := out.Episodes[i], out.Episodes[j]
		if a.TaskID != b.TaskID {
			return a.TaskID < b.TaskID
		}
		if a.GroupID != b.GroupID {
			return a.StartedAt.Before(b.StartedAt)
		}
		if a.GroupIndex != b.GroupIndex {
			return a.GroupIndex < b.GroupIndex
		}
		return a.ID < b.ID
	})
	out.Total = len(out.Episodes)
	return out, nil
}

func summarize(file string) (*Episode, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	t, err := trajectory.Decode(b)
	if err != nil {
		return nil, err
	}
	if t.EpisodeID == "" {
		return nil, errors.New("no episode_id")
	}
	e := &Episode{ID: t.EpisodeID, TaskID: t.TaskID, GroupID: t.GroupID, GroupIndex: t.GroupIndex, Backend: t.Sandbox.Backend,
		Policy: t.Policy.Kind, StartedAt: t.StartedAt, DurationMS: t.Stats.DurationMS, Turns: t.Stats.Turns,
		ToolCalls: t.Stats.ToolCalls, ToolErrors: t.Stats.ToolErrors, Steps: len(t.Steps), End: "running"}
	if e.ToolErrors == nil {
		e.ToolErrors = map[string]int{}
	}
	if t.Termination != nil {
		e.End, e.EndMessage = t.Termination.Reason, t.Termination.Message
	}
	if t.Reward != nil {
		e.Components, e.RewardError = t.Reward.Components, t.Reward.ErrorKind
		if v, ok := t.Reward.Value(); ok {
			e.Reward = &v
		}
	}
	for _, s := range t.Steps {
		if s.Truncated {
			e.Truncations++
		}
	}
	return e, nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	l, err := s.Load()
	if err != nil {
		apiError(w, http.StatusInternalServerError, "read_failed", err.Error())
		return
	}
	q := r.URL.Query()
	var minR, maxR *float64
	for _, p := range []struct {
		name string
		dst  **float64
	}{{"min_reward", &minR}, {"max_reward", &maxR}} {
		if v := q.Get(p.name); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				apiError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("%s %q is not a number", p.name, v))
				return
			}
			*p.dst = &f
		}
	}
	task, end, kind := q.Get("task"), q.Get("end"), q.Get("error")
	if end != "" && end != "running" && !slices.Contains(trajectory.EndReasons(), end) {
		apiError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("end %q is not one of %s", end, strings.Join(trajectory.EndReasons(), ", ")))
		return
	}
	if kinds := tools.ErrorKinds(); kind != "" && kind != "none" && !slices.Contains(kinds, tools.ErrorKind(kind)) {
		names := make([]string, len(kinds))
		for i, k := range kinds {
			names[i] = string(k)
		}
		apiError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("error %q is not none or one of %s", kind, strings.Join(names, ", ")))
		return
	}
	kept := l.Episodes[:0:0]
	for _, e := range l.Episodes {
		switch {
		case task != "" && e.TaskID != task,
			end != "" && e.End != end,
			kind == "none" && len(e.ToolErrors) > 0,
			kind != "" && kind != "none" && e.ToolErrors[kind] == 0,
			minR != nil && (e.Reward == nil || *e.Reward < *minR),
			maxR != nil && (e.Reward == nil || *e.Reward > *maxR):
			continue
		}
		kept = append(kept, e)
	}
	l.Episodes = kept
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	json.NewEncoder(w).Encode(l)
}

func (s *Server) episode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	l, err := s.Load()
	if err != nil {
		apiError(w, http.StatusInternalServerError, "read_failed", err.Error())
		return
	}
	s.mu.Lock()
	file := ""
	for f, c := range s.cache {
		if c.summary != nil && c.summary.ID == id {
			file = f
		}
	}
	s.mu.Unlock()
	if file == "" {
		apiError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no episode %q among the %d in %s", id, l.Total, s.dir))
		return
	}
	b, err := os.ReadFile(file)
	if err != nil {
		apiError(w, http.StatusInternalServerError, "read_failed", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(b)
}
