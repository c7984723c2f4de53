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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cpugate"
	"github.com/rollbox/rollbox/internal/proc"
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
	// SearchIndex, on a cluster coordinator, is the identity
	// (cluster.IndexIdentity) of the index a search task names, as opened
	// on this host: each work item carries it, and workers run the episode
	// only on the same index. Without it a coordinator refuses search tasks.
	SearchIndex func(*agent.Task) (string, error)
	// Registry receives the metrics and serves /metrics; a new one when nil.
	Registry *prometheus.Registry
	// Logger gets the structured log; slog.Default() when nil.
	Logger *slog.Logger
	Limits Limits
	// HTTP are the timeouts of HTTPServer and of every answer.
	HTTP HTTPTimeouts
	// Maxima bound what one request may ask for.
	Maxima Maxima
	// Tenants, when set, are the bearer tokens every request but /healthz
	// and /openapi.json needs; each owns what it creates.
	Tenants *Tenants
	// AllowedHosts, when set, are the only Host names the service answers
	// to (LoopbackHosts for a service on a loopback address).
	AllowedHosts []string
	// Judge configures the pool every episode's judge rewards share (the
	// bound per endpoint, the cache, the keys); the service adds its
	// metrics.
	Judge judge.Options

	// OutcomeSpec is the outcome reward of imported episodes that bring
	// none (DefaultOutcomeSpec when nil).
	OutcomeSpec *OutcomeSpec
	// Redactor redacts imported episodes before they are stored (the
	// default patterns when nil).
	Redactor *Redactor
	// Now is the clock of outcome windows (time.Now when nil; tests move
	// it).
	Now func() time.Time

	// Cluster, when set, makes the service a coordinator: admitted
	// episodes are published to `rollbox worker` processes over NATS
	// JetStream instead of run here.
	Cluster *ClusterOptions
	// Recycle, when set, is when an idle service asks its caller to be
	// re-executed to give its memory back (RecycleDue); nil: never.
	Recycle *RecyclePolicy

	// recoveryGate, when set (by tests), holds the recovery until closed.
	recoveryGate chan struct{}
}

// Server is the rollout service: the HTTP API over the scheduler, the
// sandboxes and the store. Open it, serve Handler, Close it.
type Server struct {
	opts      Options
	limits    Limits
	maxima    Maxima
	log       *slog.Logger
	st        *store
	metrics   *Metrics
	registry  *prometheus.Registry
	catalog   map[string]*agent.Task
	sched     *scheduler
	backends  *backendOpener
	sandboxes *sandboxes
	storage   *storageMonitor
	endpoints *endpoints
	judges    *judge.Pool
	// coord dispatches episodes to workers (nil: they run here).
	coord   *coordinator
	mux     *http.ServeMux
	started time.Time

	ctx    context.Context // lifecycle: cancelled (with an agent.StopCause) by Shutdown
	cancel context.CancelCauseFunc
	bg     sync.WaitGroup // dispatcher, pool sizer, reaper, storage monitor, recovery
	wg     sync.WaitGroup // episodes, and the records of episodes ended unstarted

	// recovered is closed when the recovery of what a previous process left
	// has ended (recovery and recoveryErr are then set).
	recovered     chan struct{}
	recovery      *Recovery
	recoveryErr   error
	recoveringAny atomic.Bool
	closingFlag   atomic.Bool
	envOpen       atomic.Int64
	// opens are the WASM rollout episodes' turns to open (openGate).
	opens *opens
	// cpu bounds the rollout episodes doing CPU-bound work at once
	// (agent.Config.CPU, callApart, the stream's encoding).
	cpu *cpugate.Gate
	// unstartedEnding counts the bulk ends of never-started episodes being
	// recorded in the background (stopRollout): the service is not idle.
	unstartedEnding atomic.Int64

	// unindexed are episode ends (and ended rollouts) the index could not
	// take (a full disk); flushUnindexed retries them.
	unindexedAny      atomic.Bool
	unindexedMu       sync.Mutex
	unindexed         []*episodeRecord
	unindexedRollouts []*rollout

	// inFlight counts the API requests being answered (streams and imports
	// included); recycleDue takes one value when the service asks to be
	// re-executed (Options.Recycle); anonAtStart is its anonymous memory
	// when it opened.
	inFlight    atomic.Int64
	worked      atomic.Bool // an import took a slot or an environment episode opened (reclaimWhenIdle takes it)
	recycleDue  chan struct{}
	anonAtStart atomic.Int64

	mu         sync.Mutex
	rollouts   map[string]*rollout
	recovering map[string]bool // rollouts being recovered
	env        map[string]*envEpisode
	envOpening int
	closing    bool
	// policyVersions are the last policy version each tenant announced.
	policyVersions map[string]string
	closeOnce      sync.Once
	closeErr       error

	// Imports: a slot each running import holds (429 when none is free);
	// importMu makes chunks durable one at a time (no id stored twice);
	// outcomeMu serialises changes to imported records (signals, scoring).
	importSlots     chan struct{}
	importMu        sync.Mutex
	outcomeMu       sync.Mutex
	outcomeSpec     *OutcomeSpec
	outcomeSpecJSON json.RawMessage
	redactor        *Redactor
	now             func() time.Time
}

