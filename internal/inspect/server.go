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

// Server serves the episodes of one run or several as a web page
// (embedded: it works offline) and a JSON API:
//
//	GET /api/episodes        the runs (each with its summary.json, if any) and one
//	                         summary per episode; ?rollout=, task=, end=, error= (a
//	                         tool error kind, or "none"), monitor= (a monitor that
//	                         fired, "any" or "none"), source= (rollout, env,
//	                         production, ...), outcome= (pending, scored),
//	                         min_reward=, max_reward= filter them
//	GET /api/episodes/{id}   one trajectory document, as written
//
// Runs are kept apart by rollout id: a directory that holds several (a
// rollbox serve --data directory, a parent of rollbox run --out directories,
// a directory two runs wrote into) is listed run by run, and a summary.json
// counts only for the run it names. Trajectories are read again when their
// files change, so a run still in progress can be watched.
type Server struct {
	dir     string   // as given
	sources []source // where the episodes are

	mu    sync.Mutex
	cache map[string]cached // file → its summary at a size and mtime
}

// source is a directory of trajectories, and the run directory holding
// its summary.json when there is one.
type source struct {
	episodes, runDir string
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
	RolloutID  string    `json:"rollout_id"`
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
	// Monitors are the reward-hacking monitors that apply to the episode
	// (a count, or 1/0 for a flag); Triggered those that fired.
	Monitors  map[string]int `json:"monitors,omitempty"`
	Triggered []string       `json:"triggered,omitempty"`
	// Source is rollout, env, production or an importer's label; Outcome
	// an imported episode's outcome status (pending, scored) and Signals
	// how many outcome signals it has.
	Source  string `json:"source"`
	Outcome string `json:"outcome,omitempty"`
	Signals int    `json:"signals,omitempty"`
}

// List is the answer of GET /api/episodes.
type List struct {
	Dir string `json:"dir"`
	// Run is the summary.json of the run, when the list holds one run that
	// has one (null for several runs: see Runs).
	Run json.RawMessage `json:"run"`
	// Runs are the runs the episodes belong to, by rollout id.
	Runs     []*Run     `json:"runs"`
	Total    int        `json:"total"`
	Episodes []*Episode `json:"episodes"`
	// Skipped are files that are not readable trajectories.
	Skipped []Skipped `json:"skipped"`
}

// Run is one run (a rollout) of the list: its episodes counted from the
// trajectories, and its summary.json when one names it.
type Run struct {
	RolloutID  string          `json:"rollout_id"`
	Dir        string          `json:"dir"`
	Episodes   int             `json:"episodes"`
	Scored     int             `json:"scored"`
	RewardMean *float64        `json:"reward_mean"`
	StartedAt  time.Time       `json:"started_at"`
	Summary    json.RawMessage `json:"summary"`
}

// Skipped is a file the list leaves out, and why.
type Skipped struct {
	File  string `json:"file"`
	Error string `json:"error"`
}

