package runtime

import (
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollbox/rollbox/sandbox"
)

// Health statuses of GET /healthz.
const (
	HealthOK = "ok"
	// HealthDegraded: something is wrong (a backend is down, the data
	// directory is below its reserve) but work can still run. 200.
	HealthDegraded = "degraded"
	// HealthUnavailable: nothing can run (the default backend is down and no
	// other is up, or the data directory takes no writes). 503.
	HealthUnavailable = "unavailable"
	// HealthRecovering: what a previous process left is being recovered. 503.
	HealthRecovering = "recovering"
	// HealthShuttingDown: the service is stopping. 503.
	HealthShuttingDown = "shutting_down"
)

// Health is the body of GET /healthz.
type Health struct {
	Status string `json:"status"`
	// Problems says, one sentence each, why the status is not ok.
	Problems        []string                 `json:"problems,omitempty"`
	UptimeS         float64                  `json:"uptime_s"`
	EpisodesQueued  int                      `json:"episodes_queued"`
	EpisodesRunning int                      `json:"episodes_running"`
	EnvEpisodes     int                      `json:"env_episodes"`
	DefaultBackend  string                   `json:"default_backend"`
	Backends        map[string]BackendHealth `json:"backends"`
	Storage         StorageHealth            `json:"storage"`
}

// health computes /healthz from state every part of the service publishes
// as atomics: no lock is taken and no I/O is done, so a probe is answered at
// once however loaded the service is.
func (s *Server) health() (Health, int) {
	h := Health{Status: HealthOK, UptimeS: time.Since(s.started).Seconds(),
		EpisodesQueued: int(s.sched.queuedN.Load()), EpisodesRunning: int(s.sched.runningN.Load()),
		EnvEpisodes: int(s.envOpen.Load()), DefaultBackend: s.opts.DefaultBackend,
		Backends: s.backends.health(), Storage: s.storage.health()}
	canRun, anyUp := true, false
	names := make([]string, 0, len(h.Backends))
	for name := range h.Backends {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b := h.Backends[name]
		switch b.State {
		case BackendUp:
			anyUp = true
		case BackendDown:
			h.Problems = append(h.Problems, "backend "+name+" is down: "+b.Error)
			if name == s.opts.DefaultBackend {
				canRun = false
			}
		}
	}
	if anyUp {
		canRun = true
	}
	switch h.Storage.State {
	case StorageOK:
	case StorageLow:
		h.Problems = append(h.Problems, "the data directory is below its free-space reserve: new work is refused and queued episodes wait")
	default:
		canRun = false
		h.Problems = append(h.Problems, "the data directory cannot be written ("+h.Storage.State+"): "+h.Storage.Error)
	}
	status := http.StatusOK
	switch {
	case s.closingFlag.Load():
		h.Status, status = HealthShuttingDown, http.StatusServiceUnavailable
	case s.recoveringAny.Load():
		h.Status, status = HealthRecovering, http.StatusServiceUnavailable
	case !canRun:
		h.Status, status = HealthUnavailable, http.StatusServiceUnavailable
	case len(h.Problems) > 0:
		h.Status = HealthDegraded
	}
	return h, status
}

// Busy says whether the service has work in hand: an episode queued or
// running, or an environment episode open. Lock-free.
//
// A cluster coordinator's episodes run on its workers, so they do not make
// it busy: it holds about one parked goroutine for each, its processors
// are mostly idle and look at the network poller themselves, so its
// listener needs no timer to accept promptly (internal/promptnet), and the
// timer's wake-ups (an accept attempt every 2 ms for as long as a rollout
// runs) were 5-8% of a coordinator's CPU in CoordinatorOverhead.
func (s *Server) Busy() bool {
	if s.envOpen.Load() > 0 {
		return true
	}
	return s.coord == nil && (s.sched.runningN.Load() > 0 || s.sched.queuedN.Load() > 0)
}

// Health is what GET /healthz answers now, and its status code.
func (s *Server) Health() (Health, int) { return s.health() }

