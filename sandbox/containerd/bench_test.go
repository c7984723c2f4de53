package containerd_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
	"github.com/rollbox/rollbox/sandbox/docker"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

// Benchmarks put containerd beside its baselines in the same run, on the
// same image and machine:
//
//	go test ./sandbox/containerd -run '^$' -bench . -benchtime 100x
//	ROLLBOX_DENSITY=500 go test ./sandbox/containerd -run '^$' -bench Density -benchtime 1x
//
// and report p50/p99 per operation in milliseconds beside the mean ns/op.

type latencies []time.Duration

func (l latencies) report(b *testing.B) time.Duration { return l.reportAs(b, "") }

// reportAs reports the p50 and p99 in milliseconds, the units named with
// prefix, and returns the p50.
func (l latencies) reportAs(b *testing.B, prefix string) time.Duration {
	if len(l) == 0 {
		return 0
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	pct := func(p float64) time.Duration { return l[min(len(l)-1, int(p*float64(len(l))))] }
	b.ReportMetric(float64(pct(0.50).Microseconds())/1000, prefix+"p50-ms")
	b.ReportMetric(float64(pct(0.99).Microseconds())/1000, prefix+"p99-ms")
	return pct(0.50)
}

var dockerOnce struct {
	sync.Once
	b   *docker.Backend
	err error
}

// dockerBackend is the Docker backend on the same guest, for the baselines.
func dockerBackend(b *testing.B) *docker.Backend {
	dockerOnce.Do(func() {
		ctx := context.Background()
		guest, err := images.NewBuilder(os.Stderr).Build(ctx, images.Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"})
		if err != nil {
			dockerOnce.err = err
			return
		}
		dockerOnce.b, dockerOnce.err = docker.New(ctx, docker.Options{GuestPath: guest, Owner: testOwner})
	})
	if dockerOnce.err != nil {
		b.Skipf("no docker engine for the baseline: %v", dockerOnce.err)
	}
	return dockerOnce.b
}

func readyOnce(b *testing.B, be sandbox.Backend, spec sandbox.Spec) time.Duration {
	ctx := context.Background()
	start := time.Now()
	sb, err := be.Create(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	if r, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
		b.Fatalf("first exec: %v %+v", err, r)
	}
	d := time.Since(start)
	b.StopTimer()
	sb.Close()
	b.StartTimer()
	return d
}

// BenchmarkReady: a cold sandbox created, started and answering its first
// exec, on containerd and on Docker (the same guest, hardening and image),
// beside `docker run --rm --network none rollbox/base true` through the
// CLI, and containerd with the seccomp profile's every ABI (x86 and x32
// beside x86-64, as before withNativeSyscallsOnly). Each iteration makes
// one of each, in turn, so all see the same load on a shared machine;
// Close is not timed. Reports each one's p50 and p99 and the ratios of
// containerd's p50 to the Docker backend's and to its all-ABIs baseline.
func BenchmarkReady(b *testing.B) {
	spec := sandbox.Spec{Image: "base"}
	cd, dk := need(b), dockerBackend(b)
	all := newBackend(b, containerd.Options{})
	containerd.SetAllABIs(all)
	var lat [4]latencies
	for b.Loop() {
		lat[0] = append(lat[0], readyOnce(b, cd, spec))
		lat[1] = append(lat[1], readyOnce(b, dk, spec))
		lat[3] = append(lat[3], readyOnce(b, all, spec))
		start := time.Now()
		if out, err := exec.Command("docker", "run", "--rm", "--network", "none", "--label", "rollbox.owner="+testOwner, "rollbox/base:latest", "true").CombinedOutput(); err != nil {
			b.Fatalf("docker run: %v %s", err, out)
		}
		lat[2] = append(lat[2], time.Since(start))
	}
	var p50 [4]time.Duration
	for i, name := range []string{"containerd", "docker", "docker-run-rm", "containerd-all-abis"} {
		p50[i] = lat[i].reportAs(b, name+"-")
	}
	b.ReportMetric(float64(p50[0])/float64(p50[1]), "containerd/docker")
	b.ReportMetric(float64(p50[0])/float64(p50[3]), "native/all-abis")
}

// BenchmarkExecTrue: `true` through the guest in a running sandbox, on
// containerd (over the channel past the shim), on containerd over the
// task's stdio (Options.StdioOnly: the shim's copy, as before the channel)
// and on Docker, one of each in turn. With
// ROLLBOX_BENCH_BASELINE_GUEST (a guest binary built from another commit,
// e.g. `git worktree add /tmp/old <commit> && cd /tmp/old && CGO_ENABLED=0
// go build -trimpath -o /tmp/guest-old ./images/guest`) a containerd
// sandbox running that guest takes its turn too: the guest's change side
// by side.
func BenchmarkExecTrue(b *testing.B) {
	ctx := context.Background()
	arms := []struct {
		name string
		be   sandbox.Backend
	}{{"containerd", need(b)}, {"containerd-stdio", newBackend(b, containerd.Options{StdioOnly: true})}, {"docker", dockerBackend(b)}}
	if path := os.Getenv("ROLLBOX_BENCH_BASELINE_GUEST"); path != "" {
		// A guest built before the channel speaks stdio only.
		arms = append(arms, struct {
			name string
			be   sandbox.Backend
		}{"containerd-stdio-baseline-guest", newBackend(b, containerd.Options{GuestPath: path, StdioOnly: true})})
	}
	var sbs []sandbox.Sandbox
	for _, arm := range arms {
		sb, err := arm.be.Create(ctx, sandbox.Spec{Image: "base"})
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Close()
		sbs = append(sbs, sb)
	}
	lat := make([]latencies, len(sbs))
	for b.Loop() {
		for i, sb := range sbs {
			start := time.Now()
			if r, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
				b.Fatalf("exec: %v %+v", err, r)
			}
			lat[i] = append(lat[i], time.Since(start))
		}
	}
	p50 := make([]time.Duration, len(sbs))
	for i, arm := range arms {
		p50[i] = lat[i].reportAs(b, arm.name+"-")
	}
	b.ReportMetric(float64(p50[0])/float64(p50[1]), "channel/stdio")
	if len(arms) > 3 {
		b.ReportMetric(float64(p50[1])/float64(p50[3]), "guest/baseline-guest")
	}
}

// BenchmarkPoolHit: a ready containerd sandbox taken from a warm
// sandbox.Pool (get), and answering its first exec (get+exec); the pool
// refills untimed.
func BenchmarkPoolHit(b *testing.B) {
	be := need(b)
	ctx := context.Background()
	spec := sandbox.Spec{Image: "base"}
	pool := sandbox.NewPool(be, 2)
	defer pool.Close()
	if err := pool.Warm(spec); err != nil {
		b.Fatal(err)
	}
	waitReady := func() {
		deadline := time.Now().Add(time.Minute)
		for pool.Stats().Ready[spec.Key()] < 2 {
			if time.Now().After(deadline) {
				b.Fatalf("pool did not refill: %+v", pool.Stats())
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	var get, first latencies
	b.StopTimer()
	waitReady()
	for i := 0; i < b.N; i++ {
		b.StartTimer()
		start := time.Now()
		sb, err := pool.Get(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		get = append(get, time.Since(start))
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		first = append(first, time.Since(start))
		b.StopTimer()
		sb.Close()
		waitReady()
	}
	get.reportAs(b, "get-")
	first.reportAs(b, "get+exec-")
	if st := pool.Stats(); st.Misses > 0 {
		b.Errorf("pool missed %d times", st.Misses)
	}
}

// forkFiles fills a sandbox's workdir with 100 MB in 2,000 files of 50 KB
// in 20 directories.
const forkFiles = `head -c 51200 /dev/urandom > /tmp/seed && for d in $(seq 0 19); do mkdir -p /work/d$d;
  for f in $(seq 0 99); do cp /tmp/seed /work/d$d/f$f; done; done; rm /tmp/seed; du -sm /work | cut -f1`

// BenchmarkFork100MB: Fork(8) of a sandbox whose workdir holds 100 MB in
// 2,000 files, on containerd (the parent's layer frozen, no byte copied,
// 8 copy-on-write overlays), taking 8 spare sandboxes (made untimed between
// iterations, as Options.ForkSpares keeps them) and creating its 8
// children cold ("containerd-cold"), on Docker (8 fresh containers, the
// files copied into each through the guests) and WASM (8 copy-on-write
// clones of the filesystem). The children are closed untimed.
func BenchmarkFork100MB(b *testing.B) {
	ctx := context.Background()
	for _, name := range []string{"containerd", "containerd-cold", "docker", "wasm"} {
		b.Run(name, func(b *testing.B) {
			var be sandbox.Backend
			spec := sandbox.Spec{Image: "base", Limits: sandbox.Limits{DiskMB: 200, MemoryMB: 1024}}
			spares := func() {}
			switch name {
			case "containerd":
				cd := need(b)
				be = cd
				spares = func() {
					cd.SpareForks(spec, 8)
					deadline := time.Now().Add(2 * time.Minute)
					for cd.SparesReady(spec) < 8 {
						if time.Now().After(deadline) {
							b.Fatalf("%d spares ready after 2 minutes", cd.SparesReady(spec))
						}
						time.Sleep(5 * time.Millisecond)
					}
				}
			case "containerd-cold":
				be = need(b)
			case "docker":
				be = dockerBackend(b)
			case "wasm":
				w, err := wasm.New(ctx, wasm.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer w.Close()
				be = w
			}
			parent, err := be.Create(ctx, spec)
			if err != nil {
				b.Fatal(err)
			}
			defer parent.Close()
			if name == "wasm" {
				data := make([]byte, 50<<10)
				for i := range 2000 {
					if err := parent.WriteFile(ctx, fmt.Sprintf("/work/d%d/f%d", i/100, i%100), data, 0o644); err != nil {
						b.Fatal(err)
					}
				}
			} else if r, err := parent.Exec(ctx, sandbox.ExecRequest{Shell: forkFiles, Timeout: 5 * time.Minute}); err != nil || r.ExitCode != 0 {
				b.Fatalf("fill: %v %s %s", err, r.Stdout, r.Stderr)
			}
			lat := make(latencies, 0, b.N)
			for b.Loop() {
				b.StopTimer()
				spares()
				b.StartTimer()
				start := time.Now()
				kids, err := parent.(sandbox.Forker).Fork(ctx, 8)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				b.StopTimer()
				if got, err := kids[7].ReadFile(ctx, "/work/d19/f99", 0); err != nil || len(got) != 50<<10 {
					b.Fatalf("a child lacks the files: %d bytes, %v", len(got), err)
				}
				sandbox.CloseAll(kids)
				b.StartTimer()
			}
			lat.report(b)
		})
	}
}

// BenchmarkDensity: ROLLBOX_DENSITY idle sandboxes (default 50) open at
// once, on containerd and on Docker (the same guest, image and hardening);
// reports the host memory they take (MemAvailable before and after, so
// shims, the guests, page tables, tmpfs and the engines' own bookkeeping
// all count) per sandbox, the shims' RSS per sandbox, and the time to make
// and to close them all.
//
//	ROLLBOX_DENSITY=500 go test ./sandbox/containerd -run '^$' -bench Density -benchtime 1x
func BenchmarkDensity(b *testing.B) {
	n := 50
	if s := os.Getenv("ROLLBOX_DENSITY"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	for _, name := range []string{"containerd", "docker"} {
		b.Run(name, func(b *testing.B) {
			var be sandbox.Backend
			if name == "containerd" {
				be = need(b)
			} else {
				be = dockerBackend(b)
			}
			for b.Loop() {
				density(b, be, n)
			}
		})
	}
}

func density(b *testing.B, be sandbox.Backend, n int) {
	ctx := context.Background()
	before := memAvailable(b)
	shimsBefore := shimRSS()
	sbs := make([]sandbox.Sandbox, n)
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	var mu sync.Mutex
	var firstErr error
	for i := range sbs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sb, err := be.Create(ctx, sandbox.Spec{Image: "base"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			sbs[i] = sb
		}()
	}
	wg.Wait()
	made := time.Since(start)
	defer func() {
		closeStart := time.Now()
		if err := sandbox.CloseAll(sbs); err != nil {
			b.Error(err)
		}
		b.ReportMetric(time.Since(closeStart).Seconds(), "close-all-s")
	}()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	// Every one still answers.
	for _, sb := range sbs {
		if r, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
			b.Fatalf("%s: %v", sb.Info().ID, err)
		}
	}
	after := memAvailable(b)
	shims := shimRSS() - shimsBefore
	b.ReportMetric(float64(n), "sandboxes")
	b.ReportMetric(float64(before-after)/float64(n)/(1<<20), "host-MB/sandbox")
	b.ReportMetric(float64(shims)/float64(n)/(1<<20), "shim-RSS-MB/sandbox")
	b.ReportMetric(made.Seconds(), "create-all-s")
}

func memAvailable(b *testing.B) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no MemAvailable")
	return 0
}

// shimRSS sums the resident memory of containerd's runc shims.
func shimRSS() int64 {
	var sum int64
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, err := os.ReadFile(d + "/comm")
		if err != nil || !strings.HasPrefix(string(comm), "containerd-shim") {
			continue
		}
		st, err := os.ReadFile(d + "/statm")
		if err != nil {
			continue
		}
		f := strings.Fields(string(st))
		if len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			sum += pages * int64(os.Getpagesize())
		}
	}
	return sum
}

// BenchmarkGuestRoundTrip: a read of a 2-byte file through the guest (no
// process started), on containerd over the channel, over the task's stdio
// and on Docker in turn: the transport's share of BenchmarkExecTrue.
func BenchmarkGuestRoundTrip(b *testing.B) {
	ctx := context.Background()
	var sbs []sandbox.Sandbox
	for _, be := range []sandbox.Backend{need(b), newBackend(b, containerd.Options{StdioOnly: true}), dockerBackend(b)} {
		sb, err := be.Create(ctx, sandbox.Spec{Image: "base"})
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Close()
		if err := sb.WriteFile(ctx, "/work/f", []byte("x\n"), 0o644); err != nil {
			b.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	var lat [3]latencies
	for b.Loop() {
		for i, sb := range sbs {
			start := time.Now()
			if _, err := sb.ReadFile(ctx, "/work/f", 0); err != nil {
				b.Fatal(err)
			}
			lat[i] = append(lat[i], time.Since(start))
		}
	}
	ch := lat[0].reportAs(b, "containerd-")
	stdio := lat[1].reportAs(b, "containerd-stdio-")
	lat[2].reportAs(b, "docker-")
	b.ReportMetric(float64(ch)/float64(stdio), "channel/stdio")
}

// BenchmarkReadySteps: where a cold containerd sandbox's ready time goes,
// step by step (p50 of each, in ms): the image lookup, the lease, the
// workspace's tmpfs and anchors, the channel's socket, NewContainer (the
// snapshot prepared and the record), the stdio FIFOs, NewTask (the shim
// started, then `runc create`), the exit wait and the workspace's binds,
// the task's start (`runc start`), the guest's connection to the channel,
// its Hello, and the first exec of `true`. Close is not timed.
func BenchmarkReadySteps(b *testing.B) {
	be := newBackend(b, containerd.Options{})
	ctx := context.Background()
	steps := map[string]latencies{}
	var order []string
	var last time.Time
	containerd.SetTrace(be, func(step string) {
		now := time.Now()
		if step != "" {
			if _, ok := steps[step]; !ok {
				order = append(order, step)
			}
			steps[step] = append(steps[step], now.Sub(last))
		}
		last = now
	})
	var total latencies
	for b.Loop() {
		start := time.Now()
		sb, err := be.Create(ctx, sandbox.Spec{Image: "base"})
		if err != nil {
			b.Fatal(err)
		}
		t := time.Now()
		if r, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
			b.Fatalf("first exec: %v %+v", err, r)
		}
		steps["exec"] = append(steps["exec"], time.Since(t))
		total = append(total, time.Since(start))
		b.StopTimer()
		sb.Close()
		b.StartTimer()
	}
	for _, s := range append(order, "exec") {
		l := steps[s]
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, s+"-p50-ms")
	}
	total.reportAs(b, "ready-")
}

// BenchmarkReadyShimShare: the shim's start's share of a cold ready. Each
// iteration creates two sandboxes in turn: one starting its own shim (as
// every create does) and one joining the running shim of a sandbox kept
// open (the runc shim's group annotation, as CRI groups a pod's
// containers), and reports the p50 of NewTask (shim start and `runc
// create`) and of the whole ready of each. Joining is not what the
// backend does (RATIONALE.md: a shim's exit when its last task goes races
// a join); this measures what it would save.
func BenchmarkReadyShimShare(b *testing.B) {
	ctx := context.Background()
	own, joined := newBackend(b, containerd.Options{}), newBackend(b, containerd.Options{})
	keeper, err := own.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		b.Fatal(err)
	}
	defer keeper.Close()
	containerd.SetShimGroup(joined, keeper.Info().ID)
	var task [2]latencies
	var ready [2]latencies
	for i, be := range []*containerd.Backend{own, joined} {
		var last time.Time
		containerd.SetTrace(be, func(step string) {
			now := time.Now()
			if step == "task" {
				task[i] = append(task[i], now.Sub(last))
			}
			last = now
		})
	}
	for b.Loop() {
		for i, be := range []*containerd.Backend{own, joined} {
			ready[i] = append(ready[i], readyOnce(b, be, sandbox.Spec{Image: "base"}))
		}
	}
	ownTask := task[0].reportAs(b, "own-shim-task-")
	joinedTask := task[1].reportAs(b, "joined-shim-task-")
	ownReady := ready[0].reportAs(b, "own-shim-ready-")
	joinedReady := ready[1].reportAs(b, "joined-shim-ready-")
	b.ReportMetric(float64(ownTask-joinedTask)/1e6, "shim-start-ms")
	b.ReportMetric(float64(joinedReady)/float64(ownReady), "joined/own")
}
