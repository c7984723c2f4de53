package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/internal/loadgen"
	"github.com/rollbox/rollbox/internal/proc"
)

// The scale-out benchmarks (docs/scale-out.md, "Sizing"). Each runs the real
// rollbox binary in child processes, so that the CPU time read from /proc
// is the coordinator's (or a worker's) own, and NATS embedded in the
// benchmark's process.

var (
	benchBinOnce sync.Once
	benchBin     string
	benchBinErr  error
)

// benchRollbox builds cmd/rollbox once into a temporary directory.
func benchRollbox(b *testing.B) string {
	b.Helper()
	benchBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rollbox-bench-bin-")
		if err != nil {
			benchBinErr = err
			return
		}
		benchBin = filepath.Join(dir, "rollbox")
		out, err := exec.Command("go", "build", "-o", benchBin, ".").CombinedOutput()
		if err != nil {
			benchBinErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if benchBinErr != nil {
		b.Fatal(benchBinErr)
	}
	return benchBin
}

var (
	natsBinOnce sync.Once
	natsBin     string
	natsBinErr  error
)

// benchNATS is a NATS server with JetStream (the module's own
// nats-server, built once) in a child process, so that its CPU time is
// read apart from the coordinator's and the fleet's.
type benchNATS struct {
	URL string
	cmd *exec.Cmd
}

func (n *benchNATS) cpuSeconds() float64 { return proc.CPUSeconds(strconv.Itoa(n.cmd.Process.Pid)) }

// startBenchNATS runs a NATS server with JetStream, its store under dir,
// on a free port, until the benchmark ends.
func startBenchNATS(b *testing.B, dir string) *benchNATS {
	b.Helper()
	natsBinOnce.Do(func() {
		d, err := os.MkdirTemp("", "rollbox-bench-nats-")
		if err != nil {
			natsBinErr = err
			return
		}
		natsBin = filepath.Join(d, "nats-server")
		out, err := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsBinErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsBinErr != nil {
		b.Fatal(natsBinErr)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	host, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(dir, "nats.conf")
	// max_payload as deploy/kubernetes/nats.yaml: large journal lines.
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listen: %s\nmax_payload: 8MB\njetstream { store_dir: %q }\n",
		net.JoinHostPort(host, port), filepath.Join(dir, "jetstream"))), 0o644); err != nil {
		b.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "nats.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(natsBin, "-c", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	n := &benchNATS{URL: "nats://" + addr, cmd: cmd}
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		logf.Close()
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return n
		}
		if time.Now().After(deadline) {
			b.Fatalf("the NATS server did not listen on %s in 30 s; see %s", addr, logf.Name())
		}
	}
}

// benchWorker is a `rollbox worker` child process.
type benchWorker struct {
	cmd  *exec.Cmd
	logf *os.File
}

func startBenchWorker(b *testing.B, exe, dir, url, backend string, slots int) *benchWorker {
	b.Helper()
	logf, err := os.CreateTemp(dir, "worker-*.log")
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "worker", "--cluster", url, "--backend", backend, "--slots", strconv.Itoa(slots))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	w := &benchWorker{cmd: cmd, logf: logf}
	b.Cleanup(w.stop)
	return w
}

func (w *benchWorker) cpuSeconds() float64 { return proc.CPUSeconds(strconv.Itoa(w.cmd.Process.Pid)) }

func (w *benchWorker) stop() {
	if w.cmd.ProcessState != nil {
		return
	}
	w.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { w.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		w.cmd.Process.Kill()
		<-done
	}
	w.logf.Close()
}

// waitWorkers waits until the coordinator at base lists n workers.
func waitWorkers(b *testing.B, base string, n int) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if got := countWorkers(base); got >= n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("the coordinator at %s lists %d workers, not %d, after 2 minutes", base, countWorkers(base), n)
}

// benchServeFlags are the service's flags for a rollout of n episodes (as
// rollbox bench starts it).
func benchServeFlags(n int) []string {
	return []string{"--max-running", strconv.Itoa(n), "--max-queued", strconv.Itoa(n), "--policy-concurrency", "4096",
		"--no-audit-log"}
}