func (s *Server) getHealth(w http.ResponseWriter, r *http.Request) error {
	h, status := s.health()
	if d, acc, ok := inService(r); ok {
		// The part of a probe's latency that is the service's: from the
		// request's arrival in this host's socket (or the accept) to the
		// answer; not the client's connect. rollbox bench reports it.
		w.Header().Set("Server-Timing", serverTiming(d, acc))
	}
	writeHTTPJSON(w, status, h)
	return nil
}

// serverTiming is a probe's Server-Timing header: the service's part of
// its latency and the time since its connection was accepted.
func serverTiming(service, sinceAccept time.Duration) string {
	return fmt.Sprintf("service;dur=%.3f, accept;dur=%.3f", ms(service), ms(sinceAccept))
}

// healthCollector exports what /healthz says as metrics.
type healthCollector struct{ s *Server }

var (
	backendUpDesc = prometheus.NewDesc("rollbox_backend_up",
		"1 when the sandbox backend is open and its sandboxes are made, 0 when it is down, -1 when nothing asked for it yet.", []string{"backend"}, nil)
	backendOpenFailuresDesc = prometheus.NewDesc("rollbox_backend_open_failures_total",
		"Failed attempts to open a sandbox backend.", []string{"backend"}, nil)
	storageFreeDesc = prometheus.NewDesc("rollbox_storage_free_bytes",
		"Free space of the data directory's file system (as statfs says to an unprivileged user).", nil, nil)
	storageOKDesc = prometheus.NewDesc("rollbox_storage_ok",
		"1 when the data directory takes new work, 0 when it is below its reserve, full, read-only or failing.", []string{"state"}, nil)
	healthDesc = prometheus.NewDesc("rollbox_health",
		"1 for the service's current /healthz status.", []string{"status"}, nil)
	forkSparesDesc = prometheus.NewDesc("rollbox_fork_spares_ready",
		"Fresh sandboxes a backend keeps ready for forks (rollbox serve --fork-spares), by backend.", []string{"backend"}, nil)
	forkChildrenDesc = prometheus.NewDesc("rollbox_fork_children_total",
		"Sandboxes forks made, by backend and source: spare (taken ready) or cold (created for the fork).", []string{"backend", "source"}, nil)
)

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backendUpDesc
	ch <- backendOpenFailuresDesc
	ch <- storageFreeDesc
	ch <- storageOKDesc
	ch <- healthDesc
	ch <- forkSparesDesc
	ch <- forkChildrenDesc
}

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	for name, st := range c.s.backends.states {
		v := 0.0
		switch st.health.Load().State {
		case BackendUp:
			v = 1
		case BackendUnused:
			v = -1
		}
		ch <- prometheus.MustNewConstMetric(backendUpDesc, prometheus.GaugeValue, v, name)
		ch <- prometheus.MustNewConstMetric(backendOpenFailuresDesc, prometheus.CounterValue, float64(st.openFailures.Load()), name)
		st.mu.Lock()
		be := st.be
		st.mu.Unlock()
		if fs, ok := sandbox.Find[sandbox.ForkSpareStats](be); ok {
			f := fs.ForkStats()
			ch <- prometheus.MustNewConstMetric(forkSparesDesc, prometheus.GaugeValue, float64(f.SparesReady), name)
			ch <- prometheus.MustNewConstMetric(forkChildrenDesc, prometheus.CounterValue, float64(f.FromSpares), name, "spare")
			ch <- prometheus.MustNewConstMetric(forkChildrenDesc, prometheus.CounterValue, float64(f.Cold), name, "cold")
		}
	}
	sh := c.s.storage.health()
	ch <- prometheus.MustNewConstMetric(storageFreeDesc, prometheus.GaugeValue, float64(sh.FreeBytes))
	ok := 0.0
	if sh.State == StorageOK {
		ok = 1
	}
	ch <- prometheus.MustNewConstMetric(storageOKDesc, prometheus.GaugeValue, ok, sh.State)
	h, _ := c.s.health()
	ch <- prometheus.MustNewConstMetric(healthDesc, prometheus.GaugeValue, 1, h.Status)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