// Open opens the data directory and starts the service at once: the
// scheduler runs and Handler answers while what a crashed or stopped
// process left is recovered in the background (episodes in flight or queued
// are recorded as interrupted, their rollouts marked); until then the
// requests that need it answer 503 "recovering" (Recovered waits for it).
// Orphaned containers are the caller's to remove (cmd/rollbox serve does,
// by owner label).
func Open(opts Options) (*Server, error) {
	if opts.DataDir == "" {
		return nil, errors.New("runtime: Options.DataDir is required")
	}
	if opts.Backends == nil {
		return nil, errors.New("runtime: Options.Backends is required")
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
	opts.HTTP = opts.HTTP.withDefaults()
	st, err := openStore(opts.DataDir)
	if err != nil {
		return nil, err
	}
	unfinished, err := st.unfinishedRollouts()
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("reading %s: %w", opts.DataDir, err)
	}
	// What the previous process left is listed now, before this one starts
	// an episode: the recovery, which runs while the service answers,
	// finalizes those journals and never this process's own.
	left, err := findLeftovers(st.episodesDir)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("reading %s: %w", opts.DataDir, err)
	}
	s := &Server{opts: opts, limits: opts.Limits.withDefaults(), log: opts.Logger, st: st, registry: opts.Registry,
		catalog: map[string]*agent.Task{}, rollouts: map[string]*rollout{}, env: map[string]*envEpisode{}, started: time.Now(),
		recovering: map[string]bool{}, recovered: make(chan struct{}), recycleDue: make(chan struct{}, 1)}
	s.maxima = opts.Maxima.withDefaults(s.limits)
	s.importSlots = make(chan struct{}, s.limits.MaxImports)
	s.outcomeSpec, s.redactor, s.now = opts.OutcomeSpec, opts.Redactor, opts.Now
	if s.outcomeSpec == nil {
		s.outcomeSpec = DefaultOutcomeSpec()
	}
	s.outcomeSpecJSON, _ = json.Marshal(s.outcomeSpec)
	if s.redactor == nil {
		s.redactor, _ = NewRedactor(RedactionConfig{})
	}
	if s.now == nil {
		s.now = time.Now
	}
	for _, t := range opts.Catalog {
		s.catalog[t.ID] = t
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.metrics = NewMetrics(opts.Registry)
	jo := opts.Judge
	jo.Observe = s.metrics.judgeObserver()
	s.judges = judge.NewPool(jo)
	s.endpoints = &endpoints{limit: s.limits.PolicyConcurrency, m: map[string]*endpoint{}}
	s.opens = &opens{free: openingAtOnce()}
	switch n := s.limits.CPUAtOnce; {
	case n == 0:
		s.cpu = cpugate.New(cpugate.Size())
	case n > 0:
		s.cpu = cpugate.New(n)
	}
	s.backends = newBackendOpener(s.ctx, opts.Backends, s.log)
	s.sandboxes = &sandboxes{backends: s.backends, metrics: s.metrics, warm: s.limits.WarmPool, pools: map[string]*sandbox.Pool{}}
	s.storage = newStorageMonitor(st.dir, s.limits.DiskReserve, s.limits.StorageCheckEvery, s.storageChanged)
	opts.Registry.MustRegister(poolCollector{s.sandboxes}, healthCollector{s},
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rollbox_cpu_gate_wait_seconds_total",
			Help: "Time rollout episodes waited, in all, for a turn at the CPU gate (their CPU-bound work runs a few at a time; waits for the policy, tools and the disk are outside it)."},
			func() float64 { return s.cpu.Stats().Wait.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rollbox_cpu_gate_waiting",
			Help: "Rollout episodes waiting now for a turn at the CPU gate."},
			func() float64 { return float64(s.cpu.Stats().Waiting) }))
	openEnv, err := st.openEnvEpisodes()
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("reading %s: %w", opts.DataDir, err)
	}
	for _, r := range unfinished {
		s.recovering[r.ID] = true
	}
	// Only what a previous process left unfinished waits for the recovery
	// (503 "recovering"); a clean data directory answers everything at once.
	s.recoveringAny.Store(len(unfinished) > 0 || len(openEnv) > 0)
	var runner episodeRunner = localRunner{s}
	if opts.Cluster != nil {
		c, err := newCoordinator(s, *opts.Cluster)
		if err != nil {
			s.cancel(nil)
			st.Close()
			return nil, err
		}
		s.coord, runner = c, c
	}
	s.sched = newScheduler(s.limits, runner.start, s.storage.ok, s.coord != nil)
	s.sched.warn = s.log.Warn
	// Before any request can come (the caller listens once Open returns).
	s.anonAtStart.Store(proc.StatusBytes("self", "RssAnon:"))
	s.bg.Add(7)
	go func() { defer s.bg.Done(); s.reclaimWhenIdle(s.ctx) }()
	go func() { defer s.bg.Done(); s.sweepOutcomes(s.ctx.Done()) }()
	go func() { defer s.bg.Done(); s.sched.run(s.ctx) }()
	go func() {
		defer s.bg.Done()
		if s.coord != nil {
			// A coordinator keeps no sandboxes; it consumes what its
			// workers journal back.
			if err := s.coord.run(s.ctx); err != nil {
				s.log.Error("cluster: the coordinator stopped consuming", "err", err)
			}
			return
		}
		s.sched.sizePools(s.ctx, s.sandboxes)
	}()
	go func() { defer s.bg.Done(); s.reapIdle(s.ctx) }()
	go func() { defer s.bg.Done(); s.storage.run(s.ctx.Done()) }()
	go func() {
		defer s.bg.Done()
		if opts.recoveryGate != nil {
			<-opts.recoveryGate
		}
		rest, resumed := unfinished, []string(nil)
		if s.coord != nil {
			resumed, rest = s.coord.resume(unfinished)
		}
		rec, err := s.recover(rest, left)
		if rec != nil {
			rec.Resumed = resumed
		}
		if err != nil {
			s.log.Error("recovering what the previous process left failed; the rollouts it concerns answer 503 until a restart", "err", err)
		}
		s.mu.Lock()
		s.recovery, s.recoveryErr = rec, err
		if err == nil {
			s.recovering = map[string]bool{}
		}
		s.mu.Unlock()
		s.recoveringAny.Store(err != nil)
		close(s.recovered)
	}()
	s.routes()
	return s, nil
}

