package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

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
	backendName := fs.String("backend", defaultBackend, "backend for tasks that name none: wasm or docker")
	maxRunning := fs.Int("max-running", 10000, "rollout episodes running at once")
	maxQueued := fs.Int("max-queued", 100000, "episodes admitted but not started; past it, 429 with Retry-After")
	dockerConc := fs.Int("docker-concurrency", 256, "docker episodes running at once")
	wasmConc := fs.Int("wasm-concurrency", 0, "wasm episodes running at once (default: --max-running)")
	policyConc := fs.Int("policy-concurrency", 1024, "policy calls in flight per endpoint")
	warm := fs.Int("warm", 16, "most warm docker sandboxes kept per spec (sized from waiting episodes; 0 disables)")
	envMax := fs.Int("max-env-episodes", 1024, "open environment-mode episodes")
	envIdle := fs.Duration("env-idle-timeout", 10*time.Minute, "close an environment-mode episode idle this long")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this `FILE` (for go tool pprof)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
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
		removeOrphans(ctx, log, cfg)
		// And what any crashed rollbox left (containers whose process lease is
		// dead, build dirs, half-written cache files): never a live process's.
		if err := gcAll(ctx, logLines{log}, cfg); err != nil {
			log.Warn("cleaning up after crashed processes", "err", err)
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

		backends := newBackendSet(env.stderr, cfg)
		defer backends.Close()
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		limits := runtime.Limits{MaxRunning: *maxRunning, MaxQueued: *maxQueued, PolicyConcurrency: *policyConc,
			Backend: map[string]int{sandbox.BackendDocker: *dockerConc}, WarmPool: map[string]int{sandbox.BackendDocker: *warm},
			MaxEnvEpisodes: *envMax, EnvIdleTimeout: *envIdle}
		if *wasmConc > 0 {
			limits.Backend[sandbox.BackendWASM] = *wasmConc
		}
		srv, err := runtime.Open(runtime.Options{
			DataDir: *data, DefaultBackend: *backendName, Catalog: catalog, KnownTool: knownTool, PolicyAPIKey: cfg.openAIKey,
			ConfigureEpisode: indexes.configure, Registry: reg, Logger: log, Limits: limits,
			Backends: runtime.BackendFunc(func(ctx context.Context, name string) (sandbox.Backend, error) {
				return backends.get(ctx, name)
			}),
		})
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			srv.Close()
			return fmt.Errorf("listen on %s: %w", *addr, err)
		}
		hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		served := make(chan error, 1)
		go func() { served <- hs.Serve(ln) }()
		abs, _ := filepath.Abs(*data)
		fmt.Fprintf(env.stderr, "rollbox serve: listening on http://%s (data %s, owner %s)\n", ln.Addr(), abs, owner)
		log.Info("serving", "addr", ln.Addr().String(), "data", abs, "owner", owner, "catalog", len(catalog), "limits", fmt.Sprintf("%+v", limits))

		select {
		case <-ctx.Done():
		case err = <-served:
		}
		log.Info("stopping")
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if serr := hs.Shutdown(sctx); serr != nil {
			hs.Close() // streams still open
		}
		cerr := srv.Close()
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		return errors.Join(err, cerr)
	}
	return cmd
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

// removeOrphans removes the containers a previous service on the same data
// directory left (a crash leaves them running). Without a reachable engine
// there is nothing to remove: WASM sandboxes die with their process.
func removeOrphans(ctx context.Context, log *slog.Logger, cfg config) {
	if !cfg.dockerEngineMayAnswer() {
		return
	}
	owner := cfg.owner
	cli, err := docker.NewClient()
	if err != nil {
		return
	}
	defer cli.Close()
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := cli.Ping(pctx); err != nil {
		log.Info("no docker engine answers; no orphaned containers to remove", "err", err)
		return
	}
	n, err := docker.Cleanup(ctx, cli, owner)
	if err != nil {
		log.Error("removing orphaned containers", "owner", owner, "err", err)
	}
	if n > 0 {
		log.Warn("removed containers a previous process left", "owner", owner, "containers", n)
	}
}
