package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// runBench is `rollbox bench`: a load generator for the rollout service.
// It starts the fake OpenAI-compatible policy server (latency configurable)
// in this process and `rollbox serve` as a child process (so the service's
// peak RSS is its own), then either
//
//	--mode rollout:  one rollout of N episodes × M turns (M-1 bash calls of
//	                 `true`, then finish), streamed back; reports completion,
//	                 throughput, the runtime's overhead per turn (p50/p99) and
//	                 the service's peak RSS (VmHWM);
//	--mode env-step: one environment-mode episode stepped with bash `true`
//	                 over HTTP, side by side with `docker exec` of the same
//	                 command in the same container (docker backend).
func runBench(ctx context.Context, env *cliEnv, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	mode := fs.String("mode", "rollout", "rollout or env-step")
	backend := fs.String("backend", "wasm", "wasm or docker")
	image := fs.String("image", "base", "docker image of the episodes (docker backend)")
	episodes := fs.Int("episodes", 1000, "episodes in the rollout (a multiple of --group)")
	group := fs.Int("group", 10, "group size")
	turns := fs.Int("turns", 10, "model turns per episode: turns-1 bash calls of `true`, then finish")
	latency := fs.Duration("latency", 200*time.Millisecond, "fake policy latency per call")
	jitter := fs.Duration("jitter", 0, "extra random fake policy latency in [0, jitter)")
	policyConc := fs.Int("policy-concurrency", 1024, "service: policy calls in flight per endpoint")
	warm := fs.Int("warm", 16, "service: warm docker sandboxes per spec")
	steps := fs.Int("steps", 200, "env-step: timed steps (and as many docker execs)")
	url := fs.String("url", "", "bench a running service at this URL instead of starting one (its peak RSS is read from /metrics)")
	jsonOut := fs.String("json", "", "also write the results as JSON to this file")
	keep := fs.String("data", "", "service data directory (default: a temporary one, removed)")
	serveProfile := fs.String("serve-cpuprofile", "", "have the service write a CPU profile to this file")
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	switch {
	case fs.NArg() > 0:
		return usagef("unexpected arguments: %v", fs.Args())
	case *mode != "rollout" && *mode != "env-step":
		return usagef("--mode %q is not one of rollout, env-step", *mode)
	case *backend != "wasm" && *backend != "docker":
		return usagef("--backend %q is not one of wasm, docker", *backend)
	case *turns < 1 || *episodes < 1 || *group < 1 || *episodes%*group != 0:
		return usagef("--episodes must be a positive multiple of --group, --turns at least 1")
	case *mode == "env-step" && *backend != "docker":
		return usagef("--mode env-step compares with docker exec: use --backend docker")
	}

	pol, err := fakepolicy.Start(fakepolicy.Config{Latency: *latency, Jitter: *jitter, Responder: fakepolicy.BashThenFinish(*turns - 1)})
	if err != nil {
		return err
	}
	defer pol.Close()

	base := *url
	var svc *childService
	if base == "" {
		dir := *keep
		if dir == "" {
			if dir, err = os.MkdirTemp("", "rollbox-bench-"); err != nil {
				return err
			}
			defer os.RemoveAll(dir)
		}
		maxRunning := max(*episodes, 1)
		svc, err = startChildService(ctx, dir, []string{
			"--max-running", strconv.Itoa(maxRunning), "--max-queued", strconv.Itoa(max(*episodes, 1)),
			"--docker-concurrency", strconv.Itoa(maxRunning), "--policy-concurrency", strconv.Itoa(*policyConc),
			"--warm", strconv.Itoa(*warm), "--log-level", "warn", "--cpuprofile", *serveProfile,
		})
		if err != nil {
			return err
		}
		defer svc.stop()
		base = svc.url
	}
	fmt.Fprintf(env.stderr, "rollbox bench: service %s, fake policy %s (latency %s)\n", base, pol.URL(), *latency)

	var res any
	switch *mode {
	case "rollout":
		res, err = benchRollout(ctx, env, base, pol, svc, benchRolloutConfig{backend: *backend, image: *image,
			episodes: *episodes, group: *group, turns: *turns, latency: *latency})
	case "env-step":
		res, err = benchEnvStep(ctx, env, base, *image, *steps)
	}
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// childService is `rollbox serve` run by the bench.
type childService struct {
	cmd    *exec.Cmd
	url    string
	logf   *os.File
	waited chan error
}

var listeningRe = regexp.MustCompile(`listening on (http://\S+)`)

func startChildService(ctx context.Context, dataDir string, flags []string) (*childService, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dataDir, "serve.log"))
	if err != nil {
		return nil, err
	}
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", filepath.Join(dataDir, "data")}, flags...)
	cmd := exec.Command(exe, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &childService{cmd: cmd, logf: logf, waited: make(chan error, 1)}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if m := listeningRe.FindStringSubmatch(line); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
			fmt.Fprintln(logf, line)
		}
	}()
	go func() { c.waited <- cmd.Wait() }()
	select {
	case c.url = <-found:
		return c, nil
	case err := <-c.waited:
		return nil, fmt.Errorf("rollbox serve exited before listening (%v); see %s", err, logf.Name())
	case <-time.After(60 * time.Second):
		c.stop()
		return nil, errors.New("rollbox serve did not start listening in 60s")
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
}

