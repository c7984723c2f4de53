package loadgen

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/internal/proc"
	"github.com/rollbox/rollbox/sandbox"
)

// RolloutConfig is one rollout bench: Episodes (Tasks × Group) of Turns
// model turns (Turns-1 bash calls of `true`, then finish) on Backend
// (Image for docker), against the fake policy at PolicyURL answering after
// Latency.
type RolloutConfig struct {
	Backend, Image         string
	Episodes, Group, Turns int
	PolicyURL              string
	Latency                time.Duration
	// Service, if set, is the service's process, measured for its peak RSS
	// and CPU; otherwise its peak RSS is read from /metrics.
	Service *Service
	// Progress gets a line every 5 s.
	Progress io.Writer
	// Schedule is the rollout's "schedule" ("" for the service's default).
	Schedule string
	// Settle, when set, watches the service's resident memory for this
	// long after the rollout ended (does it give memory back?).
	Settle time.Duration
	// ProfileDir, when set with a Service started with --debug-addr,
	// receives the service's goroutine profile (goroutines.txt), heap
	// profile (heap.pprof) and an execution trace of TraceFor (trace.out,
	// for go tool trace) taken ProfileAt after the submission, and its
	// goroutine and heap profiles after Settle (ProfileDir/settled).
	ProfileDir string
	ProfileAt  time.Duration
	TraceFor   time.Duration
}

// RolloutResult is what a rollout bench measures.
type RolloutResult struct {
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
	Schedule            string         `json:"schedule"`
	// FirstGroupS is when the first complete group arrived on the stream,
	// from the submission; HalfGroupsS when half of them had.
	FirstGroupS float64 `json:"first_group_s"`
	HalfGroupsS float64 `json:"half_groups_s"`
	// HealthzMS is GET /healthz's latency during the rollout (every 50 ms,
	// each on a new connection, as a liveness probe would);
	// HealthzAtPeakMS only those while at least 90% of the episodes ran.
	// HealthPort* are the same of the separate health responder (serve
	// --health-addr), when there is one.
	HealthzMS       Percentiles `json:"healthz_ms"`
	HealthzAtPeakMS Percentiles `json:"healthz_at_peak_ms"`
	HealthzFailed   int         `json:"healthz_failed"`
	// HealthzServiceMS is the service's own part of each in-process
	// probe (its Server-Timing: from the request's arrival in the
	// service's socket, or the accept, to the answer); the rest is the
	// client's connect and the answer's way back.
	HealthzServiceMS       Percentiles `json:"healthz_service_ms"`
	HealthzServiceAtPeakMS Percentiles `json:"healthz_service_at_peak_ms"`
	HealthPortMS           Percentiles `json:"health_port_ms"`
	HealthPortAtPeakMS     Percentiles `json:"health_port_at_peak_ms"`
	// HealthPortNot200 counts its answers other than 200 (503
	// "unresponsive": the service did not report for --health-stale).
	HealthPortNot200 int `json:"health_port_not_200"`
	// HealthzSlowest are the slowest in-process probes, slowest first:
	// when they were sent and how many episodes ran then.
	HealthzSlowest []SlowProbe `json:"healthz_slowest"`
	// Profiled is what ProfileDir's profiles were taken at.
	Profiled *ProfileNote `json:"profiled,omitempty"`
	// The service's resident memory before the rollout, when it ended, and
	// after Settle; SettledAfterS is when it first came within 20% of the
	// value before (-1: never within Settle).
	RSSBefore  int64 `json:"rss_before_bytes"`
	RSSAtEnd   int64 `json:"rss_at_end_bytes"`
	RSSSettled int64 `json:"rss_settled_bytes"`
	// What the resident memory was made of before the rollout and after
	// Settle.
	MemBefore     MemoryParts `json:"memory_before"`
	MemSettled    MemoryParts `json:"memory_settled"`
	SettledAfterS float64     `json:"settled_after_s"`
}