// NewServer serves dir: a run's output directory (with episodes/ and
// summary.json), a rollbox serve --data directory, a directory of such
// run directories (out/), or a directory of trajectories.
func NewServer(dir string) (*Server, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory (want a run's out dir, its episodes/, a serve --data dir or a directory of runs)", dir)
	}
	s := &Server{dir: dir, cache: map[string]cached{}}
	isDir := func(p string) bool { st, err := os.Stat(p); return err == nil && st.IsDir() }
	switch {
	case isDir(filepath.Join(dir, "episodes")):
		s.sources = []source{{filepath.Join(dir, "episodes"), dir}}
	case filepath.Base(dir) == "episodes" && fileExists(filepath.Join(filepath.Dir(dir), "summary.json")):
		s.sources = []source{{dir, filepath.Dir(dir)}}
	default:
		// A directory of runs (out/ of several rollbox run), or of
		// trajectories, or both.
		s.sources = []source{{dir, ""}}
		subs, _ := filepath.Glob(filepath.Join(dir, "*", "episodes"))
		sort.Strings(subs)
		for _, e := range subs {
			if isDir(e) {
				s.sources = append(s.sources, source{e, filepath.Dir(e)})
			}
		}
	}
	return s, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
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
// changed) and returns the list by run, then task, group and place in it.
func (s *Server) Load() (*List, error) {
	var files []string
	runDirOf := map[string]string{} // file → its run directory
	for _, src := range s.sources {
		fs, err := filepath.Glob(filepath.Join(src.episodes, "*.json"))
		if err != nil {
			return nil, err
		}
		for _, f := range fs {
			runDirOf[f] = src.runDir
		}
		files = append(files, fs...)
	}
	out := &List{Dir: s.dir, Runs: []*Run{}, Episodes: []*Episode{}, Skipped: []Skipped{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	runs := map[string]*Run{}
	for _, f := range files {
		if filepath.Base(f) == "summary.json" || filepath.Base(f) == "run.json" {
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
			out.Skipped = append(out.Skipped, Skipped{File: f, Error: c.err.Error()})
			continue
		}
		e := c.summary
		out.Episodes = append(out.Episodes, e)
		r := runs[e.RolloutID]
		if r == nil {
			r = &Run{RolloutID: e.RolloutID, Dir: runDirOf[f], StartedAt: e.StartedAt}
			runs[e.RolloutID] = r
		}
		r.Episodes++
		if e.StartedAt.Before(r.StartedAt) {
			r.StartedAt = e.StartedAt
		}
		if e.Reward != nil {
			if r.RewardMean == nil {
				r.RewardMean = new(float64)
			}
			*r.RewardMean += *e.Reward
			r.Scored++
		}
	}
	for f := range s.cache {
		if !seen[f] {
			delete(s.cache, f)
		}
	}
	// A summary.json counts for the run it names, never for another run's
	// episodes that share its directory.
	for _, src := range s.sources {
		if src.runDir == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src.runDir, "summary.json"))
		var head struct {
			RolloutID string `json:"rollout_id"`
		}
		if err != nil || json.Unmarshal(b, &head) != nil {
			continue
		}
		if r := runs[head.RolloutID]; r != nil {
			r.Summary, r.Dir = b, src.runDir
		}
	}
	for _, r := range runs {
		if r.Scored > 0 {
			*r.RewardMean /= float64(r.Scored)
		}
		out.Runs = append(out.Runs, r)
	}
	sort.Slice(out.Runs, func(i, j int) bool {
		if !out.Runs[i].StartedAt.Equal(out.Runs[j].StartedAt) {
			return out.Runs[i].StartedAt.Before(out.Runs[j].StartedAt)
		}
		return out.Runs[i].RolloutID < out.Runs[j].RolloutID
	})
	if len(out.Runs) == 1 {
		out.Run = out.Runs[0].Summary
	}
	order := map[string]int{}
	for i, r := range out.Runs {
		order[r.RolloutID] = i
	}
	sort.SliceStable(out.Episodes, func(i, j int) bool {
		a, b := out.Episodes[i], out.Episodes[j]
		if a.RolloutID != b.RolloutID {
			return order[a.RolloutID] < order[b.RolloutID]
		}
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
	e := &Episode{ID: t.EpisodeID, RolloutID: t.RolloutID, TaskID: t.TaskID, GroupID: t.GroupID, GroupIndex: t.GroupIndex, Backend: t.Sandbox.Backend,
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
	if t.Monitors != nil {
		e.Monitors, e.Triggered = t.Monitors.Values(), t.Monitors.Triggered()
	}
	e.Source = trajectory.SourceOf(t)
	if t.Outcomes != nil {
		e.Outcome, e.Signals = t.Outcomes.Status, len(t.Outcomes.Signals)
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
	rollout, task, end, kind, mon := q.Get("rollout"), q.Get("task"), q.Get("end"), q.Get("error"), q.Get("monitor")
	source, outcome := q.Get("source"), q.Get("outcome")
	if mon != "" && mon != "any" && mon != "none" && !slices.Contains(trajectory.MonitorNames(), mon) {
		apiError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("monitor %q is not any, none or one of %s", mon, strings.Join(trajectory.MonitorNames(), ", ")))
		return
	}
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
		case rollout != "" && e.RolloutID != rollout,
			task != "" && e.TaskID != task,
			source != "" && e.Source != source,
			outcome != "" && e.Outcome != outcome,
			end != "" && e.End != end,
			kind == "none" && len(e.ToolErrors) > 0,
			kind != "" && kind != "none" && e.ToolErrors[kind] == 0,
			mon == "any" && len(e.Triggered) == 0,
			mon == "none" && len(e.Triggered) > 0,
			mon != "" && mon != "any" && mon != "none" && !slices.Contains(e.Triggered, mon),
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
		file = s.subEpisode(id)
	}
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

// subEpisode finds an orchestrator's sub-episode by id: its record is in
// the episodes directory's subagents/ (not listed: it is not an episode of
// the run, but its orchestrator's tree links to it). "" when there is none.
func (s *Server) subEpisode(id string) string {
	if id == "" || strings.ContainsAny(id, `/\`) || strings.HasPrefix(id, ".") {
		return ""
	}
	for _, src := range s.sources {
		f := filepath.Join(src.episodes, "subagents", id+".json")
		if st, err := os.Stat(f); err == nil && st.Mode().IsRegular() {
			return f
		}
	}
	return ""
}