// peakRSS is the child's VmHWM.
func (c *childService) peakRSS() int64 {
	return runtime.ProcPeakRSS(strconv.Itoa(c.cmd.Process.Pid))
}

// cpuSeconds is the child's user+system CPU time so far.
func (c *childService) cpuSeconds() float64 { return procCPUSeconds(strconv.Itoa(c.cmd.Process.Pid)) }

// procCPUSeconds is a process's user+system CPU time ("self" for this one).
func procCPUSeconds(pid string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces): state is 3rd,
	// utime the 14th and stime the 15th field of the line.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func (c *childService) stop() {
	if c == nil || c.cmd.Process == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.waited:
	case <-time.After(60 * time.Second):
		c.cmd.Process.Kill()
		<-c.waited
	}
	c.logf.Close()
	c.cmd = &exec.Cmd{}
}

type benchRolloutConfig struct {
	backend, image         string
	episodes, group, turns int
	latency                time.Duration
}

// RolloutBenchResult is what `rollbox bench --mode rollout` measures.
type RolloutBenchResult struct {
	Backend             string         `json:"backend"`
	Episodes            int            `json:"episodes"`
	Completed           int            `json:"completed"`
	Ends                map[string]int `json:"ends"`
	TurnsPerEpisode     int            `json:"turns_per_episode"`
	PolicyLatencyMS     float64        `json:"policy_latency_ms"`
	WallS               float64        `json:"wall_s"`
	TurnsPerS           float64        `json:"turns_per_s"`
	PeakRunning         int            `json:"peak_running"`
	TurnOverheadMS      Percentiles    `json:"turn_overhead_ms"`
	LastTurnMS          Percentiles    `json:"last_turn_overhead_ms"`
	PolicyCallOverMS    Percentiles    `json:"policy_call_overhead_ms"`
	BetweenCallsMS      Percentiles    `json:"between_calls_ms"`
	ToolMS              Percentiles    `json:"tool_ms"`
	ServicePeakRSS      int64          `json:"service_peak_rss_bytes"`
	ServiceCPUS         float64        `json:"service_cpu_s"`
	ServiceCPUPerTurnMS float64        `json:"service_cpu_per_turn_ms"`
	BenchPeakRSS        int64          `json:"bench_peak_rss_bytes"`
	BenchCPUS           float64        `json:"bench_cpu_s"`
}

// Percentiles of a sample.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func percentiles(xs []float64) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	sort.Float64s(xs)
	at := func(q float64) float64 { return xs[min(len(xs)-1, int(math.Ceil(q*float64(len(xs))))-1)] }
	return Percentiles{N: len(xs), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: xs[len(xs)-1]}
}

func (p Percentiles) String() string {
	return fmt.Sprintf("p50 %.2f  p90 %.2f  p99 %.2f  max %.2f ms (n=%d)", p.P50, p.P90, p.P99, p.Max, p.N)
}