// MemoryParts is what the service's resident memory is made of: anonymous
// memory (its own: the Go heap, stacks, the runtime's metadata) and
// file-backed pages (the executable's and the index's mapped pages, page
// cache the kernel takes back at need), as /proc/PID/status says; and the
// Go heap's live bytes and the bytes of its spans in use (live objects and
// the free room in spans that hold any), from the service's /metrics.
//
// The rest of the anonymous memory is mostly the Go runtime's own, which it
// keeps at its high-water mark and never returns: goroutine stacks in use,
// the span structures (one per span the heap ever had at once: they grow
// with the peak heap), the collector's metadata (mark bits and the arenas'
// index, also sized by the peak) and other runtime memory (profiling
// buckets, per-processor caches).
type MemoryParts struct {
	Anon      int64 `json:"rss_anon_bytes"`
	File      int64 `json:"rss_file_bytes"`
	HeapLive  int64 `json:"heap_live_bytes"`
	HeapInuse int64 `json:"heap_inuse_bytes"`
	Stacks    int64 `json:"stack_inuse_bytes"`
	SpanMeta  int64 `json:"mspan_sys_bytes"`
	GCMeta    int64 `json:"gc_sys_bytes"`
	OtherSys  int64 `json:"other_sys_bytes"`
}

func memoryParts(base string, svc *Service) MemoryParts {
	var m MemoryParts
	if svc != nil {
		pid := strconv.Itoa(svc.cmd.Process.Pid)
		m.Anon, m.File = proc.StatusBytes(pid, "RssAnon:"), proc.StatusBytes(pid, "RssFile:")
	}
	ms := scrapeMetrics(base)
	m.HeapLive, m.HeapInuse = ms["go_memstats_heap_alloc_bytes"], ms["go_memstats_heap_inuse_bytes"]
	m.Stacks, m.SpanMeta, m.GCMeta = ms["go_memstats_stack_inuse_bytes"], ms["go_memstats_mspan_sys_bytes"], ms["go_memstats_gc_sys_bytes"]
	m.OtherSys = ms["go_memstats_other_sys_bytes"] + ms["go_memstats_buck_hash_sys_bytes"] + ms["go_memstats_mcache_sys_bytes"]
	return m
}

func (m MemoryParts) String() string {
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	return fmt.Sprintf("anonymous %.1f + file %.1f MiB; Go heap live %.1f, spans in use %.1f MiB; stacks %.1f, span structures %.1f, GC metadata %.1f, other runtime %.1f MiB",
		mib(m.Anon), mib(m.File), mib(m.HeapLive), mib(m.HeapInuse), mib(m.Stacks), mib(m.SpanMeta), mib(m.GCMeta), mib(m.OtherSys))
}

// SlowProbe is one slow /healthz probe: sent AtS seconds after the
// rollout's submission, answered after MS, while Running episodes ran (as
// the answer said; -1 when it failed).
type SlowProbe struct {
	AtS     float64 `json:"at_s"`
	MS      float64 `json:"ms"`
	Running int     `json:"running"`
	// ServiceMS is the service's own part of it (-1: not said).
	ServiceMS float64 `json:"service_ms"`
}

// ProfileNote is when the service's profiles were taken (RolloutConfig's
// ProfileDir), with how many goroutines it had and episodes it ran then.
type ProfileNote struct {
	Dir        string  `json:"dir"`
	AtS        float64 `json:"at_s"`
	Running    int     `json:"running"`
	Goroutines int     `json:"goroutines"`
	Err        string  `json:"error,omitempty"`
}

// takeProfiles saves the service's goroutine and heap profiles and an
// execution trace of traceFor into dir (see RolloutConfig.ProfileDir).
func takeProfiles(ctx context.Context, debugURL, base, dir string, traceFor time.Duration, start time.Time) *ProfileNote {
	n := &ProfileNote{Dir: dir, AtS: time.Since(start).Seconds()}
	var h struct {
		EpisodesRunning int `json:"episodes_running"`
	}
	if r, err := http.Get(base + "/healthz"); err == nil {
		json.NewDecoder(r.Body).Decode(&h)
		r.Body.Close()
	}
	n.Running = h.EpisodesRunning
	save := func(path, name string) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", debugURL+path, nil)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer r.Body.Close()
		if r.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", path, r.Status)
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		if name == "goroutines.txt" {
			first, _, _ := bytes.Cut(b, []byte("\n"))
			fmt.Sscanf(string(first), "goroutine profile: total %d", &n.Goroutines)
		}
		return os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	var errs []error
	if err := os.MkdirAll(dir, 0o755); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, save("/debug/pprof/goroutine?debug=1", "goroutines.txt"), save("/debug/pprof/heap", "heap.pprof"))
	if traceFor > 0 {
		errs = append(errs, save(fmt.Sprintf("/debug/pprof/trace?seconds=%g", traceFor.Seconds()), "trace.out"))
	}
	if err := errors.Join(errs...); err != nil {
		n.Err = err.Error()
	}
	return n
}

