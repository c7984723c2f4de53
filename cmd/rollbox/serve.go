package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	pprofhttp "net/http/pprof"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/internal/cluster"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/auditlog"
)

// promptAccept is how often a busy service looks for new connections
// (internal/promptnet): a probe waits about this long, not behind the
// episodes' goroutines.
const promptAccept = 2 * time.Millisecond

// newServeCmd is `rollbox serve`: the rollout HTTP API over --data DIR.
func newServeCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Serve the rollout HTTP API",
		Long: `Serve the rollout HTTP API (docs/api.md; the OpenAPI document is served at
/openapi.json): rollout mode (submit tasks × group size against a policy
endpoint, stream the finished episodes with their group statistics) and
environment mode (reset/step/finish for trainers that own the agent loop).
Everything is kept under --data and survives restarts. Logs are JSON lines on
stderr.`,
		Example: `  rollbox serve --addr 127.0.0.1:7070 --data rollbox-data --tasks examples/coding/tasks.jsonl`,
		Args:    noArgs,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	addr := fs.String("addr", "127.0.0.1:7070", "`HOST:PORT` to listen on (port 0 picks one; the address is logged)")
	data := fs.String("data", "rollbox-data", "data `DIR`: the index and every trajectory; survives restarts")
	tasksFile := fs.String("tasks", "", "task `FILE` (JSONL) whose tasks requests may name by id")
	backendName := fs.String("backend", defaultBackend, "backend for tasks that name none: wasm, docker or containerd")
	maxRunning := fs.Int("max-running", 10000, "rollout episodes running at once")
	maxQueued := fs.Int("max-queued", 100000, "episodes admitted but not started; past it, 429 with Retry-After")
	dockerConc := fs.Int("docker-concurrency", 256, "docker episodes running at once")
	wasmConc := fs.Int("wasm-concurrency", 0, "wasm episodes running at once (default: --max-running)")
	policyConc := fs.Int("policy-concurrency", 1024, "policy calls in flight per endpoint")
	cpuAtOnce := fs.Int("cpu-at-once", 0, "rollout episodes doing CPU-bound work in the service at once (recording a step, encoding a policy request; their waits are outside it), so that /healthz is not queued behind thousands woken together (default 4×GOMAXPROCS; -1: no bound)")
	var jf judgeFlags
	jf.add(cmd)
	forkSpares := addForkSparesFlag(fs)
	warm := fs.Int("warm", 16, "most warm docker and containerd sandboxes kept per spec (sized from waiting episodes; 0 disables)")
	envMax := fs.Int("max-env-episodes", 1024, "open environment-mode episodes")
	envIdle := fs.Duration("env-idle-timeout", 10*time.Minute, "close an environment-mode episode idle this long")
	shutdownTimeout := fs.Duration("shutdown-timeout", 30*time.Second, "on SIGTERM or SIGINT, stop within this long: queued and running episodes end interrupted; what has not ended by then is recovered at the next start")
	diskReserve := fs.String("disk-reserve", "1GiB", "free `SIZE` of the data directory below which new work is refused (507) and queued episodes wait (B, KiB, MiB, GiB, TiB; KB, MB, GB, TB)")
	readTimeout := fs.Duration("read-timeout", 60*time.Second, "bound on reading a whole request, body included (a client sending less than its Content-Length is cut off)")
	writeTimeout := fs.Duration("write-timeout", 60*time.Second, "bound on writing an answer, renewed at every write of a stream or an export")
	idleTimeout := fs.Duration("idle-timeout", 2*time.Minute, "close a kept-alive connection idle this long")
	authTokens := fs.String("auth-tokens", "", "require a bearer token on every request but /healthz and /openapi.json: `FILE` of \"TENANT TOKEN\" lines (or \"TOKEN\"); each tenant sees and touches only its own rollouts and episodes")
	allowedHosts := fs.String("allowed-hosts", "", "`HOST,...` the service answers to in the Host header (* for any; default: localhost, 127.0.0.1 and ::1 when --addr is a loopback address, else any)")
	maxLimits := fs.String("max-limits", "", "the most one request may ask for, `NAME=VALUE,...` (refused with 400 naming the field): "+strings.Join(runtime.MaximaNames(), ", "))
	gcAllOwners := fs.Bool("gc-all-owners", false, "at start-up, also remove what any crashed rollbox left on this host (rollbox gc), not only this service's own containers")
	maxImports := fs.Int("max-imports", 4, "imports (POST /v1/imports) running at once; one more gets 429 with Retry-After")
	importMaxEpisode := fs.String("import-max-episode-bytes", "16MiB", "`SIZE` cap of one imported episode (one NDJSON line); a longer line is refused and skipped")
	outcomeReward := fs.String("outcome-reward", "", "outcome reward spec `FILE` (JSON) of imported episodes: {\"type\": \"outcome\", \"signals\": [{\"name\", \"weight\", \"default\"?}], \"window_s\"} (default: accepted 1, reverted -1, 24 h; docs/production.md)")
	redact := fs.String("redact", "", "redaction `FILE` (JSON) for imported episodes: {\"defaults\": true|false, \"patterns\": [{\"kind\", \"regex\"}]} (default: the documented patterns: API keys, bearer tokens, JWTs, private keys, URL passwords, emails)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this `FILE` (for go tool pprof)")
	healthAddr := fs.String("health-addr", "", "also answer GET /healthz on this `HOST:PORT`, from a process of its own: a few milliseconds whatever the load, and 503 \"unresponsive\" when the service stops reporting (for liveness probes)")
	healthStale := fs.Duration("health-stale", 5*time.Second, "with --health-addr: report the service unresponsive when it has not reported its health for this long")
	auditLog := fs.String("audit-log", "", "append every sandbox call to this hash-chained log `FILE`, rotated past 64 MiB into FILE.1 ... FILE.8 (default $ROLLBOX_AUDIT_LOG, else DATA/audit.jsonl)")
	noAuditLog := fs.Bool("no-audit-log", false, "keep no audit log")
	debugAddr := fs.String("debug-addr", "", "serve Go's profiles (net/http/pprof: heap, goroutines, CPU) on this loopback `HOST:PORT`, apart from the API")
	clusterURL := fs.String("cluster", "", "coordinate rollout workers (rollbox worker) over the NATS JetStream server at `nats://HOST:PORT`: admitted episodes are published to them instead of run here (docs/scale-out.md)")
	heartbeat := fs.Duration("heartbeat", cluster.DefaultHeartbeat, "with --cluster: the workers' heartbeat interval; a worker unheard for 3 intervals is taken for lost")
	recycleAbove := fs.String("recycle-above", "20%", "when the service has had nothing to do for --recycle-idle and still holds more anonymous memory than when it started, by a `PERCENT` of that (20%) or a SIZE (64MiB), it executes itself again in place to give it back: the same process id and listening socket (connections made meanwhile wait in its backlog), its data reopened, its counters from zero; off: never (nor while --cpuprofile writes)")
	recycleIdle := fs.Duration("recycle-idle", 30*time.Second, "with --recycle-above: how long the service must have had nothing to do (no episode queued or running, no request being answered) before it recycles itself")
	// inherited is the listening socket a previous image of this process
	// handed over; recycleWith, the one this image hands over.
	var inherited, recycleWith *os.File
	// serveOnce is one image of the process serving, until stopped or
	// recycled (recycleWith set).
	serveOnce := func(cmd *cobra.Command) error {
		ctx := cmd.Context()
		recycle, err := parseRecycle(*recycleAbove)
		if err != nil {
			return usagef("--recycle-above %v", err)
		}
		if *recycleIdle <= 0 {
			return usagef("--recycle-idle %s: must be positive", *recycleIdle)
		}
		if recycle != nil {
			recycle.After = *recycleIdle
		}
		if *cpuProfile != "" || !env.ownProcess {
			recycle = nil // the profile is of the whole run; a test's process is not ours to replace
		}
		var clusterOpts *runtime.ClusterOptions
		if *clusterURL != "" {
			if err := cluster.CheckURL(*clusterURL); err != nil {
				return usagef("%v", err)
			}
			if *heartbeat <= 0 {
				return usagef("--heartbeat %s: must be positive", *heartbeat)
			}
			clusterOpts = &runtime.ClusterOptions{URL: *clusterURL, Heartbeat: *heartbeat}
		}
		if err := sandbox.CheckBackend(*backendName); err != nil {
			return usagef("--backend %v", err)
		}
		var level slog.Level
		if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
			return usagef("--log-level: %v", err)
		}
		for name, v := range map[string]int{"--max-running": *maxRunning, "--max-queued": *maxQueued, "--docker-concurrency": *dockerConc,
			"--policy-concurrency": *policyConc, "--max-env-episodes": *envMax} {
			if v < 1 {
				return usagef("%s %d: must be at least 1", name, v)
			}
		}
		if *wasmConc < 0 || *warm < 0 {
			return usagef("--wasm-concurrency and --warm may not be negative")
		}
		if err := checkForkSpares(*forkSpares); err != nil {
			return err
		}
		reserve, err := parseSize(*diskReserve)
		if err != nil {
			return usagef("--disk-reserve: %v", err)
		}
		maxImportBytes, err := parseSize(*importMaxEpisode)
		if err != nil || maxImportBytes < 1024 || maxImportBytes > 1<<30 {
			return usagef("--import-max-episode-bytes %q: a size between 1KiB and 1GiB", *importMaxEpisode)
		}
		if *maxImports < 1 {
			return usagef("--max-imports %d: must be at least 1", *maxImports)
		}
		var outcomeSpec *runtime.OutcomeSpec
		if *outcomeReward != "" {
			b, err := os.ReadFile(*outcomeReward)
			if err != nil {
				return usagef("--outcome-reward: %v", err)
			}
			if outcomeSpec, err = runtime.LoadOutcomeSpec(b, *outcomeReward); err != nil {
				return usagef("--outcome-reward: %v", err)
			}
		}
		var redactor *runtime.Redactor
		if *redact != "" {
			if redactor, err = runtime.LoadRedaction(*redact); err != nil {
				return usagef("--redact: %v", err)
			}
		}
		maxima, err := runtime.ParseMaxima(*maxLimits)
		if err != nil {
			return usagef("--max-limits %v", err)
		}
		var tenants *runtime.Tenants
		if *authTokens != "" {
			if tenants, err = runtime.LoadTenants(*authTokens); err != nil {
				return usagef("--auth-tokens: %v", err)
			}
		}
		for _, a := range []struct{ flag, addr string }{{"--addr", *addr}, {"--health-addr", *healthAddr}, {"--debug-addr", *debugAddr}} {
			if err := checkAddr(a.flag, a.addr); err != nil {
				return err
			}
		}
		hosts, err := answeredHosts(*addr, *allowedHosts)
		if err != nil {
			return usagef("%v", err)
		}
		for name, d := range map[string]time.Duration{"--shutdown-timeout": *shutdownTimeout, "--read-timeout": *readTimeout,
			"--write-timeout": *writeTimeout, "--idle-timeout": *idleTimeout} {
			if d <= 0 {
				return usagef("%s %s: must be positive", name, d)
			}
		}
		log := slog.New(slog.NewJSONHandler(env.stderr, &slog.HandlerOptions{Level: level}))
		if *cpuProfile != "" {
			f, err := os.Create(*cpuProfile)
			if err != nil {
				return usagef("--cpuprofile: %v", err)
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
			defer pprof.StopCPUProfile()
		}

		if *debugAddr != "" {
			stopDebug, err := serveDebug(*debugAddr, log)
			if err != nil {
				return usagef("--debug-addr: %v", err)
			}
			defer stopDebug()
		}

		var catalog []*agent.Task
		if *tasksFile != "" {
			var err error
			if catalog, err = agent.LoadTasks(*tasksFile, knownTool); err != nil {
				return usagef("--tasks: %v", err)
			}
		}
		indexes, err := openSearchIndexes(catalog)
		if err != nil {
			return usagef("%v", err)
		}
		defer indexes.Close()
		if err := os.MkdirAll(*data, 0o755); err != nil {
			return err
		}

		// The service's containers carry an owner label of their own, derived
		// from the data directory, so that a restart on the same directory
		// removes exactly what the crashed process left (and nothing of another
		// rollbox's). ROLLBOX_OWNER, when set, wins.
		cfg := env.cfg
		if cfg.owner == "" {
			cfg.owner = serviceOwner(*data) // for every backend opened below
		}
		owner := cfg.owner
		// What a crashed service on this data directory left is removed
		// before this one makes containers: from now on when it may (its
		// default backend or a catalog task is docker or containerd), else
		// when such a backend first opens: a service on the WASM backend
		// never contacts the Docker (or containerd) engine unless an
		// episode asks for it. The clean-up runs beside the listener, not in
		// front of it: an engine slow or wedged under load delays the
		// episodes that need it, not the health probe or the WASM ones.
		engine := func(b string) bool { return b == sandbox.BackendDocker || b == sandbox.BackendContainerd }
		usesDocker := engine(*backendName)
		for _, t := range catalog {
			usesDocker = usesDocker || engine(t.Sandbox.Backend)
		}
		gctx, stopGC := context.WithCancel(ctx)
		cleaned := make(chan struct{})
		go func() {
			defer close(cleaned)
			if !usesDocker && !*gcAllOwners {
				return
			}
			start := time.Now()
			defer func() {
				if gctx.Err() == nil {
					log.Info("start-up clean-up done", "elapsed", time.Since(start).Round(time.Millisecond).String())
				}
			}()
			if usesDocker {
				gcOwner(gctx, log, cfg)
			}
			// What other crashed rollbox processes left (containers whose
			// lease is dead, build dirs, half-written cache files) is
			// theirs, unless asked: on a host shared by several services or
			// users it is someone else's work.
			if *gcAllOwners {
				if err := gcAll(gctx, logLines{log}, cfg); err != nil && gctx.Err() == nil {
					log.Warn("cleaning up after crashed processes", "err", err)
				}
			}
		}()
		defer func() { stopGC(); <-cleaned }()
		afterCleanUp := func(ctx context.Context) error {
			select {
			case <-cleaned:
				return nil
			case <-ctx.Done():
				return fmt.Errorf("waiting for the start-up clean-up: %w", ctx.Err())
			}
		}
		// Every running episode holds its journal open, every policy slot a
		// connection: say so at once when the descriptor limit cannot hold them.
		var lim syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
			if need := uint64(*maxRunning + *envMax + 2*(*policyConc) + 256); lim.Cur < need {
				log.Warn("the open-file limit is below what the configured concurrency needs; lower --max-running or raise ulimit -n",
					"limit", lim.Cur, "needed", need)
			}
		}

		// The audit log is on unless turned off, so that a security team
		// finds one without having asked for it in advance. It is opened
		// now to refuse a start on one that cannot be appended to (a torn
		// last line); each backend appends through its own handle.
		auditPath := ""
		if !*noAuditLog {
			auditPath = cmp.Or(*auditLog, cfg.auditLog, filepath.Join(*data, "audit.jsonl"))
			l, err := auditlog.Open(auditPath, auditlog.Options{})
			if err != nil {
				return fmt.Errorf("%w (--audit-log to move it, --no-audit-log to keep none)", err)
			}
			l.Close()
		} else if *auditLog != "" {
			return usagef("--audit-log and --no-audit-log contradict each other")
		}

		// First-use builds are logged like everything else the service says.
		backends := newBackendSet(logLines{log}, cfg)
		backends.opts.auditLog, backends.opts.auditMaxBytes = auditPath, serveAuditLogMaxBytes
		backends.opts.forkSpares = *forkSpares
		if auditPath == "" {
			backends.opts.cfg.auditLog = "" // --no-audit-log wins over $ROLLBOX_AUDIT_LOG
		}
		containers := afterCleanUp
		if !usesDocker {
			containers = func(ctx context.Context) error {
				if err := afterCleanUp(ctx); err != nil {
					return err
				}
				gcOwner(ctx, log, cfg)
				return nil
			}
		}
		backends.beforeOpen = map[string]func(context.Context) error{sandbox.BackendDocker: containers, sandbox.BackendContainerd: containers}
		if *gcAllOwners { // it also sweeps half-built programs and compiled modules
			backends.beforeOpen[sandbox.BackendWASM] = afterCleanUp
		}
		backendsOpen := true
		defer func() {
			if backendsOpen {
				backends.Close()
			}
		}()
		reg := prometheus.NewRegistry()
		recycles := recycleCount
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rollbox_process_recycles",
				Help: "Times this service executed itself again in place, idle, to give memory back (--recycle-above), since it was started; the counters start from zero each time, as after a restart."},
				func() float64 { return float64(recycles) }))
		limits := runtime.Limits{MaxRunning: *maxRunning, MaxQueued: *maxQueued, PolicyConcurrency: *policyConc,
			Backend: map[string]int{sandbox.BackendDocker: *dockerConc}, WarmPool: map[string]int{sandbox.BackendDocker: *warm, sandbox.BackendContainerd: *warm},
			MaxEnvEpisodes: *envMax, EnvIdleTimeout: *envIdle, DiskReserve: reserve,
			MaxImports: *maxImports, MaxImportEpisodeBytes: int(maxImportBytes), CPUAtOnce: *cpuAtOnce}
		if *wasmConc > 0 {
			limits.Backend[sandbox.BackendWASM] = *wasmConc
		}
		srv, err := runtime.Open(runtime.Options{
			DataDir: *data, DefaultBackend: *backendName, Catalog: catalog, KnownTool: knownTool, PolicyAPIKey: cfg.openAIKey,
			ConfigureEpisode: indexes.configure, SearchIndex: indexes.identity, Registry: reg, Logger: log, Limits: limits,
			HTTP: runtime.HTTPTimeouts{Read: *readTimeout, Write: *writeTimeout, Idle: *idleTimeout}, Maxima: maxima,
			Tenants: tenants, AllowedHosts: hosts, OutcomeSpec: outcomeSpec, Redactor: redactor,
			Judge: env.judgeOptions(jf, judgeSpecs(catalog)), Cluster: clusterOpts, Recycle: recycle,
			Backends: runtime.BackendFunc(func(ctx context.Context, name string) (sandbox.Backend, error) {
				return backends.get(ctx, name)
			}),
		})
		if err != nil {
			return err
		}
		tcp, err := listen(*addr, inherited)
		inherited = nil
		if err != nil {
			srv.Close()
			return err
		}
		// While episodes run, new connections (a liveness probe's) are
		// accepted from a timer's goroutine, ahead of the episodes' own, and a
		// GET /healthz is answered there.
		ln, err := srv.PromptListener(tcp, promptAccept)
		if err != nil {
			tcp.Close()
			srv.Close()
			return fmt.Errorf("listen on %s: %w", *addr, err)
		}
		var health *healthResponder
		if *healthAddr != "" {
			if health, err = startHealthResponder(env, *healthAddr, *healthStale, srv, log); err != nil {
				ln.Close()
				srv.Close()
				return fmt.Errorf("--health-addr: %w", err)
			}
			log.Info(fmt.Sprintf("health responder on %s/healthz (its own process)", health.url), "health_url", health.url+"/healthz")
		}
		healthHanded := false
		defer func() {
			if health != nil && !healthHanded {
				health.Stop()
			}
		}()
		hs := srv.HTTPServer()
		served := make(chan error, 1)
		go func() { served <- hs.Serve(ln) }()
		abs, _ := filepath.Abs(*data)
		auth := "none: every client sees everything (--auth-tokens)"
		if tenants != nil {
			auth = fmt.Sprintf("%d bearer token(s)", tenants.Count())
		}
		log.Info(fmt.Sprintf("listening on http://%s (data %s)", ln.Addr(), abs), "addr", ln.Addr().String(), "data", abs, "owner", owner,
			"default_backend", *backendName, "catalog", len(catalog), limitsAttr(limits), "auth", auth, "allowed_hosts", hosts, "audit_log", auditPath,
			"recycles", recycles)

		// handOver is the listening socket handed to the next image when
		// the service recycles itself.
		var handOver *os.File
	wait:
		for {
			select {
			case <-ctx.Done():
				break wait
			case err = <-served:
				break wait
			case <-srv.RecycleDue():
			}
			// Idle, with memory a new image would not hold. No new
			// connection is taken from now on (they wait in the socket's
			// backlog, which a copy keeps open), those taken are served,
			// and the requests being answered get a second to end.
			f, ferr := tcp.File()
			if ferr != nil {
				log.Warn("cannot recycle: the listening socket cannot be copied", "err", ferr)
				continue
			}
			ln.Detach()
			<-served // once what the listener took is handed over
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			drained := hs.Shutdown(dctx) == nil
			cancel()
			if ctx.Err() != nil {
				f.Close()
				break wait
			}
			if drained && srv.Quiescent() {
				handOver = f
				if health != nil {
					// It answers with the last snapshot (ok, idle) until
					// the next image feeds it, not "shutting_down".
					if herr := health.handOver(); herr != nil {
						log.Warn("the health responder could not be handed over: it is restarted", "err", herr)
					} else {
						healthHanded = true
					}
				}
				break wait
			}
			// A connection still open (a stream, a request slow to
			// arrive) or a request that started work: serve on.
			l, ferr := net.FileListener(f)
			f.Close()
			if ferr != nil {
				err = fmt.Errorf("listening again on %s after a recycle was called off: %w", tcp.Addr(), ferr)
				break wait
			}
			tcp = l.(*net.TCPListener)
			if ln, err = srv.PromptListener(tcp, promptAccept); err != nil {
				tcp.Close()
				break wait
			}
			hs = srv.HTTPServer()
			go func() { served <- hs.Serve(ln) }()
			log.Info("recycling called off: a connection was still open or a request started work while the service stopped taking connections")
		}
		if handOver != nil {
			log.Info("recycling: stopping, to execute again in place with the same listening socket", "shutdown_timeout", *shutdownTimeout)
		} else {
			log.Info("stopping", "shutdown_timeout", *shutdownTimeout)
		}
		start := time.Now()
		sctx, cancel := context.WithTimeout(context.Background(), *shutdownTimeout)
		defer cancel()
		// No new connection from now on; the streams still open end as their
		// rollouts do (every episode ends interrupted).
		httpDone := make(chan struct{})
		go func() { hs.Shutdown(sctx); close(httpDone) }()
		cerr := srv.Shutdown(sctx)
		hs.Close()
		<-httpDone
		backendsOpen = false
		closed := make(chan error, 1)
		go func() { closed <- backends.Close() }()
		select {
		case berr := <-closed:
			cerr = errors.Join(cerr, berr)
		case <-sctx.Done():
			cerr = errors.Join(cerr, errors.New("the sandbox backends were still closing when --shutdown-timeout passed"))
		}
		log.Info("stopped", "took", time.Since(start), "err", cerr)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if handOver != nil {
			// What the stop could not do is logged; the next image
			// recovers it as a restart would.
			recycleWith = handOver
			return nil
		}
		return errors.Join(err, cerr)
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		f, err := inheritedListener()
		if err != nil {
			return err
		}
		inherited = f
		for {
			recycleWith = nil
			err := serveOnce(cmd)
			if recycleWith == nil {
				return err
			}
			if cmd.Context().Err() != nil {
				// A signal came while it stopped to recycle: stopped, as
				// asked (the health responder ends with its stdin).
				recycleWith.Close()
				return nil
			}
			// execSelf returns only when the new image could not be
			// executed: serve on in this one, on the same socket.
			xerr := execSelf(env, recycleWith)
			slog.New(slog.NewJSONHandler(env.stderr, nil)).Error("could not execute a new image of this process to give its memory back; serving on in this one", "err", xerr)
			inherited = recycleWith
		}
	}
	return cmd
}