// streamedEpisode is the part of a streamed trajectory the bench reads.
type streamedEpisode struct {
	EpisodeID   string     `json:"episode_id"`
	StartedAt   time.Time  `json:"started_at"`
	EndedAt     *time.Time `json:"ended_at"`
	Termination *struct {
		Reason string `json:"reason"`
	} `json:"termination"`
	Steps []struct {
		Type       string    `json:"type"`
		StartedAt  time.Time `json:"started_at"`
		DurationMS float64   `json:"duration_ms"`
	} `json:"steps"`
}

func benchRollout(ctx context.Context, env *cliEnv, base string, pol *fakepolicy.Server, svc *childService, c benchRolloutConfig) (*RolloutBenchResult, error) {
	ntasks := c.episodes / c.group
	tasks := make([]map[string]any, ntasks)
	for i := range tasks {
		sb := map[string]any{"backend": c.backend}
		if c.backend == "docker" {
			sb["image"] = c.image
		}
		tasks[i] = map[string]any{"id": fmt.Sprintf("bench-%d", i), "prompt": "Run true until told to finish.",
			"sandbox": sb, "tools": []string{"bash", "finish"}, "reward": map[string]any{"type": "exact", "answer": "done"},
			"limits": map[string]any{"max_turns": c.turns + 1, "episode_timeout_s": 3600}}
	}
	body, _ := json.Marshal(map[string]any{"tasks": tasks, "group_size": c.group,
		"policy": map[string]any{"base_url": pol.URL(), "model": "fake-model", "max_retries": 2}})
	start := time.Now()
	resp, err := http.Post(base+"/v1/rollouts", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	var created struct{ ID string }
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &created) != nil {
		return nil, fmt.Errorf("POST /v1/rollouts: %s %s", resp.Status, b)
	}
	fmt.Fprintf(env.stderr, "rollbox bench: rollout %s: %d episodes (%d tasks × %d) of %d turns on %s, policy latency %s\n",
		created.ID, c.episodes, ntasks, c.group, c.turns, c.backend, c.latency)

	// Watch how many run at once.
	var peak atomic.Int64
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		for wctx.Err() == nil {
			var h runtime.Health
			if r, err := http.Get(base + "/healthz"); err == nil {
				json.NewDecoder(r.Body).Decode(&h)
				r.Body.Close()
				if int64(h.EpisodesRunning) > peak.Load() {
					peak.Store(int64(h.EpisodesRunning))
				}
			}
			select {
			case <-wctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()

	res := &RolloutBenchResult{Backend: c.backend, Episodes: c.episodes, Ends: map[string]int{}, TurnsPerEpisode: c.turns,
		PolicyLatencyMS: float64(c.latency) / float64(time.Millisecond)}
	var overhead, callOver, between, toolMS, lastTurn []float64
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/rollouts/"+created.ID+"/episodes?stream=1", nil)
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer sresp.Body.Close()
	sc := bufio.NewScanner(sresp.Body)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	lat := float64(c.latency) / float64(time.Millisecond)
	lastReport := time.Now()
	turnsDone := 0
	for sc.Scan() {
		var e streamedEpisode
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("a streamed line: %w", err)
		}
		res.Completed++
		if e.Termination != nil {
			res.Ends[e.Termination.Reason]++
		}
		var models []int
		for i, s := range e.Steps {
			if s.Type == "model" {
				models = append(models, i)
			} else {
				toolMS = append(toolMS, s.DurationMS)
			}
		}
		turnsDone += len(models)
		for k, i := range models {
			s := e.Steps[i]
			end := s.StartedAt
			switch {
			case k+1 < len(models):
				end = e.Steps[models[k+1]].StartedAt
			case e.EndedAt != nil:
				end = *e.EndedAt
			}
			wall := float64(end.Sub(s.StartedAt)) / float64(time.Millisecond)
			if k+1 == len(models) { // finish: the reward and the sandbox's removal are in this turn
				lastTurn = append(lastTurn, wall-lat)
				continue
			}
			overhead = append(overhead, wall-lat)
			callOver = append(callOver, s.DurationMS-lat)
			between = append(between, wall-s.DurationMS)
		}
		if time.Since(lastReport) > 5*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(env.stderr, "rollbox bench: %d/%d episodes done, %.0f turns/s, peak running %d\n",
				res.Completed, c.episodes, float64(turnsDone)/time.Since(start).Seconds(), peak.Load())
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the stream: %w", err)
	}
	res.WallS = time.Since(start).Seconds()
	stopWatch()
	res.PeakRunning = int(peak.Load())
	res.TurnsPerS = float64(turnsDone) / res.WallS
	res.TurnOverheadMS, res.PolicyCallOverMS, res.BetweenCallsMS, res.ToolMS, res.LastTurnMS =
		percentiles(overhead), percentiles(callOver), percentiles(between), percentiles(toolMS), percentiles(lastTurn)
	if svc != nil {
		res.ServicePeakRSS = svc.peakRSS()
		res.ServiceCPUS = svc.cpuSeconds()
		res.ServiceCPUPerTurnMS = res.ServiceCPUS * 1000 / float64(max(turnsDone, 1))
	}
	if res.ServicePeakRSS == 0 {
		res.ServicePeakRSS = scrapePeakRSS(base)
	}
	res.BenchPeakRSS = runtime.PeakRSS()
	res.BenchCPUS = procCPUSeconds("self")

	w := env.stdout
	fmt.Fprintf(w, "rollout bench: %d episodes × %d turns on %s, fake policy latency %s\n", c.episodes, c.turns, c.backend, c.latency)
	fmt.Fprintf(w, "  completed           %d/%d  ends %s\n", res.Completed, c.episodes, fmtCounts(res.Ends))
	fmt.Fprintf(w, "  wall                %.1f s  (%.0f turns/s; ideal %.1f s at this latency)\n", res.WallS, res.TurnsPerS, float64(c.turns)*c.latency.Seconds())
	fmt.Fprintf(w, "  peak running        %d episodes at once (polled)\n", res.PeakRunning)
	fmt.Fprintf(w, "  turn overhead       %s   (turn wall time − policy latency; turns before the last)\n", res.TurnOverheadMS)
	fmt.Fprintf(w, "    policy call       %s   (call wall time − latency: HTTP, JSON, queueing for a slot excluded)\n", res.PolicyCallOverMS)
	fmt.Fprintf(w, "    between calls     %s   (tool, record, waiting for a policy slot)\n", res.BetweenCallsMS)
	fmt.Fprintf(w, "    tool (bash true)  %s\n", res.ToolMS)
	fmt.Fprintf(w, "  last turn overhead  %s   (finish: reward, record, sandbox removal)\n", res.LastTurnMS)
	fmt.Fprintf(w, "  service CPU         %.1f s, %.3f ms a turn (user+system, the whole run)\n", res.ServiceCPUS, res.ServiceCPUPerTurnMS)
	fmt.Fprintf(w, "  service peak RSS    %.1f MiB (VmHWM)\n", float64(res.ServicePeakRSS)/(1<<20))
	fmt.Fprintf(w, "  bench               %.1f s CPU, peak RSS %.1f MiB (fake policy + client, same machine)\n", res.BenchCPUS, float64(res.BenchPeakRSS)/(1<<20))
	if res.Completed != c.episodes {
		return res, fmt.Errorf("%d of %d episodes completed", res.Completed, c.episodes)
	}
	return res, nil
}

var peakRSSRe = regexp.MustCompile(`(?m)^rollbox_process_peak_rss_bytes (\S+)$`)

func scrapePeakRSS(base string) int64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if m := peakRSSRe.FindSubmatch(b); m != nil {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return int64(v)
	}
	return 0
}

