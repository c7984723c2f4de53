package runtime

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// Options configure a Server.
type Options struct {
	// DataDir holds the index and the trajectories; it survives restarts.
	DataDir string
	// Backends opens sandbox backends by name.
	Backends BackendSource
	// DefaultBackend serves tasks and requests that name none (default wasm).
	DefaultBackend string
	// Catalog are tasks a request may name by id ({"id": ...}).
	Catalog []*agent.Task
	// KnownTool validates tool names (default: the builtin tools).
	KnownTool func(string) bool
	// PolicyAPIKey is sent to the rollouts' OpenAI-compatible servers.
	PolicyAPIKey string
	// ConfigureEpisode, if set, may adjust each episode's config (search
	// tools over the catalog's indexes).
	ConfigureEpisode func(*agent.Config) error
	// Registry receives the metrics and serves /metrics; a new one when nil.
	Registry *prometheus.Registry
	// Logger gets the structured log; slog.Default() when nil.
	Logger *slog.Logger
	Limits Limits
}

// Server is the rollout service: the HTTP API over the scheduler, the
// sandboxes and the store. Open it, serve Handler, Close it.
type Server struct {
	opts      Options
	limits    Limits
	log       *slog.Logger
	st        *store
	metrics   *Metrics
	registry  *prometheus.Registry
	catalog   map[string]*agent.Task
	sched     *scheduler
	sandboxes *sandboxes
	endpoints *endpoints
	mux       *http.ServeMux
	started   time.Time

	ctx    context.Context // lifecycle: cancelled by Close
	cancel context.CancelFunc
	bg     sync.WaitGroup // dispatcher, pool sizer, reaper
	wg     sync.WaitGroup // episodes

	mu         sync.Mutex
	rollouts   map[string]*rollout
	env        map[string]*envEpisode
	envOpening int
	closing    bool
	closeOnce  sync.Once
	closeErr   error
}

// Recovery is what Open found of a previous process.
type Recovery struct {
	// Interrupted are episodes that were in flight or queued, now recorded
	// as interrupted.
	Interrupted []string
	// Rollouts were running and are now "interrupted" (or "done" when all
	// their episodes had in fact ended).
	Rollouts []string
}