// limitsAttr is the service's limits as a log attribute group.
func limitsAttr(l runtime.Limits) slog.Attr {
	return slog.Group("limits", "max_running", l.MaxRunning, "max_queued", l.MaxQueued, "policy_concurrency", l.PolicyConcurrency,
		"docker_concurrency", l.Backend[sandbox.BackendDocker], "wasm_concurrency", l.Backend[sandbox.BackendWASM],
		"warm", l.WarmPool[sandbox.BackendDocker], "max_env_episodes", l.MaxEnvEpisodes, "env_idle_timeout", l.EnvIdleTimeout.String(),
		"disk_reserve_bytes", l.DiskReserve)
}

// logLines writes each line it is given as an info record.
type logLines struct{ log *slog.Logger }

func (l logLines) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line != "" {
			l.log.Info(line)
		}
	}
	return len(p), nil
}

// serviceOwner is the container owner label of a service on dataDir.
func serviceOwner(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return "rollbox-serve-" + hex.EncodeToString(sum[:6])
}

// parseSize reads a size: a number with an optional unit (B, KiB, MiB, GiB,
// TiB, or the powers of ten KB, MB, GB, TB), e.g. 512MiB, 1.5GB, 1048576.
func parseSize(v string) (int64, error) {
	v = strings.TrimSpace(v)
	units := []struct {
		suffix string
		mult   float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	mult := 1.0
	num := v
	for _, u := range units {
		if strings.HasSuffix(strings.ToLower(v), strings.ToLower(u.suffix)) {
			num, mult = strings.TrimSpace(v[:len(v)-len(u.suffix)]), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || f*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is not a size (e.g. 512MiB, 1GiB, 10GB)", v)
	}
	return int64(f * mult), nil
}

// answeredHosts is what --allowed-hosts makes of the Host names the service
// answers to: the list given ("*": any), else the loopback names when addr
// is a loopback address (so a web page under a name resolving to 127.0.0.1
// cannot reach it), else any.
func answeredHosts(addr, flag string) ([]string, error) {
	if flag != "" {
		var hosts []string
		for _, h := range strings.Split(flag, ",") {
			if h = strings.TrimSpace(h); h == "*" {
				return nil, nil
			} else if h != "" {
				hosts = append(hosts, h)
			}
		}
		return hosts, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--addr %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return runtime.LoopbackHosts(), nil
	}
	return nil, nil
}

// checkAddr refuses a listening address net.Listen would refuse for its
// form (no port, a port out of range), before anything starts, as bad
// input; "" (the flag not given) passes.
func checkAddr(flag, addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return usagef("%s %q: %v (want HOST:PORT, a port 0-65535)", flag, addr, err)
	}
	return nil
}

// serveAuditLogMaxBytes is the size past which serve's audit log rotates.
const serveAuditLogMaxBytes = 64 << 20

// serveDebug serves net/http/pprof on addr, which must be a loopback
// address: profiles show the service's memory and goroutines.
func serveDebug(addr string, log *slog.Logger) (stop func(), err error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("%s is not a loopback address: the profiles are for this host only", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprofhttp.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprofhttp.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprofhttp.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprofhttp.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprofhttp.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	log.Info("serving Go's profiles", "addr", ln.Addr().String())
	return func() { hs.Close() }, nil
}