// BenchmarkCoordinatorOverhead measures the coordinator's CPU time per
// episode (dispatch, the journal, the store, the stream: everything it does
// for an episode that a worker ran) over a rollout of 2,000 episodes run by
// two real `rollbox worker` processes on WASM, and, in the same run, the
// CPU time per episode of a single-host `rollbox serve` running the same
// rollout itself. Both against the same fake policy (in this process).
//
//	go test ./cmd/rollbox -run '^$' -bench CoordinatorOverhead -benchtime 1x
//
// ROLLBOX_BENCH_COORD_CPUPROFILE=FILE writes the coordinator's CPU profile.
//
// ROLLBOX_BENCH_EPISODES, _TURNS and _LATENCY change the rollout (2000, 4,
// 50ms), _WORKER_SLOTS each worker's slots (250).
func BenchmarkCoordinatorOverhead(b *testing.B) {
	exe := benchRollbox(b)
	episodes, turns, latency := envInt("ROLLBOX_BENCH_EPISODES", 2000), envInt("ROLLBOX_BENCH_TURNS", 4), 50*time.Millisecond
	// Slots of each of the two workers: both share this host's two cores
	// with the coordinator and NATS; at 1,000 slots each a worker's
	// heartbeat came more than 3 s late and the coordinator took it for
	// lost, before a suspect worker was pinged (6df9daf). Since, at 1,000
	// slots (ROLLBOX_BENCH_WORKER_SLOTS=1000) every episode finished and no
	// worker was lost, on 6f821cc and on c5ff253 (heartbeats on their own
	// connection) alike.
	workerSlots := envInt("ROLLBOX_BENCH_WORKER_SLOTS", 250)
	if v := os.Getenv("ROLLBOX_BENCH_LATENCY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		latency = d
	}
	pol, err := fakepolicy.Start(fakepolicy.Config{Latency: latency, Responder: fakepolicy.BashThenFinish(turns - 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer pol.Close()
	cfg := loadgen.RolloutConfig{Backend: "wasm", Episodes: episodes, Group: 10, Turns: turns, PolicyURL: pol.URL(), Latency: latency}
	ctx := context.Background()

	for b.Loop() {
		// Single host: rollbox serve runs the episodes itself.
		dir := b.TempDir()
		svc, err := loadgen.StartService(ctx, exe, dir, benchServeFlags(episodes))
		if err != nil {
			b.Fatal(err)
		}
		cfg.Service = svc
		cpu0 := svc.CPUSeconds()
		single, err := loadgen.Rollout(ctx, svc.URL, cfg)
		if err != nil {
			svc.Stop()
			b.Fatal(err)
		}
		singleCPU := svc.CPUSeconds() - cpu0
		svc.Stop()

		// Cluster: rollbox serve --cluster dispatches them to two workers.
		dir = b.TempDir()
		ns := startBenchNATS(b, dir)
		url := ns.URL
		coordFlags := append(benchServeFlags(episodes), "--cluster", url)
		if f := os.Getenv("ROLLBOX_BENCH_COORD_CPUPROFILE"); f != "" {
			coordFlags = append(coordFlags, "--cpuprofile", f) // written when it stops
		}
		coord, err := loadgen.StartService(ctx, exe, dir, coordFlags)
		if err != nil {
			b.Fatal(err)
		}
		workers := []*benchWorker{
			startBenchWorker(b, exe, dir, url, "wasm", workerSlots),
			startBenchWorker(b, exe, dir, url, "wasm", workerSlots),
		}
		waitWorkers(b, coord.URL, len(workers))
		cfg.Service = coord
		cpu0 = coord.CPUSeconds()
		nats0 := ns.cpuSeconds()
		var wcpu0 []float64
		for _, w := range workers {
			wcpu0 = append(wcpu0, w.cpuSeconds())
		}
		clustered, err := loadgen.Rollout(ctx, coord.URL, cfg)
		if err != nil {
			coord.Stop()
			b.Fatal(err)
		}
		coordCPU, natsCPU := coord.CPUSeconds()-cpu0, ns.cpuSeconds()-nats0
		workerCPU := 0.0
		for i, w := range workers {
			workerCPU += w.cpuSeconds() - wcpu0[i]
		}
		coord.Stop()
		for _, w := range workers {
			w.stop()
		}

		n := float64(episodes)
		b.ReportMetric(coordCPU*1000/n, "coord-cpu-ms/episode")
		b.ReportMetric(singleCPU*1000/n, "single-host-cpu-ms/episode")
		b.ReportMetric(workerCPU*1000/n, "worker-cpu-ms/episode")
		b.ReportMetric(natsCPU*1000/n, "nats-cpu-ms/episode")
		b.ReportMetric(coordCPU/singleCPU, "coord/single-host")
		b.ReportMetric(single.WallS, "single-host-wall-s")
		b.ReportMetric(clustered.WallS, "cluster-wall-s")
		b.Logf("single host: %d/%d episodes in %.1f s, service CPU %.2f s (%.2f ms an episode); ends %v",
			single.Completed, episodes, single.WallS, singleCPU, singleCPU*1000/n, single.Ends)
		b.Logf("cluster: %d/%d episodes in %.1f s, coordinator CPU %.2f s (%.2f ms an episode, %.2f× the single host's), workers CPU %.2f s (%.2f ms an episode), NATS CPU %.2f s (%.2f ms an episode); ends %v",
			clustered.Completed, episodes, clustered.WallS, coordCPU, coordCPU*1000/n, coordCPU/singleCPU, workerCPU, workerCPU*1000/n, natsCPU, natsCPU*1000/n, clustered.Ends)
		b.Logf("GET /healthz on a new connection every 50 ms: single host p50 %.1f p99 %.1f ms (in the service p99 %.1f); coordinator p50 %.1f p99 %.1f ms (in the service p99 %.1f)",
			single.HealthzMS.P50, single.HealthzMS.P99, single.HealthzServiceMS.P99, clustered.HealthzMS.P50, clustered.HealthzMS.P99, clustered.HealthzServiceMS.P99)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// countWorkers is the number of workers GET /v1/workers lists.
func countWorkers(base string) int {
	resp, err := http.Get(base + "/v1/workers")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var list struct {
		Workers []json.RawMessage `json:"workers"`
	}
	if json.NewDecoder(resp.Body).Decode(&list) != nil {
		return 0
	}
	return len(list.Workers)
}

// BenchmarkCoordinatorFakeWorkers drives one real coordinator (`rollbox
// serve --cluster`, a child process) with a simulated fleet of 100 workers
// × 100 slots (loadgen.FakeWorkers in this process, speaking the cluster
// protocol at the NATS level: claims, journal lines, done, stored, acks,
// heartbeats; no sandbox, no policy), so that the coordinator, not the
// workers, is what limits. Each sub-benchmark is one episode length: "0s"
// offers episodes as fast as the protocol goes (where the coordinator
// saturates); the others offer 10,000 / length episodes a second (does it
// keep up?).
//
//	go test ./cmd/rollbox -run '^$' -bench CoordinatorFakeWorkers -benchtime 1x -timeout 30m
//
// ROLLBOX_BENCH_EPISODES (default 20000), _WORKERS (100), _SLOTS (100),
// _TURNS (4), _OUTPUT (output bytes a tool step, 256), _HEARTBEAT (the
// workers' and the coordinator's, 1s) and _DURATIONS (a comma list of
// episode lengths, default "0s,2m") change it.
func BenchmarkCoordinatorFakeWorkers(b *testing.B) {
	exe := benchRollbox(b)
	episodes := envInt("ROLLBOX_BENCH_EPISODES", 20000)
	workers, slots := envInt("ROLLBOX_BENCH_WORKERS", 100), envInt("ROLLBOX_BENCH_SLOTS", 100)
	turns, output := envInt("ROLLBOX_BENCH_TURNS", 4), envInt("ROLLBOX_BENCH_OUTPUT", 256)
	heartbeat := time.Second // the default of rollbox worker and serve --cluster
	if v := os.Getenv("ROLLBOX_BENCH_HEARTBEAT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("ROLLBOX_BENCH_HEARTBEAT %q: not a positive duration", v)
		}
		heartbeat = d
	}
	durations := []time.Duration{0, 2 * time.Minute}
	if v := os.Getenv("ROLLBOX_BENCH_DURATIONS"); v != "" {
		durations = nil
		for _, s := range strings.Split(v, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(s))
			if err != nil {
				b.Fatalf("ROLLBOX_BENCH_DURATIONS: %v", err)
			}
			durations = append(durations, d)
		}
	}
	// The policy is never called (the fleet asks no model), but a rollout
	// names one.
	pol, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(turns - 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer pol.Close()
	ctx := context.Background()
	for _, d := range durations {
		b.Run(d.String(), func(b *testing.B) {
			for b.Loop() {
				dir := b.TempDir()
				ns := startBenchNATS(b, dir)
				url := ns.URL
				coord, err := loadgen.StartService(ctx, exe, dir, append(benchServeFlags(episodes), "--cluster", url,
					"--heartbeat", heartbeat.String()))
				if err != nil {
					b.Fatal(err)
				}
				fleet, err := loadgen.StartFakeWorkers(ctx, loadgen.FakeWorkersConfig{URL: url, Workers: workers, Slots: slots,
					Turns: turns, Duration: d, OutputBytes: output, Heartbeat: heartbeat, Dir: filepath.Join(dir, "fleet")})
				if err != nil {
					coord.Stop()
					b.Fatal(err)
				}
				waitWorkers(b, coord.URL, workers)
				cpu0, nats0, self0 := coord.CPUSeconds(), ns.cpuSeconds(), proc.CPUSeconds("self")
				res, err := loadgen.Rollout(ctx, coord.URL, loadgen.RolloutConfig{Backend: "wasm", Episodes: episodes, Group: 10,
					Turns: turns, PolicyURL: pol.URL(), Service: coord, Progress: benchProgress()})
				coordCPU, natsCPU, selfCPU := coord.CPUSeconds()-cpu0, ns.cpuSeconds()-nats0, proc.CPUSeconds("self")-self0
				claimMS, storedMS := fleet.Latencies()
				fleet.Stop()
				coord.Stop()
				if err != nil {
					b.Fatalf("%v (fleet: %d stored, %d skipped, %d errors, last %v)", err, fleet.Completed.Load(),
						fleet.Skipped.Load(), fleet.Errors.Load(), fleet.Err())
				}
				n := float64(episodes)
				rate := n / res.WallS
				b.ReportMetric(rate, "episodes/s")
				b.ReportMetric(coordCPU*1000/n, "coord-cpu-ms/episode")
				b.ReportMetric(coordCPU/res.WallS, "coord-cores")
				b.ReportMetric(float64(res.PeakRunning), "peak-running")
				b.ReportMetric(float64(res.ServicePeakRSS)/(1<<20), "coord-peak-rss-MiB")
				b.ReportMetric(natsCPU*1000/n, "nats-cpu-ms/episode")
				b.ReportMetric(selfCPU*1000/n, "fleet-cpu-ms/episode")
				b.ReportMetric(storedMS.P50, "done-to-stored-p50-ms")
				b.ReportMetric(storedMS.P99, "done-to-stored-p99-ms")
				offered := "as fast as the protocol goes"
				if d > 0 {
					offered = fmt.Sprintf("%.0f episodes/s offered", float64(workers*slots)/d.Seconds())
				}
				b.Logf("%d workers × %d slots, episodes of %d turns lasting %s (%s): %d/%d episodes in %.1f s = %.0f episodes/s; peak running %d",
					workers, slots, turns, d, offered, res.Completed, episodes, res.WallS, rate, res.PeakRunning)
				b.Logf("coordinator: CPU %.1f s (%.2f ms an episode, %.2f cores), peak RSS %d MiB; NATS: CPU %.1f s (%.2f ms an episode, %.2f cores); fleet and client: CPU %.1f s",
					coordCPU, coordCPU*1000/n, coordCPU/res.WallS, res.ServicePeakRSS>>20, natsCPU, natsCPU*1000/n, natsCPU/res.WallS, selfCPU)
				b.Logf("claim round trip %s; done to stored %s; %d journal lines, %d fleet errors; ends %v",
					claimMS, storedMS, fleet.Lines.Load(), fleet.Errors.Load(), res.Ends)
			}
		})
	}
}

// benchProgress is where the rollout benchmarks print progress: stderr
// under -v, nowhere otherwise.
func benchProgress() io.Writer {
	if testing.Verbose() {
		return os.Stderr
	}
	return io.Discard
}