// Open opens the data directory, recovers what a crashed or stopped
// process left (episodes in flight or queued are recorded as interrupted,
// their rollouts marked), and starts the scheduler. Orphaned containers are
// the caller's to remove (cmd/rollbox serve does, by owner label).
func Open(opts Options) (*Server, *Recovery, error) {
	if opts.DataDir == "" {
		return nil, nil, errors.New("runtime: Options.DataDir is required")
	}
	if opts.Backends == nil {
		return nil, nil, errors.New("runtime: Options.Backends is required")
	}
	if opts.DefaultBackend == "" {
		opts.DefaultBackend = "wasm"
	}
	if opts.KnownTool == nil {
		opts.KnownTool = tools.Known
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	st, err := openStore(opts.DataDir)
	if err != nil {
		return nil, nil, err
	}
	s := &Server{opts: opts, limits: opts.Limits.withDefaults(), log: opts.Logger, st: st, registry: opts.Registry,
		catalog: map[string]*agent.Task{}, rollouts: map[string]*rollout{}, env: map[string]*envEpisode{}, started: time.Now()}
	for _, t := range opts.Catalog {
		s.catalog[t.ID] = t
	}
	s.metrics = NewMetrics(opts.Registry)
	s.endpoints = &endpoints{limit: s.limits.PolicyConcurrency, m: map[string]*endpoint{}}
	s.sandboxes = &sandboxes{src: opts.Backends, metrics: s.metrics, warm: s.limits.WarmPool, pools: map[string]*sandbox.Pool{}}
	opts.Registry.MustRegister(poolCollector{s.sandboxes})
	s.ctx, s.cancel = context.WithCancel(context.Background())
	rec, err := s.recover()
	if err != nil {
		st.Close()
		return nil, nil, fmt.Errorf("recovering %s: %w", opts.DataDir, err)
	}
	s.sched = newScheduler(s.limits, s.startJob)
	s.bg.Add(3)
	go func() { defer s.bg.Done(); s.sched.run(s.ctx) }()
	go func() { defer s.bg.Done(); s.sched.sizePools(s.ctx, s.sandboxes) }()
	go func() { defer s.bg.Done(); s.reapIdle(s.ctx) }()
	s.routes()
	return s, rec, nil
}

// recover finalises what a previous process left in the data directory.
func (s *Server) recover() (*Recovery, error) {
	rec := &Recovery{}
	journals, _, err := trajectory.RecoverDir(s.st.episodesDir)
	if err != nil {
		s.log.Error("some journals could not be recovered", "err", err)
	}
	for _, t := range journals {
		if t.Termination != nil && t.Termination.Reason == trajectory.EndInterrupted {
			s.metrics.Recovered.Inc()
		}
	}
	rollouts, err := s.st.rollouts()
	if err != nil {
		return nil, err
	}
	for _, r := range rollouts {
		if r.EndedAt != nil {
			continue
		}
		ids, err := s.recoverRollout(r)
		if err != nil {
			return nil, err
		}
		rec.Rollouts = append(rec.Rollouts, r.ID)
		rec.Interrupted = append(rec.Interrupted, ids...)
	}
	envs, err := s.st.openEnvEpisodes()
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	for _, e := range envs {
		e.State, e.EndedAt, e.Reason = episodeDone, &now, trajectory.EndInterrupted
		if t, err := trajectory.Read(s.st.trajectoryPath(e.ID)); err == nil && t.Termination != nil {
			e.Reason = t.Termination.Reason
		}
		if err := s.st.putEpisode(e); err != nil {
			return nil, err
		}
		if e.Reason == trajectory.EndInterrupted {
			rec.Interrupted = append(rec.Interrupted, e.ID)
		}
	}
	if len(rec.Interrupted) > 0 || len(rec.Rollouts) > 0 {
		s.log.Warn("recovered from a previous process", "episodes_interrupted", len(rec.Interrupted), "rollouts", rec.Rollouts)
	}
	return rec, nil
}

// recoverRollout ends every episode of an unfinished rollout: those with a
// record (ended, or recovered from a journal as interrupted) are indexed as
// they are; those that never started are recorded as interrupted.
func (s *Server) recoverRollout(r *rolloutRecord) ([]string, error) {
	eps, err := s.st.rolloutEpisodes(r.ID)
	if err != nil {
		return nil, err
	}
	seq := 0
	for _, e := range eps {
		seq = max(seq, e.Seq)
	}
	var interrupted []string
	now := time.Now().UTC()
	for _, e := range eps {
		if e.State == episodeDone {
			continue
		}
		t, err := trajectory.Read(s.st.trajectoryPath(e.ID))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
			task := &agent.Task{}
			if e.TaskIndex < len(r.Tasks) {
				json.Unmarshal(r.Tasks[e.TaskIndex], task)
			}
			t, err = writeUnstartedRecord(s.st.episodesDir, e, task, r.Backend, r.Policy, trajectory.EndInterrupted,
				"the service stopped before this episode started")
			if err != nil {
				return nil, err
			}
			s.metrics.Recovered.Inc()
		}
		seq++
		e.State, e.Seq, e.EndedAt = episodeDone, seq, &now
		if t.Termination != nil {
			e.Reason = t.Termination.Reason
		}
		if v, ok := t.Value(); ok {
			e.Reward = &v
		}
		if e.Reason == trajectory.EndInterrupted {
			interrupted = append(interrupted, e.ID)
		}
		if err := s.st.putEpisode(e); err != nil {
			return nil, err
		}
	}
	switch {
	case r.State == RolloutCancelled:
	case len(interrupted) > 0:
		r.State = RolloutInterrupted
		r.Message = fmt.Sprintf("the service stopped with %d episode(s) of this rollout unfinished; they are recorded as interrupted", len(interrupted))
	default:
		r.State = RolloutDone
	}
	r.EndedAt = &now
	return interrupted, s.st.putRollout(r)
}