// EnvStepBenchResult is what `rollbox bench --mode env-step` measures.
type EnvStepBenchResult struct {
	Steps        int         `json:"steps"`
	StepHTTPMS   Percentiles `json:"step_http_ms"`
	ToolMS       Percentiles `json:"tool_ms"`
	DockerExecMS Percentiles `json:"docker_exec_ms"`
	RatioP50     float64     `json:"ratio_p50"`
	RatioP99     float64     `json:"ratio_p99"`
}

func benchEnvStep(ctx context.Context, env *cliEnv, base, image string, n int) (*EnvStepBenchResult, error) {
	if _, err := exec.LookPath("docker"); err != nil {
		return nil, errors.New("the docker CLI is needed for the docker exec baseline")
	}
	post := func(path string, body any, out any) error {
		b, _ := json.Marshal(body)
		resp, err := http.Post(base+path, "application/json", bytes.NewReader(b))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			return fmt.Errorf("POST %s: %s %s", path, resp.Status, raw)
		}
		if out != nil {
			return json.Unmarshal(raw, out)
		}
		return nil
	}
	task := map[string]any{"id": "bench-step", "prompt": "Run true.", "sandbox": map[string]any{"backend": "docker", "image": image},
		"tools": []string{"bash", "finish"}, "reward": map[string]any{"type": "exact", "answer": "done"},
		"limits": map[string]any{"max_turns": n + 20, "episode_timeout_s": 3600}}
	var opened struct{ ID string }
	if err := post("/v1/episodes", map[string]any{"task": task}, &opened); err != nil {
		return nil, err
	}
	defer func() {
		req, _ := http.NewRequest("DELETE", base+"/v1/episodes/"+opened.ID, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	resp, err := http.Get(base + "/v1/episodes/" + opened.ID)
	if err != nil {
		return nil, err
	}
	var tr struct {
		Sandbox struct{ ID string } `json:"sandbox"`
	}
	json.NewDecoder(resp.Body).Decode(&tr)
	resp.Body.Close()
	if tr.Sandbox.ID == "" {
		return nil, errors.New("the episode's sandbox has no container id")
	}
	step := func() (float64, error) {
		t0 := time.Now()
		var r struct {
			Results []struct {
				ExitCode *int `json:"exit_code"`
			}
		}
		err := post("/v1/episodes/"+opened.ID+"/step", map[string]any{"tool_calls": []any{
			map[string]any{"name": "bash", "arguments": `{"command":"true"}`}}}, &r)
		d := float64(time.Since(t0)) / float64(time.Millisecond)
		if err == nil && (len(r.Results) != 1 || r.Results[0].ExitCode == nil || *r.Results[0].ExitCode != 0) {
			err = fmt.Errorf("bash true did not exit 0: %+v", r)
		}
		return d, err
	}
	dockerExec := func() (float64, error) {
		t0 := time.Now()
		out, err := exec.CommandContext(ctx, "docker", "exec", tr.Sandbox.ID, "true").CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("docker exec: %v: %s", err, out)
		}
		return float64(time.Since(t0)) / float64(time.Millisecond), nil
	}
	for range 5 { // warm up both paths
		if _, err := step(); err != nil {
			return nil, err
		}
		if _, err := dockerExec(); err != nil {
			return nil, err
		}
	}
	var steps, execs []float64
	for range n {
		d, err := step()
		if err != nil {
			return nil, err
		}
		steps = append(steps, d)
		if d, err = dockerExec(); err != nil {
			return nil, err
		}
		execs = append(execs, d)
	}
	resp, err = http.Get(base + "/v1/episodes/" + opened.ID)
	if err != nil {
		return nil, err
	}
	var full struct {
		Steps []struct {
			Type       string  `json:"type"`
			DurationMS float64 `json:"duration_ms"`
		}
	}
	json.NewDecoder(resp.Body).Decode(&full)
	resp.Body.Close()
	var tool []float64
	for _, s := range full.Steps {
		if s.Type == "tool" {
			tool = append(tool, s.DurationMS)
		}
	}
	if len(tool) > n {
		tool = tool[len(tool)-n:]
	}
	res := &EnvStepBenchResult{Steps: n, StepHTTPMS: percentiles(steps), ToolMS: percentiles(tool), DockerExecMS: percentiles(execs)}
	res.RatioP50 = res.StepHTTPMS.P50 / res.DockerExecMS.P50
	res.RatioP99 = res.StepHTTPMS.P99 / res.DockerExecMS.P99
	w := env.stdout
	fmt.Fprintf(w, "env-step bench: %d steps of bash `true` on docker (%s), interleaved with docker exec in the same container\n", n, image)
	fmt.Fprintf(w, "  POST step over HTTP   %s\n", res.StepHTTPMS)
	fmt.Fprintf(w, "    of which the tool   %s   (guest exec as recorded)\n", res.ToolMS)
	fmt.Fprintf(w, "  docker exec (CLI)     %s\n", res.DockerExecMS)
	fmt.Fprintf(w, "  ratio step/exec       p50 %.3f  p99 %.3f\n", res.RatioP50, res.RatioP99)
	return res, nil
}