// Recovered waits until the recovery of what a previous process left has
// ended, and returns what it found.
func (s *Server) Recovered(ctx context.Context) (*Recovery, error) {
	select {
	case <-s.recovered:
		return s.recovery, s.recoveryErr
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// storageChanged logs a change of the data directory's state and, when it
// can take work again, wakes the dispatcher.
func (s *Server) storageChanged(old, new *StorageHealth) {
	if new.State == StorageOK {
		s.log.Info("the data directory takes new work again", "free_bytes", new.FreeBytes)
		s.flushUnindexed()
		signal(s.sched.wake)
		return
	}
	s.log.Warn("the data directory cannot take new work; new rollouts are refused and queued episodes wait",
		"state", new.State, "free_bytes", new.FreeBytes, "reserve_bytes", new.ReserveBytes, "err", new.Error)
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
		{Route{"POST", "/v1/rollouts/{id}/policy-version"}, s.postRolloutPolicyVersion},
		{Route{"POST", "/v1/policy-version"}, s.postPolicyVersion},
		{Route{"POST", "/v1/episodes"}, s.postEpisode},
		{Route{"GET", "/v1/episodes/{id}"}, s.getEpisode},
		{Route{"DELETE", "/v1/episodes/{id}"}, s.deleteEpisode},
		{Route{"POST", "/v1/episodes/{id}/step"}, s.postStep},
		{Route{"POST", "/v1/episodes/{id}/finish"}, s.postFinish},
		{Route{"POST", "/v1/episodes/{id}/fork"}, s.postFork},
		{Route{"POST", "/v1/episodes/{id}/outcomes"}, s.postOutcomes},
		{Route{"POST", "/v1/imports"}, s.postImport},
		{Route{"GET", "/v1/export"}, s.exportEpisodes},
		{Route{"GET", "/v1/workers"}, s.getWorkers},
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
		public := rt.Method == http.MethodGet && (rt.Path == "/healthz" || rt.Path == "/openapi.json")
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			s.inFlight.Add(1)
			defer s.inFlight.Add(-1)
			sw := &statusWriter{ResponseWriter: w, status: 200}
			start := time.Now()
			http.NewResponseController(w).SetWriteDeadline(start.Add(s.opts.HTTP.Write))
			r, err := s.guard(r, public)
			if err == nil {
				err = h(sw, r)
			}
			if err != nil {
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
		if _, err := s.guard(r, false); err != nil {
			writeError(w, err)
			return
		}
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
	ro, jobs, err := s.parseRollout(r.Context(), body)
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
	tenant := tenantOf(r)
	for _, rec := range recs {
		if !ownedBy(rec.Tenant, tenant) {
			continue
		}
		ro, err := s.lookupRollout(rec.ID, rec.Tenant)
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
	ro, err := s.lookupRollout(r.PathValue("id"), tenantOf(r))
	if err != nil {
		return err
	}
	writeHTTPJSON(w, http.StatusOK, ro.status())
	return nil
}

func (s *Server) deleteRollout(w http.ResponseWriter, r *http.Request) error {
	ro, err := s.lookupRollout(r.PathValue("id"), tenantOf(r))
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
	ro, err := s.lookupRollout(r.PathValue("id"), tenantOf(r))
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
	lw := s.longAnswer(w)
	bw := bufio.NewWriterSize(lw, 64<<10)
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return lw.Flush()
	}
	var line bytes.Buffer
	writeLine := func(e *episodeState, stats *trajectory.GroupStats) error {
		line.Reset()
		if e.rec.Reason == trajectory.EndRecordError {
			s.unreadableLine(&line, ro, e, stats, errNoRecord)
		} else if err := s.episodeLine(&line, e, stats); err != nil {
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
	ro, err := s.lookupRollout(r.PathValue("id"), tenantOf(r))
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
	ts, missing, _ := s.readFinished(ro, list, nil, false) // Summarize needs the outcome, not the steps
	sum := Summarize(ro.id, append(ts, missing...))
	sum.InfraRetries, sum.StartedAt, sum.WallTimeS = retries, created, end.Sub(created).Seconds()
	for _, t := range missing {
		sum.Unrecorded = append(sum.Unrecorded, t.EpisodeID)
	}
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
	t := unreadableTrajectory(e.rec, e.task, stats, r.rec.Backend, r.rec.Policy, readErr)
	b, _ := json.Marshal(t)
	buf.Write(b)
	buf.WriteByte('\n')
}

// unreadableTrajectory stands for the record of an ended episode that has
// none that can be read: its identity from the index, an unscored
// record_error end saying why (the index's message when the record could
// not be written, else the read error).
func unreadableTrajectory(rec *episodeRecord, task *agent.Task, stats *trajectory.GroupStats, backend string, pol trajectory.Policy, readErr error) *trajectory.Trajectory {
	msg := fmt.Sprintf("the episode's record could not be read: %v (the index has it ended %s)", readErr, rec.Reason)
	if rec.Reason == trajectory.EndRecordError && rec.Message != "" {
		msg = rec.Message
	}
	t := &trajectory.Trajectory{Schema: trajectory.Schema, EpisodeID: rec.ID, RolloutID: rec.RolloutID, GroupID: rec.GroupID,
		GroupIndex: rec.GroupIndex, TaskID: rec.TaskID, Seed: int64(rec.GroupIndex), Task: json.RawMessage("{}"),
		Steps: []trajectory.Step{}, ContextEvents: []trajectory.ContextEvent{}, Stats: trajectory.Stats{ToolErrors: map[string]int{}},
		Termination: &trajectory.Termination{Reason: trajectory.EndRecordError, Step: -1, Message: msg},
		Group:       stats, Policy: pol}
	if task != nil {
		t.Task, _ = json.Marshal(task)
		t.TaskHash = task.Hash()
		t.Sandbox.Backend = task.Sandbox.Backend
	}
	if t.Sandbox.Backend == "" {
		t.Sandbox.Backend = backend
	}
	if rec.EndedAt != nil {
		t.StartedAt, t.EndedAt = *rec.EndedAt, rec.EndedAt
	}
	return t
}

// errNoRecord is the read error of an episode that ended record_error.
var errNoRecord = errors.New("the episode ended without a record (record_error)")

// skippedHeader lists, in an export's answer, the episodes it left out
// because they have no readable record (record_error); skippedCountHeader
// counts them (the list stops at about 8 KB).
const (
	skippedHeader      = "Rollbox-Skipped-Episodes"
	skippedCountHeader = "Rollbox-Skipped"
)

// readFinished reads the records of a rollout's finished episodes (with
// their group statistics when stats is set). Episodes without a readable
// record are returned apart, as the index knows them.
func (s *Server) readFinished(ro *rollout, list []*episodeState, stats []*trajectory.GroupStats, steps bool) (ts []*trajectory.Trajectory, missing []*trajectory.Trajectory, err error) {
	for i, e := range list {
		var gs *trajectory.GroupStats
		if stats != nil {
			gs = stats[i]
		}
		var t *trajectory.Trajectory
		rerr := errNoRecord
		if e.rec.Reason != trajectory.EndRecordError {
			t, rerr = s.readEpisode(e, gs)
		}
		if rerr != nil {
			if rerr != errNoRecord {
				s.log.Warn("an episode has no readable record", "episode", e.rec.ID, "reason", e.rec.Reason, "err", rerr)
			}
			missing = append(missing, unreadableTrajectory(e.rec, e.task, gs, ro.rec.Backend, ro.rec.Policy, rerr))
			continue
		}
		if !steps {
			t.Steps = nil
		}
		ts = append(ts, t)
	}
	return ts, missing, nil
}

// exportRollout writes a rollout's finished episodes as JSONL or Parquet.
func (s *Server) exportRollout(w http.ResponseWriter, r *http.Request) error {
	ro, err := s.lookupRollout(r.PathValue("id"), tenantOf(r))
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
	layout := r.URL.Query().Get("layout")
	if layout == "" {
		layout = LayoutEpisodes
	}
	if layout != LayoutEpisodes && layout != LayoutSegments {
		return badField("layout", "%q is not one of episodes, segments", layout)
	}
	ro.mu.Lock()
	list := append([]*episodeState(nil), ro.finished...)
	stats := make([]*trajectory.GroupStats, len(list))
	for i, e := range list {
		stats[i] = e.stats
	}
	ro.mu.Unlock()
	ts, missing, _ := s.readFinished(ro, list, stats, true)
	if len(missing) > 0 {
		ids := make([]string, 0, len(missing))
		size := 0
		for _, t := range missing {
			if size += len(t.EpisodeID) + 1; size > 8<<10 {
				break
			}
			ids = append(ids, t.EpisodeID)
		}
		w.Header().Set(skippedCountHeader, strconv.Itoa(len(missing)))
		w.Header().Set(skippedHeader, strings.Join(ids, ","))
	}
	name := ro.id + "." + format
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
	if format == "jsonl" {
		w.Header().Set("Content-Type", "application/x-ndjson")
	} else {
		w.Header().Set("Content-Type", "application/vnd.apache.parquet")
	}
	return WriteExport(s.longAnswer(w), ts, format, layout)
}

func (s *Server) getMetrics(w http.ResponseWriter, r *http.Request) error {
	promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}).ServeHTTP(w, r)
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

// Close stops the service as Shutdown does, within 30 seconds.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.Shutdown(ctx)
}

// Shutdown stops the service within ctx's deadline: new work is refused
// (503), queued episodes are recorded interrupted in bulk, running ones
// (rollout and environment mode) are cancelled and end interrupted (their
// tool calls killed, their sandboxes removed), and the store is closed.
// Episodes that have not ended when ctx ends are left to the next start,
// which recovers their journals as interrupted and removes their
// containers; the error says how many. It is idempotent.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.shutdown(ctx) })
	return s.closeErr
}

func (s *Server) shutdown(ctx context.Context) error {
	const message = "the service stopped"
	s.mu.Lock()
	s.closing = true
	s.closingFlag.Store(true)
	var live []*rollout
	for _, r := range s.rollouts {
		live = append(live, r)
	}
	var envs []*envEpisode
	for _, e := range s.env {
		envs = append(envs, e)
	}
	s.mu.Unlock()
	for _, r := range live {
		s.stopRollout(r, RolloutInterrupted, trajectory.EndInterrupted, message)
	}
	for _, e := range envs {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.endEnv(e, trajectory.EndInterrupted, message)
		}()
	}
	var errs []error
	if s.coord != nil {
		// The workers end the dispatched episodes (cancelled with the
		// rollouts) and journal them back; what has not come back when
		// ctx ends is recorded interrupted by the next start.
		if n := s.coord.waitIdle(ctx); n > 0 {
			errs = append(errs, fmt.Errorf("%d dispatched episode(s) had not come back from their workers when the shutdown deadline passed", n))
		}
	}
	if !waitGroup(ctx, &s.wg) {
		_, running := s.sched.counts()
		errs = append(errs, fmt.Errorf("%d episode(s) had not ended when the shutdown deadline passed: the next start records them interrupted from their journals and removes their containers", running))
	}
	s.cancel(&agent.StopCause{Reason: trajectory.EndInterrupted, Message: message})
	waitGroup(ctx, &s.bg)
	if s.coord != nil {
		s.coord.close()
	}
	s.backends.Close()
	s.endpoints.Close()
	closed := make(chan error, 1)
	go func() { closed <- s.sandboxes.Close() }()
	select {
	case err := <-closed:
		errs = append(errs, err)
	case <-ctx.Done():
		errs = append(errs, errors.New("the warm pools were still being emptied when the shutdown deadline passed"))
	}
	s.flushUnindexed()
	errs = append(errs, s.st.Close())
	return errors.Join(errs...)
}

// waitGroup waits for wg until ctx ends; it reports whether wg was done.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
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