// Percentiles of a sample.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// PercentilesOf summarises a sample (sorting it).
func PercentilesOf(xs []float64) Percentiles {
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

// Rollout submits one rollout to the service at base, reads it back as a
// stream and measures it. An error when not every episode completed comes
// with the result.
func Rollout(ctx context.Context, base string, c RolloutConfig) (*RolloutResult, error) {
	progress := c.Progress
	if progress == nil {
		progress = io.Discard
	}
	ntasks := c.Episodes / c.Group
	tasks := make([]map[string]any, ntasks)
	for i := range tasks {
		sb := map[string]any{"backend": c.Backend}
		if c.Backend == sandbox.BackendDocker {
			sb["image"] = c.Image
		}
		tasks[i] = map[string]any{"id": fmt.Sprintf("bench-%d", i), "prompt": "Run true until told to finish.",
			"sandbox": sb, "tools": []string{"bash", "finish"}, "reward": map[string]any{"type": "exact", "answer": "done"},
			"limits": map[string]any{"max_turns": c.Turns + 1, "episode_timeout_s": 3600}}
	}
	request := map[string]any{"tasks": tasks, "group_size": c.Group,
		"policy": map[string]any{"base_url": c.PolicyURL, "model": "fake-model", "max_retries": 2}}
	if c.Schedule != "" {
		request["schedule"] = c.Schedule
	}
	body, _ := json.Marshal(request)
	rss := func() int64 {
		if c.Service != nil {
			return c.Service.RSS()
		}
		return scrapeMetric(base, "process_resident_memory_bytes")
	}
	rssBefore, memBefore := rss(), memoryParts(base, c.Service)
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
	fmt.Fprintf(progress, "rollbox bench: rollout %s: %d episodes (%d tasks × %d) of %d turns on %s, policy latency %s\n",
		created.ID, c.Episodes, ntasks, c.Group, c.Turns, c.Backend, c.Latency)

	// Probe /healthz as a liveness probe would (a new connection each time,
	// every 50 ms) and watch how many episodes run at once.
	var peak atomic.Int64
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	type probe struct {
		at, ms, portMS float64
		svcMS          float64
		running        int
		failed         bool
		portNot200     bool
	}
	healthURL := ""
	if c.Service != nil && c.Service.HealthURL != "" {
		healthURL = c.Service.HealthURL
	}
	probes := make(chan []probe, 1)
	go func() {
		var got []probe
		defer func() { probes <- got }()
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			var h struct {
				EpisodesRunning int `json:"episodes_running"`
			}
			t0 := time.Now()
			at := t0.Sub(start).Seconds()
			r, err := client.Get(base + "/healthz")
			if err != nil {
				got = append(got, probe{at: at, failed: true})
				continue
			}
			json.NewDecoder(r.Body).Decode(&h)
			r.Body.Close()
			p := probe{at: at, ms: float64(time.Since(t0)) / float64(time.Millisecond), running: h.EpisodesRunning, portMS: -1,
				svcMS: serverTiming(r.Header.Get("Server-Timing"), "service")}
			if healthURL != "" {
				t1 := time.Now()
				if r, err := client.Get(healthURL); err == nil {
					io.Copy(io.Discard, r.Body)
					r.Body.Close()
					p.portMS = float64(time.Since(t1)) / float64(time.Millisecond)
					p.portNot200 = r.StatusCode != http.StatusOK
				}
			}
			got = append(got, p)
			if int64(h.EpisodesRunning) > peak.Load() {
				peak.Store(int64(h.EpisodesRunning))
			}
		}
	}()

	profiled := make(chan *ProfileNote, 1)
	if c.ProfileDir != "" {
		go func() {
			if c.Service == nil || c.Service.DebugURL == "" {
				profiled <- &ProfileNote{Dir: c.ProfileDir, Err: "the service serves no profiles (--debug-addr)"}
				return
			}
			select {
			case <-time.After(time.Until(start.Add(c.ProfileAt))):
				profiled <- takeProfiles(wctx, c.Service.DebugURL, base, c.ProfileDir, c.TraceFor, start)
			case <-wctx.Done():
				profiled <- &ProfileNote{Dir: c.ProfileDir, Err: "the rollout ended before the profiles' time"}
			}
		}()
	}

	res := &RolloutResult{Backend: c.Backend, Episodes: c.Episodes, Ends: map[string]int{}, TurnsPerEpisode: c.Turns,
		PolicyLatencyMS: float64(c.Latency) / float64(time.Millisecond)}
	var overhead, callOver, between, toolMS, lastTurn []float64
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/rollouts/"+created.ID+"/episodes?stream=1", nil)
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer sresp.Body.Close()
	sc := bufio.NewScanner(sresp.Body)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	lat := float64(c.Latency) / float64(time.Millisecond)
	lastReport := time.Now()
	turnsDone := 0
	for sc.Scan() {
		var e streamedEpisode
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("a streamed line: %w", err)
		}
		res.Completed++
		if res.Completed == 1 {
			res.FirstGroupS = time.Since(start).Seconds()
		}
		if res.Completed == c.Episodes/2 {
			res.HalfGroupsS = time.Since(start).Seconds()
		}
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
			fmt.Fprintf(progress, "rollbox bench: %d/%d episodes done, %.0f turns/s, peak running %d\n",
				res.Completed, c.Episodes, float64(turnsDone)/time.Since(start).Seconds(), peak.Load())
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the stream: %w", err)
	}
	res.WallS = time.Since(start).Seconds()
	res.RSSBefore, res.RSSAtEnd, res.Schedule, res.MemBefore = rssBefore, rss(), c.Schedule, memBefore
	if c.Service != nil {
		// Read now: a service that executes itself again while settling
		// (serve --recycle-above) starts a new high-water mark.
		res.ServicePeakRSS = c.Service.PeakRSS()
	}
	stopWatch()
	if c.ProfileDir != "" {
		res.Profiled = <-profiled
	}
	var all, atPeak, port, portAtPeak, svc, svcAtPeak []float64
	got := <-probes
	for _, p := range got {
		switch {
		case p.failed:
			res.HealthzFailed++
		default:
			peak := p.running*10 >= c.Episodes*9
			all = append(all, p.ms)
			if peak {
				atPeak = append(atPeak, p.ms)
			}
			if p.svcMS >= 0 {
				svc = append(svc, p.svcMS)
				if peak {
					svcAtPeak = append(svcAtPeak, p.svcMS)
				}
			}
			if p.portNot200 {
				res.HealthPortNot200++
			}
			if p.portMS >= 0 {
				port = append(port, p.portMS)
				if peak {
					portAtPeak = append(portAtPeak, p.portMS)
				}
			}
		}
	}
	res.HealthzMS, res.HealthzAtPeakMS = PercentilesOf(all), PercentilesOf(atPeak)
	res.HealthzServiceMS, res.HealthzServiceAtPeakMS = PercentilesOf(svc), PercentilesOf(svcAtPeak)
	slices.SortFunc(got, func(a, b probe) int { return cmp.Compare(b.ms, a.ms) })
	for _, p := range got[:min(3, len(got))] {
		if p.failed {
			p.running = -1
		}
		res.HealthzSlowest = append(res.HealthzSlowest, SlowProbe{AtS: p.at, MS: p.ms, Running: p.running, ServiceMS: p.svcMS})
	}
	res.HealthPortMS, res.HealthPortAtPeakMS = PercentilesOf(port), PercentilesOf(portAtPeak)
	res.PeakRunning = int(peak.Load())
	res.SettledAfterS = -1
	for t0 := time.Now(); c.Settle > 0; time.Sleep(time.Second) {
		res.RSSSettled = rss()
		if res.SettledAfterS < 0 && float64(res.RSSSettled) <= 1.2*float64(res.RSSBefore) {
			res.SettledAfterS = time.Since(t0).Seconds()
		}
		if time.Since(t0) >= c.Settle {
			res.MemSettled = memoryParts(base, c.Service)
			if c.ProfileDir != "" && c.Service != nil && c.Service.DebugURL != "" {
				// What stays: the settled service's heap and goroutines.
				settled := takeProfiles(ctx, c.Service.DebugURL, base, filepath.Join(c.ProfileDir, "settled"), 0, start)
				if res.Profiled != nil && settled.Err != "" {
					res.Profiled.Err = strings.TrimPrefix(res.Profiled.Err+"; settled: "+settled.Err, "; ")
				}
			}
			break
		}
	}
	res.TurnsPerS = float64(turnsDone) / res.WallS
	res.TurnOverheadMS, res.PolicyCallOverMS, res.BetweenCallsMS, res.ToolMS, res.LastTurnMS =
		PercentilesOf(overhead), PercentilesOf(callOver), PercentilesOf(between), PercentilesOf(toolMS), PercentilesOf(lastTurn)
	if svc := c.Service; svc != nil {
		res.ServicePeakRSS = max(res.ServicePeakRSS, svc.PeakRSS())
		res.ServiceCPUS = svc.CPUSeconds()
		res.ServiceCPUPerTurnMS = res.ServiceCPUS * 1000 / float64(max(turnsDone, 1))
	}
	if res.ServicePeakRSS == 0 {
		res.ServicePeakRSS = scrapePeakRSS(base)
	}
	res.BenchPeakRSS = proc.PeakRSS("self")
	res.BenchCPUS = proc.CPUSeconds("self")
	if res.Completed != c.Episodes {
		return res, fmt.Errorf("%d of %d episodes completed", res.Completed, c.Episodes)
	}
	return res, nil
}

