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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/internal/cluster"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
)

// newWorkerCmd is `rollbox worker`: it runs the episodes a coordinator
// (rollbox serve --cluster) dispatches over NATS JetStream.
func newWorkerCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "worker --cluster nats://HOST:PORT --backend B --slots N [flags]",
		Short: "Run the episodes of a coordinator (rollbox serve --cluster)",
		Long: `Run rollout episodes for a coordinator (rollbox serve --cluster) over the NATS
JetStream server at --cluster: pull work items of --backend within --slots, run
each with the same engine as a single host (sandboxes, tools, rewards), stream
its journal back step by step, and ack the item once the coordinator has stored
the episode. Heartbeats announce the worker (GET /v1/workers on the
coordinator). On SIGTERM or SIGINT it takes no more work and finishes what it
runs. The policy API key is the worker's own ($OPENAI_API_KEY). Logs are JSON
lines on stderr. See docs/scale-out.md.`,
		Example: `  rollbox worker --cluster nats://10.0.0.5:4222 --backend docker --slots 64`,
		Args:    noArgs,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	url := fs.String("cluster", "", "the NATS JetStream server, `nats://HOST:PORT` (required)")
	backendName := fs.String("backend", defaultBackend, "sandbox backend it runs: wasm, docker or containerd")
	slots := fs.Int("slots", 0, "episodes it runs at once, an orchestrator's sub-agents among them (required); a task with a prefix runs its whole group on one worker, so some worker needs at least group_size slots")
	policyConc := fs.Int("policy-concurrency", 0, "policy calls in flight per endpoint (default --slots)")
	id := fs.String("id", "", "worker `ID` (letters, digits, - and _; default HOST-PID)")
	data := fs.String("data", "", "`DIR` for the journals of the episodes it runs, each removed once stored by the coordinator (default a directory under the system's temp dir)")
	heartbeat := fs.Duration("heartbeat", cluster.DefaultHeartbeat, "heartbeat interval (the coordinator's --heartbeat)")
	ackWait := fs.Duration("ack-wait", cluster.AckWait, "how long an episode it took stays its own without news before it goes to another worker, as when this worker is restarted with the same --id after a SIGKILL. The backend's work queue has one: a worker sets it only when no other worker of the backend is live, and is refused at start when the live ones use another (stop them all to change it); it sends news every third of the one the NATS server holds, followed if changed there")
	warm := fs.Int("warm", 0, "most warm sandboxes kept per spec")
	forkSpares := addForkSparesFlag(fs)
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at http://`HOST:PORT`/metrics: slots, running, episodes by termination, infra failures, rollout clients, NATS reconnects, and the sandboxes', tools' and policy calls' series (default: none)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		if *url == "" {
			return usagef("--cluster is required: the NATS server's nats://HOST:PORT")
		}
		if err := cluster.CheckURL(*url); err != nil {
			return usagef("%v", err)
		}
		if err := sandbox.CheckBackend(*backendName); err != nil {
			return usagef("--backend %v", err)
		}
		if err := checkAddr("--metrics-addr", *metricsAddr); err != nil {
			return err
		}
		if *slots < 1 {
			return usagef("--slots %d: must be at least 1", *slots)
		}
		if *policyConc < 0 || *warm < 0 || *heartbeat <= 0 {
			return usagef("--policy-concurrency and --warm may not be negative, --heartbeat must be positive")
		}
		if *ackWait < time.Second {
			return usagef("--ack-wait %s: must be at least 1s", *ackWait)
		}
		if err := checkForkSpares(*forkSpares); err != nil {
			return err
		}
		var level slog.Level
		if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
			return usagef("--log-level: %v", err)
		}
		log := slog.New(slog.NewJSONHandler(env.stderr, &slog.HandlerOptions{Level: level}))
		dir := *data
		if dir == "" {
			d, err := os.MkdirTemp("", "rollbox-worker-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(d)
			dir = d
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// The worker's containers carry an owner label of its own, the same
		// across restarts (its --id, else its host's name): at start it
		// removes what a killed predecessor left (its dead leases).
		host, _ := os.Hostname()
		cfg := env.cfg
		if cfg.owner == "" {
			cfg.owner = workerOwner(*id, host)
		}
		backends := newBackendSet(logLines{log}, cfg)
		backends.opts.forkSpares = *forkSpares
		defer backends.Close()
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		if *metricsAddr != "" {
			ln, err := net.Listen("tcp", *metricsAddr)
			if err != nil {
				return fmt.Errorf("--metrics-addr: %w", err)
			}
			mux := http.NewServeMux()
			mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
			hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second}
			go hs.Serve(ln)
			defer hs.Close()
			log.Info(fmt.Sprintf("worker metrics on http://%s/metrics", ln.Addr()))
		}
		abs, _ := filepath.Abs(dir)
		log.Info(fmt.Sprintf("worker on %s", *url), "data", abs, "owner", cfg.owner)
		if env.stopNotice != nil {
			notice := workerStopNotice
			env.stopNotice.Store(&notice)
		}
		// Search tasks' indexes are opened at their first episode here.
		indexes := &searchIndexes{open: map[string]*retriever.Index{}}
		defer indexes.Close()
		err := runtime.RunWorker(ctx, runtime.WorkerOptions{URL: *url, ID: *id, Host: host, Backend: *backendName, Slots: *slots,
			PolicyConcurrency: *policyConc, DataDir: dir, Heartbeat: *heartbeat, AckWait: *ackWait, PolicyAPIKey: cfg.openAIKey, WarmPool: *warm, Logger: log, Registry: reg,
			Backends:         runtime.BackendFunc(backends.get),
			ConfigureEpisode: indexes.configureWorker,
			// Only once no live worker has its --id: the gc would remove
			// a live worker's sandboxes.
			Prepare: func(ctx context.Context) {
				if *backendName != sandbox.BackendWASM {
					gcOwner(ctx, log, cfg)
				}
			}})
		if errors.Is(err, runtime.ErrWorkerIDTaken) || errors.Is(err, runtime.ErrAckWaitInUse) {
			return usagef("%v", err)
		}
		return err
	}
	return cmd
}

// workerStopNotice is what a worker says on SIGTERM or SIGINT: it drains,
// it does not interrupt.
const workerStopNotice = "stopping: no more work is taken; the episodes running here finish and are stored by the coordinator, then the worker leaves (a second signal stops at once: the coordinator then takes the worker for lost, as after a SIGKILL)"

// workerOwner is the owner label of a worker's sandboxes: its id, else its
// host's name, so that a restarted worker finds its predecessor's.
func workerOwner(id, host string) string {
	name := id
	if name == "" {
		name = host
	}
	sum := sha256.Sum256([]byte(name))
	return "rollbox-worker-" + hex.EncodeToString(sum[:6])
}