// Handler is the HTTP API.
func (s *Server) Handler() http.Handler { return s.mux }

// Route is one route the API serves.
type Route struct {
	Method, Path string
}

// routeTable is every route, in the order of the OpenAPI document.
func (s *Server) routeTable() []struct {
	Route
	h func(http.ResponseWriter, *http.Request) error
} {
	type rt = struct {
		Route
		h func(http.ResponseWriter, *http.Request) error
	}
	return []rt{
		{Route{"POST", "/v1/rollouts"}, s.postRollout},
		{Route{"GET", "/v1/rollouts"}, s.listRollouts},
		{Route{"GET", "/v1/rollouts/{id}"}, s.getRollout},
		{Route{"DELETE", "/v1/rollouts/{id}"}, s.deleteRollout},
		{Route{"GET", "/v1/rollouts/{id}/episodes"}, s.getRolloutEpisodes},
		{Route{"GET", "/v1/rollouts/{id}/export"}, s.exportRollout},
		{Route{"GET", "/v1/rollouts/{id}/summary"}, s.rolloutSummary},
		{Route{"POST", "/v1/episodes"}, s.postEpisode},
		{Route{"GET", "/v1/episodes/{id}"}, s.getEpisode},
		{Route{"DELETE", "/v1/episodes/{id}"}, s.deleteEpisode},
		{Route{"POST", "/v1/episodes/{id}/step"}, s.postStep},
		{Route{"POST", "/v1/episodes/{id}/finish"}, s.postFinish},
		{Route{"GET", "/metrics"}, s.getMetrics},
		{Route{"GET", "/healthz"}, s.getHealth},
		{Route{"GET", "/openapi.json"}, s.getOpenAPI},
	}
}

// Routes lists the routes the API serves.
func (s *Server) Routes() []Route {
	var out []Route
	for _, r := range s.routeTable() {
		out = append(out, r.Route)
	}
	return out
}

func (s *Server) routes() {
	s.mux = http.NewServeMux()
	for _, rt := range s.routeTable() {
		pattern := rt.Method + " " + rt.Path
		h := rt.h
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			sw := &statusWriter{ResponseWriter: w, status: 200}
			start := time.Now()
			if err := h(sw, r); err != nil {
				var ae *apiError
				if !errors.As(err, &ae) {
					s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
				}
				if !sw.wrote {
					writeError(sw, err)
				}
			}
			s.metrics.HTTPRequests.WithLabelValues(pattern, strconv.Itoa(sw.status)).Inc()
			s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", sw.status, "duration", time.Since(start))
		})
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Code: codeNotFound,
			Message: fmt.Sprintf("no route %s %s (see GET /openapi.json)", r.Method, r.URL.Path)})
	})
}

// statusWriter records the status for metrics; it flushes through.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	w.wrote = true
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) postRollout(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, maxRolloutBody)
	if err != nil {
		return err
	}
	ro, jobs, err := s.parseRollout(body)
	if err != nil {
		return err
	}
	if err := s.submit(ro, jobs); err != nil {
		return err
	}
	st := ro.status()
	writeHTTPJSON(w, http.StatusCreated, map[string]any{"id": ro.id, "state": st.State, "episodes_total": st.EpisodesTotal})
	return nil
}