// Report prints the result for a reader.
func (res *RolloutResult) Report(w io.Writer) {
	lat := time.Duration(res.PolicyLatencyMS * float64(time.Millisecond))
	fmt.Fprintf(w, "rollout bench: %d episodes × %d turns on %s, fake policy latency %s\n", res.Episodes, res.TurnsPerEpisode, res.Backend, lat)
	fmt.Fprintf(w, "  completed           %d/%d  ends %s\n", res.Completed, res.Episodes, fmtCounts(res.Ends))
	fmt.Fprintf(w, "  wall                %.1f s  (%.0f turns/s; ideal %.1f s at this latency)\n", res.WallS, res.TurnsPerS, float64(res.TurnsPerEpisode)*lat.Seconds())
	fmt.Fprintf(w, "  peak running        %d episodes at once (polled)\n", res.PeakRunning)
	fmt.Fprintf(w, "  turn overhead       %s   (turn wall time − policy latency; turns before the last)\n", res.TurnOverheadMS)
	fmt.Fprintf(w, "    policy call       %s   (call wall time − latency: HTTP, JSON, queueing for a slot excluded)\n", res.PolicyCallOverMS)
	fmt.Fprintf(w, "    between calls     %s   (tool, record, waiting for a policy slot)\n", res.BetweenCallsMS)
	fmt.Fprintf(w, "    tool (bash true)  %s\n", res.ToolMS)
	fmt.Fprintf(w, "  last turn overhead  %s   (finish: reward, record, sandbox removal)\n", res.LastTurnMS)
	fmt.Fprintf(w, "  service CPU         %.1f s, %.3f ms a turn (user+system, the whole run)\n", res.ServiceCPUS, res.ServiceCPUPerTurnMS)
	fmt.Fprintf(w, "  service peak RSS    %.1f MiB (VmHWM)\n", float64(res.ServicePeakRSS)/(1<<20))
	fmt.Fprintf(w, "  schedule            %s: first complete group after %.2f s, half of the episodes after %.2f s\n",
		cmpOr(res.Schedule, "(default)"), res.FirstGroupS, res.HalfGroupsS)
	fmt.Fprintf(w, "  healthz             %s   (a new connection every 50 ms; %d failed)\n", res.HealthzMS, res.HealthzFailed)
	fmt.Fprintf(w, "    at peak           %s   (while at least 90%% of the episodes ran)\n", res.HealthzAtPeakMS)
	if len(res.HealthzSlowest) > 0 {
		fmt.Fprintf(w, "    slowest           ")
		for i, p := range res.HealthzSlowest {
			if i > 0 {
				fmt.Fprintf(w, ", ")
			}
			fmt.Fprintf(w, "%.0f ms at %.1f s (%d running", p.MS, p.AtS, p.Running)
			if p.ServiceMS >= 0 {
				fmt.Fprintf(w, "; %.0f ms in the service", p.ServiceMS)
			}
			fmt.Fprintf(w, ")")
		}
		fmt.Fprintln(w)
	}
	if res.HealthzServiceMS.N > 0 {
		fmt.Fprintf(w, "    in the service    %s   (Server-Timing: the request's arrival in the socket to the answer; the rest is the client's connect and the way back)\n", res.HealthzServiceMS)
		fmt.Fprintf(w, "      at peak         %s\n", res.HealthzServiceAtPeakMS)
	}
	if res.HealthPortMS.N > 0 {
		fmt.Fprintf(w, "  healthz (--health-addr) %s   (the separate responder, probed right after; %d not 200)\n", res.HealthPortMS, res.HealthPortNot200)
		fmt.Fprintf(w, "    at peak           %s\n", res.HealthPortAtPeakMS)
	}
	if p := res.Profiled; p != nil {
		fmt.Fprintf(w, "  profiles            %s: at %.1f s, %d running, %d goroutines (%.2f a running episode)", p.Dir, p.AtS, p.Running, p.Goroutines,
			float64(p.Goroutines)/float64(max(p.Running, 1)))
		if p.Err != "" {
			fmt.Fprintf(w, "; %s", p.Err)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  service RSS         %.1f MiB before, %.1f MiB at the end", float64(res.RSSBefore)/(1<<20), float64(res.RSSAtEnd)/(1<<20))
	if res.RSSSettled > 0 {
		fmt.Fprintf(w, ", %.1f MiB after settling", float64(res.RSSSettled)/(1<<20))
		if res.SettledAfterS >= 0 {
			fmt.Fprintf(w, " (within 20%% of before after %.0f s)", res.SettledAfterS)
		} else {
			fmt.Fprintf(w, " (never within 20%% of before)")
		}
		fmt.Fprintf(w, "\n    before            %s", res.MemBefore)
		fmt.Fprintf(w, "\n    after settling    %s", res.MemSettled)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  bench               %.1f s CPU, peak RSS %.1f MiB (fake policy + client, same machine)\n", res.BenchCPUS, float64(res.BenchPeakRSS)/(1<<20))
}

// fmtCounts prints counts as k=v, sorted by key.
func fmtCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

func scrapePeakRSS(base string) int64 { return scrapeMetric(base, "rollbox_process_peak_rss_bytes") }

// scrapeMetric reads one unlabelled metric from the service's /metrics.
// scrapeMetrics reads every unlabelled sample of the service's /metrics
// (none when it does not answer).
func scrapeMetrics(base string) map[string]int64 {
	out := map[string]int64{}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = int64(v)
		}
	}
	return out
}

func scrapeMetric(base, name string) int64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`)
	if m := re.FindSubmatch(b); m != nil {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return int64(v)
	}
	return 0
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ScheduleComparison is the same rollout run with each schedule, in order.
type ScheduleComparison struct {
	Runs []*RolloutResult `json:"runs"`
}

// Report prints each run and how the first complete group compares.
func (c *ScheduleComparison) Report(w io.Writer) {
	for _, r := range c.Runs {
		r.Report(w)
	}
	if len(c.Runs) == 2 && c.Runs[1].FirstGroupS > 0 {
		a, b := c.Runs[0], c.Runs[1]
		fmt.Fprintf(w, "first complete group: %.2f s (%s) vs %.2f s (%s): %.1fx earlier; all episodes %.1f s vs %.1f s (%.2fx)\n",
			a.FirstGroupS, a.Schedule, b.FirstGroupS, b.Schedule, a.FirstGroupS/b.FirstGroupS, a.WallS, b.WallS, b.WallS/a.WallS)
	}
}

// BuildComparison is the same rollout run on services of two builds, in
// order (the baseline first).
type BuildComparison struct {
	Names []string         `json:"names"`
	Runs  []*RolloutResult `json:"runs"`
}

// Report prints each run and a table of what differs.
func (c *BuildComparison) Report(w io.Writer) {
	for i, r := range c.Runs {
		fmt.Fprintf(w, "== %s\n", c.Names[i])
		r.Report(w)
	}
	if len(c.Runs) != 2 {
		return
	}
	a, b := c.Runs[0], c.Runs[1]
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	fmt.Fprintf(w, "== baseline vs this build\n")
	fmt.Fprintf(w, "  healthz at peak p50  %8.2f  %8.2f ms\n", a.HealthzAtPeakMS.P50, b.HealthzAtPeakMS.P50)
	fmt.Fprintf(w, "  healthz at peak p99  %8.2f  %8.2f ms\n", a.HealthzAtPeakMS.P99, b.HealthzAtPeakMS.P99)
	fmt.Fprintf(w, "  healthz at peak max  %8.2f  %8.2f ms\n", a.HealthzAtPeakMS.Max, b.HealthzAtPeakMS.Max)
	fmt.Fprintf(w, "  healthz p99 (all)    %8.2f  %8.2f ms\n", a.HealthzMS.P99, b.HealthzMS.P99)
	fmt.Fprintf(w, "  healthz max (all)    %8.2f  %8.2f ms\n", a.HealthzMS.Max, b.HealthzMS.Max)
	if a.HealthzServiceMS.N > 0 || b.HealthzServiceMS.N > 0 {
		fmt.Fprintf(w, "  in the service p99   %8.2f  %8.2f ms (Server-Timing, the whole run; n=%d, %d)\n", a.HealthzServiceMS.P99, b.HealthzServiceMS.P99, a.HealthzServiceMS.N, b.HealthzServiceMS.N)
	}
	fmt.Fprintf(w, "  wall                 %8.1f  %8.1f s\n", a.WallS, b.WallS)
	fmt.Fprintf(w, "  service CPU          %8.1f  %8.1f s\n", a.ServiceCPUS, b.ServiceCPUS)
	fmt.Fprintf(w, "  peak RSS             %8.1f  %8.1f MiB\n", mib(a.ServicePeakRSS), mib(b.ServicePeakRSS))
	fmt.Fprintf(w, "  RSS before           %8.1f  %8.1f MiB\n", mib(a.RSSBefore), mib(b.RSSBefore))
	fmt.Fprintf(w, "  RSS at the end       %8.1f  %8.1f MiB\n", mib(a.RSSAtEnd), mib(b.RSSAtEnd))
	if a.RSSSettled > 0 || b.RSSSettled > 0 {
		ratio := func(x, y int64) float64 { return float64(x) / float64(max(y, 1)) }
		fmt.Fprintf(w, "  RSS settled          %8.1f  %8.1f MiB (%.2fx, %.2fx of before)\n", mib(a.RSSSettled), mib(b.RSSSettled),
			ratio(a.RSSSettled, a.RSSBefore), ratio(b.RSSSettled, b.RSSBefore))
		ab, as, bb, bs := a.MemBefore, a.MemSettled, b.MemBefore, b.MemSettled
		fmt.Fprintf(w, "  RssAnon before       %8.1f  %8.1f MiB\n", mib(ab.Anon), mib(bb.Anon))
		fmt.Fprintf(w, "  RssAnon settled      %8.1f  %8.1f MiB (%.2fx, %.2fx of before)\n", mib(as.Anon), mib(bs.Anon), ratio(as.Anon, ab.Anon), ratio(bs.Anon, bb.Anon))
		fmt.Fprintf(w, "  RssFile before       %8.1f  %8.1f MiB\n", mib(ab.File), mib(bb.File))
		fmt.Fprintf(w, "  RssFile settled      %8.1f  %8.1f MiB (%.2fx, %.2fx of before)\n", mib(as.File), mib(bs.File), ratio(as.File, ab.File), ratio(bs.File, bb.File))
		fmt.Fprintf(w, "  settled: heap live   %8.1f  %8.1f MiB\n", mib(as.HeapLive), mib(bs.HeapLive))
		fmt.Fprintf(w, "  settled: spans in use%8.1f  %8.1f MiB\n", mib(as.HeapInuse), mib(bs.HeapInuse))
		fmt.Fprintf(w, "  settled: runtime     %8.1f  %8.1f MiB (stacks, span structures, GC metadata, other)\n",
			mib(as.Stacks+as.SpanMeta+as.GCMeta+as.OtherSys), mib(bs.Stacks+bs.SpanMeta+bs.GCMeta+bs.OtherSys))
	}
	if a.HealthPortAtPeakMS.N > 0 || b.HealthPortAtPeakMS.N > 0 {
		fmt.Fprintf(w, "  --health-addr p99    %8.2f  %8.2f ms (at peak: the host's own delay, for reference)\n", a.HealthPortAtPeakMS.P99, b.HealthPortAtPeakMS.P99)
	}
}

// serverTiming reads the duration of metric name from a Server-Timing
// header ("name;dur=1.5, other;dur=2"), -1 when it is not there.
func serverTiming(h, name string) float64 {
	for _, m := range strings.Split(h, ",") {
		parts := strings.Split(strings.TrimSpace(m), ";")
		if parts[0] != name {
			continue
		}
		for _, p := range parts[1:] {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "dur="); ok {
				if f, err := strconv.ParseFloat(v, 64); err == nil {
					return f
				}
			}
		}
	}
	return -1
}