func (s *Server) listRollouts(w http.ResponseWriter, r *http.Request) error {
	recs, err := s.st.rollouts()
	if err != nil {
		return err
	}
	out := []RolloutStatus{}
	for _, rec := range recs {
		ro, err := s.lookupRollout(rec.ID)
		if err != nil {
			return err
		}
		out = append(out, ro.status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	writeHTTPJSON(w, http.StatusOK, map[string]any{"rollouts": out})
	return nil
}

func (s *Server) getRollout(w http.ResponseWriter, r *http.Request) error {
	ro, err := s.lookupRollout(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeHTTPJSON(w, http.StatusOK, ro.status())
	return nil
}

func (s *Server) deleteRollout(w http.ResponseWriter, r *http.Request) error {
	ro, err := s.lookupRollout(r.PathValue("id"))
	if err != nil {
		return err
	}
	s.cancelRollout(ro, "cancelled by the caller (DELETE)")
	writeHTTPJSON(w, http.StatusOK, ro.status())
	return nil
}

// getRolloutEpisodes writes finished episodes as NDJSON, one trajectory a
// line. With stream=1 it follows the rollout: an episode is sent when its
// GRPO group is complete (so every line carries "group"), and the response
// ends when the rollout has ended and everything was sent. Without stream
// it sends every episode finished so far, with "group" where its group is
// complete, and ends. from=N skips the first N lines (to resume a stream).
// Nothing is consumed: a client that disconnects can read again.
func (s *Server) getRolloutEpisodes(w http.ResponseWriter, r *http.Request) error {
	ro, err := s.lookupRollout(r.PathValue("id"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	stream := q.Get("stream") == "1" || q.Get("stream") == "true"
	from := 0
	if v := q.Get("from"); v != "" {
		if from, err = strconv.Atoi(v); err != nil || from < 0 {
			return badField("from", "%q is not a non-negative integer", v)
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		http.NewResponseController(w).Flush()
		return nil
	}
	var line bytes.Buffer
	writeLine := func(e *episodeState, stats *trajectory.GroupStats) error {
		line.Reset()
		if err := s.episodeLine(&line, e, stats); err != nil {
			s.log.Error("reading an episode for a stream", "episode", e.rec.ID, "err", err)
			line.Reset()
			s.unreadableLine(&line, ro, e, stats, err)
		}
		_, err := bw.Write(line.Bytes())
		return err
	}
	if !stream {
		ro.mu.Lock()
		list := append([]*episodeState(nil), ro.finished...)
		stats := make([]*trajectory.GroupStats, len(list))
		for i, e := range list {
			stats[i] = e.stats
		}
		ro.mu.Unlock()
		for i := from; i < len(list); i++ {
			if err := writeLine(list[i], stats[i]); err != nil {
				return nil
			}
		}
		flush()
		return nil
	}
	for {
		ro.mu.Lock()
		var batch []*episodeState
		if from < len(ro.released) {
			batch = append(batch, ro.released[from:]...)
		}
		ended := len(ro.finished) == len(ro.episodes)
		changed := ro.changed
		ro.mu.Unlock()
		for _, e := range batch {
			if err := writeLine(e, e.stats); err != nil {
				return nil // the client went away
			}
			from++
		}
		if err := flush(); err != nil {
			return nil
		}
		if ended && len(batch) == 0 {
			return nil
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return nil
		case <-s.ctx.Done():
			return nil
		}
	}
}

// rolloutSummary answers the rollout's summary.json (as rollbox run writes
// it) over the episodes finished so far, with the infrastructure retries.
func (s *Server) rolloutSummary(w http.ResponseWriter, r *http.Request) error {
	ro, err := s.lookupRollout(r.PathValue("id"))
	if err != nil {
		return err
	}
	ro.mu.Lock()
	list := append([]*episodeState(nil), ro.finished...)
	retries, created := ro.rec.InfraRetries, ro.rec.CreatedAt
	end := time.Now()
	if ro.rec.EndedAt != nil {
		end = *ro.rec.EndedAt
	}
	ro.mu.Unlock()
	var ts []*trajectory.Trajectory
	for _, e := range list {
		t, err := s.readEpisode(e, nil)
		if err != nil {
			return err
		}
		t.Steps = nil // Summarize needs the outcome, not the steps
		ts = append(ts, t)
	}
	sum := Summarize(ro.id, ts)
	sum.InfraRetries, sum.StartedAt, sum.WallTimeS = retries, created, end.Sub(created).Seconds()
	writeHTTPJSON(w, http.StatusOK, sum)
	return nil
}

// episodeLine appends an episode's record as one NDJSON line with its
// group statistics: the stored document compacted, "group" spliced in
// before its closing brace (the stored document never has one), so a
// stream costs no decoding.
func (s *Server) episodeLine(buf *bytes.Buffer, e *episodeState, stats *trajectory.GroupStats) error {
	doc, err := os.ReadFile(s.st.trajectoryPath(e.rec.ID))
	if err != nil {
		return err
	}
	if err := json.Compact(buf, doc); err != nil {
		return fmt.Errorf("episode %s: %w", e.rec.ID, err)
	}
	if stats != nil {
		b := buf.Bytes()
		if len(b) < 2 || b[len(b)-1] != '}' {
			return fmt.Errorf("episode %s: its record is not a JSON object", e.rec.ID)
		}
		buf.Truncate(buf.Len() - 1)
		g, _ := json.Marshal(stats)
		buf.WriteString(`,"group":`)
		buf.Write(g)
		buf.WriteByte('}')
	}
	buf.WriteByte('\n')
	return nil
}

// unreadableLine appends the line of an episode whose record cannot be read
// (lost to a full disk, damaged): a trajectory document with the episode's
// identity from the index and an unscored record_error end naming the
// failure, so a reader gets a line for every episode and learns what became
// of this one.
func (s *Server) unreadableLine(buf *bytes.Buffer, r *rollout, e *episodeState, stats *trajectory.GroupStats, readErr error) {
	rec := e.rec
	t := &trajectory.Trajectory{Schema: trajectory.Schema, EpisodeID: rec.ID, RolloutID: rec.RolloutID, GroupID: rec.GroupID,
		GroupIndex: rec.GroupIndex, TaskID: rec.TaskID, Seed: int64(rec.GroupIndex), Task: json.RawMessage("{}"),
		Steps: []trajectory.Step{}, ContextEvents: []trajectory.ContextEvent{}, Stats: trajectory.Stats{ToolErrors: map[string]int{}},
		Termination: &trajectory.Termination{Reason: trajectory.EndRecordError, Step: -1,
			Message: fmt.Sprintf("the episode's record could not be read: %v (the index has it ended %s)", readErr, rec.Reason)},
		Group: stats}
	if e.task != nil {
		t.Task, _ = json.Marshal(e.task)
		t.TaskHash = e.task.Hash()
		t.Sandbox.Backend = e.task.Sandbox.Backend
	}
	if t.Sandbox.Backend == "" {
		t.Sandbox.Backend = r.rec.Backend
	}
	t.Policy = r.rec.Policy
	if rec.EndedAt != nil {
		t.StartedAt, t.EndedAt = *rec.EndedAt, rec.EndedAt
	}
	b, _ := json.Marshal(t)
	buf.Write(b)
	buf.WriteByte('\n')
}

// exportRollout writes a rollout's finished episodes as JSONL or Parquet.
func (s *Server) exportRollout(w http.ResponseWriter, r *http.Request) error {
	ro, err := s.lookupRollout(r.PathValue("id"))
	if err != nil {
		return err
	}
	format := r.URL.Query().Get("format")
	if format == "" {
		format = "jsonl"
	}
	if format != "jsonl" && format != "parquet" {
		return badField("format", "%q is not one of jsonl, parquet", format)
	}
	ro.mu.Lock()
	list := append([]*episodeState(nil), ro.finished...)
	stats := make([]*trajectory.GroupStats, len(list))
	for i, e := range list {
		stats[i] = e.stats
	}
	ro.mu.Unlock()
	var ts []*trajectory.Trajectory
	for i, e := range list {
		t, err := s.readEpisode(e, stats[i])
		if err != nil {
			return err
		}
		ts = append(ts, t)
	}
	name := ro.id + "." + format
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
	if format == "jsonl" {
		w.Header().Set("Content-Type", "application/x-ndjson")
		return WriteJSONL(w, ts)
	}
	rows := make([]ExportRow, len(ts))
	for i, t := range ts {
		rows[i] = RowOf(t)
	}
	w.Header().Set("Content-Type", "application/vnd.apache.parquet")
	return WriteParquet(w, rows)
}

func (s *Server) getMetrics(w http.ResponseWriter, r *http.Request) error {
	promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	return nil
}

// Health is the body of GET /healthz.
type Health struct {
	Status          string  `json:"status"`
	UptimeS         float64 `json:"uptime_s"`
	EpisodesQueued  int     `json:"episodes_queued"`
	EpisodesRunning int     `json:"episodes_running"`
	EnvEpisodes     int     `json:"env_episodes"`
}

func (s *Server) getHealth(w http.ResponseWriter, r *http.Request) error {
	q, run := s.sched.counts()
	s.mu.Lock()
	env := len(s.env)
	closing := s.closing
	s.mu.Unlock()
	h := Health{Status: "ok", UptimeS: time.Since(s.started).Seconds(), EpisodesQueued: q, EpisodesRunning: run, EnvEpisodes: env}
	status := http.StatusOK
	if closing {
		h.Status, status = "shutting_down", http.StatusServiceUnavailable
	}
	writeHTTPJSON(w, status, h)
	return nil
}

//go:embed openapi.json
var openAPI []byte

// OpenAPI is the API's OpenAPI 3.1 document.
func OpenAPI() []byte { return openAPI }

func (s *Server) getOpenAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openAPI)
	return nil
}

// Close stops the service: new work is refused, episodes in flight and
// queued end "interrupted" (their sandboxes stopped), env episodes too,
// and the store is closed. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		var live []*rollout
		for _, r := range s.rollouts {
			live = append(live, r)
		}
		var envs []*envEpisode
		for _, e := range s.env {
			envs = append(envs, e)
		}
		s.mu.Unlock()
		var wg sync.WaitGroup
		for _, r := range live {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.stopRollout(r, RolloutInterrupted, trajectory.EndInterrupted, "the service stopped")
			}()
		}
		for _, e := range envs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.endEnv(e, trajectory.EndInterrupted, "the service stopped")
			}()
		}
		wg.Wait()
		s.wg.Wait()
		s.cancel()
		s.bg.Wait()
		s.endpoints.Close()
		errs := []error{s.sandboxes.Close(), s.st.Close()}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// poolCollector exports the warm pools' sizes and counters.
type poolCollector struct{ x *sandboxes }

var (
	poolReadyDesc  = prometheus.NewDesc("rollbox_sandbox_pool_ready", "Ready sandboxes in warm pools, by backend.", []string{"backend"}, nil)
	poolHitsDesc   = prometheus.NewDesc("rollbox_sandbox_pool_hits_total", "Sandboxes handed out ready by a warm pool, by backend.", []string{"backend"}, nil)
	poolMissesDesc = prometheus.NewDesc("rollbox_sandbox_pool_misses_total", "Sandboxes a warm pool had to create on demand, by backend.", []string{"backend"}, nil)
	poolTargetDesc = prometheus.NewDesc("rollbox_sandbox_pool_target", "Ready sandboxes the warm pools aim for (sized from waiting episodes), by backend.", []string{"backend"}, nil)
)

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolReadyDesc
	ch <- poolHitsDesc
	ch <- poolMissesDesc
	ch <- poolTargetDesc
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for backend, st := range c.x.poolStats() {
		ch <- prometheus.MustNewConstMetric(poolReadyDesc, prometheus.GaugeValue, float64(st.Ready), backend)
		ch <- prometheus.MustNewConstMetric(poolHitsDesc, prometheus.CounterValue, float64(st.Hits), backend)
		ch <- prometheus.MustNewConstMetric(poolMissesDesc, prometheus.CounterValue, float64(st.Misses), backend)
		ch <- prometheus.MustNewConstMetric(poolTargetDesc, prometheus.GaugeValue, float64(st.Target), backend)
	}
}
