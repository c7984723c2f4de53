package docker_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// pythonWorkload is a fixed piece of work inside the sandbox that times
// itself: imports (the file system through the runtime's gofer), compute,
// and 20,000 stat calls (system calls). It prints its phases in seconds as
// JSON.
const pythonWorkload = `import time, os, json
t0 = time.perf_counter()
import argparse, asyncio, decimal, email.parser, http.client, logging, unittest, xml.etree.ElementTree, urllib.request, difflib, inspect, dataclasses, typing, fractions, statistics, zipfile, tarfile, csv, sqlite3
t1 = time.perf_counter()
acc = 0
for i in range(1500000):
    acc += (i * i) % 7
d = {str(i): i for i in range(50000)}
t2 = time.perf_counter()
p = os.__file__
for i in range(20000):
    os.stat(p)
t3 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "compute": t2 - t1, "stat": t3 - t2, "total": t3 - t0}))
`

type workloadTimes struct {
	Imports, Compute, Stat, Total float64
	// CPU is the CPU time the container's cgroup used while the workload
	// ran (0 when the host's cgroups cannot be read): what the sandbox's
	// machinery costs, which a loaded machine hides from wall-clock times.
	CPU float64
}

// BenchmarkPythonWorkload measures work inside the sandbox, not the round
// trip: pythonWorkload in a fresh sandbox through the guest (the path of
// `rollbox exec`), against a plain `docker run` of python3 with the same
// runtime and flags (the backend's own container configuration, entrypoint
// aside), in the same run, for runc and runsc. Each iteration runs every
// arm once, in rotating order, so load on the machine falls on all of them
// alike; the numbers are the medians of the workload's own timings and of
// the CPU time its container used meanwhile (the host's cgroup, read
// around the exec, and in the plain container from the start of the same
// python3 to its exit).
//
//	go test ./sandbox/docker -run '^$' -bench PythonWorkload -benchtime 15x
//
// ROLLBOX_BENCH_BASELINE_GUEST, a guest binary built from another commit,
// adds a "baseline" arm: before and after, side by side in one run.
//
//	mkdir /tmp/base && git archive COMMIT | tar -x -C /tmp/base &&
//	  (cd /tmp/base && CGO_ENABLED=0 go build -o /tmp/guest-base ./images/guest)
func BenchmarkPythonWorkload(b *testing.B) {
	be := need(b)
	ctx := context.Background()
	if _, err := docker.BuildImage(ctx, be.Client(), "python", os.Stderr); err != nil {
		b.Fatal(err)
	}
	arms := guestArms(b, be)
	names := append([]string{"plain"}, slices.Sorted(maps.Keys(arms))...)
	slices.Sort(names)
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		b.Run(rt, func(b *testing.B) {
			spec := sandbox.Spec{Image: "python", Runtime: rt}
			times := map[string][]workloadTimes{}
			i := 0
			for b.Loop() {
				for k := range names {
					name := names[(i+k)%len(names)]
					var t workloadTimes
					if name == "plain" {
						t = plainWorkload(b, be, spec)
					} else {
						t = sandboxWorkload(b, arms[name], spec)
					}
					times[name] = append(times[name], t)
				}
				i++
			}
			plain := medianTimes(times["plain"])
			var table strings.Builder
			fmt.Fprintf(&table, "%s, median of %d (seconds inside the sandbox; CPU seconds of its cgroup):\n%-9s %8s %8s %8s %8s %9s %8s %9s\n",
				rt, i, "arm", "imports", "compute", "stat", "total", "vs plain", "cpu", "vs plain")
			for _, name := range names {
				m := medianTimes(times[name])
				ratio, cpuRatio := m.Total/plain.Total, 0.0
				if plain.CPU > 0 {
					cpuRatio = m.CPU / plain.CPU
				}
				fmt.Fprintf(&table, "%-9s %8.3f %8.3f %8.3f %8.3f %8.2fx %8.3f %8.2fx\n", name, m.Imports, m.Compute, m.Stat, m.Total, ratio, m.CPU, cpuRatio)
				b.ReportMetric(m.Total, name+"-s")
				b.ReportMetric(m.CPU, name+"-cpu-s")
				if name != "plain" {
					b.ReportMetric(ratio, name+"/plain")
					b.ReportMetric(cpuRatio, name+"/plain-cpu")
				}
			}
			b.Log(table.String())
		})
	}
}

// guestArms is be ("rollbox") and, with ROLLBOX_BENCH_BASELINE_GUEST, a
// backend running that guest binary ("baseline").
func guestArms(b *testing.B, be *docker.Backend) map[string]*docker.Backend {
	arms := map[string]*docker.Backend{"rollbox": be}
	if path := os.Getenv("ROLLBOX_BENCH_BASELINE_GUEST"); path != "" {
		base, err := docker.New(context.Background(), docker.Options{GuestPath: path, Owner: testOwner})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { base.Close() })
		arms["baseline"] = base
	}
	return arms
}

// BenchmarkGuestIdleCPU measures what the guest itself costs a runsc
// sandbox: the CPU its cgroup uses over a second in which no command runs
// (the sandbox waits for the model) and over a `sleep 1` (a command that
// does nothing), per guest arm (ROLLBOX_BENCH_BASELINE_GUEST adds the old
// guest, as for BenchmarkPythonWorkload). A guest that polls pays here.
//
//	go test ./sandbox/docker -run '^$' -bench GuestIdleCPU -benchtime 5x
func BenchmarkGuestIdleCPU(b *testing.B) {
	be := need(b)
	ctx := context.Background()
	arms := guestArms(b, be)
	names := slices.Sorted(maps.Keys(arms))
	type sample struct{ idle, sleeping float64 }
	got := map[string][]sample{}
	i := 0
	for b.Loop() {
		for k := range names {
			name := names[(i+k)%len(names)]
			sb, err := arms[name].Create(ctx, sandbox.Spec{Image: "base", Runtime: sandbox.RuntimeRunsc})
			if err != nil {
				b.Fatal(err)
			}
			id := sb.(*docker.Container).FullID()
			// A command first, as in an episode, then a second without any.
			if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
				b.Fatal(err)
			}
			start, cpu := time.Now(), cgroupCPU(id)
			time.Sleep(time.Second)
			idle := (cgroupCPU(id) - cpu) / time.Since(start).Seconds()
			start, cpu = time.Now(), cgroupCPU(id)
			if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "1"}}); err != nil || res.ExitCode != 0 {
				b.Fatalf("sleep: %v %+v", err, res)
			}
			sleeping := (cgroupCPU(id) - cpu) / time.Since(start).Seconds()
			sb.Close()
			got[name] = append(got[name], sample{idle, sleeping})
		}
		i++
	}
	var table strings.Builder
	fmt.Fprintf(&table, "runsc, median of %d (CPU seconds a second of the sandbox's cgroup):\n%-9s %8s %8s\n", i, "guest", "idle", "sleep 1")
	for _, name := range names {
		var idle, sleeping []float64
		for _, s := range got[name] {
			idle, sleeping = append(idle, s.idle), append(sleeping, s.sleeping)
		}
		slices.Sort(idle)
		slices.Sort(sleeping)
		m := [2]float64{idle[len(idle)/2], sleeping[len(sleeping)/2]}
		fmt.Fprintf(&table, "%-9s %8.3f %8.3f\n", name, m[0], m[1])
		b.ReportMetric(m[0], name+"-idle-cpu/s")
		b.ReportMetric(m[1], name+"-sleep-cpu/s")
	}
	b.Log(table.String())
}

// sandboxWorkload runs the workload in a fresh sandbox of be.
func sandboxWorkload(b *testing.B, be *docker.Backend, spec sandbox.Spec) workloadTimes {
	ctx := context.Background()
	sb, err := be.Create(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Close()
	id := sb.(*docker.Container).FullID()
	before := cgroupCPU(id)
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c", pythonWorkload}, Timeout: 5 * time.Minute})
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("exec: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
	}
	t := parseWorkload(b, res.Stdout)
	t.CPU = cgroupCPU(id) - before
	return t
}

// plainWorkload is `docker run` of the workload in a container configured
// as be would configure spec's, running a shell that says it is ready,
// waits for a line, runs python3, says it is done and waits again: the CPU
// its cgroup uses from the first line to "done" is the workload's, its
// start and exit included as in the sandbox's Exec.
func plainWorkload(b *testing.B, be *docker.Backend, spec sandbox.Spec) workloadTimes {
	ctx := context.Background()
	cli := be.Client()
	ref, err := docker.ResolveImage(spec.Image)
	if err != nil {
		b.Fatal(err)
	}
	img, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		b.Fatal(err)
	}
	cfg, hc := be.ContainerConfig(spec, img.ID)
	cfg.Entrypoint = []string{"/bin/sh", "-c", `echo ready; read go; python3 -c "$WORKLOAD"; echo done; read end`}
	cfg.Env = append(cfg.Env, "WORKLOAD="+pythonWorkload)
	c, err := cli.ContainerCreate(ctx, cfg, hc, nil, nil, "")
	if err != nil {
		b.Fatal(err)
	}
	defer cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true})
	hj, err := cli.ContainerAttach(ctx, c.ID, container.AttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		b.Fatal(err)
	}
	defer hj.Close()
	pr, pw := io.Pipe()
	var stderr bytes.Buffer
	go func() { _, err := stdcopy.StdCopy(pw, &stderr, hj.Reader); pw.CloseWithError(err) }()
	lines := bufio.NewScanner(pr)
	line := func() string {
		if !lines.Scan() {
			b.Fatalf("plain container: output ended (%v), stderr %q", lines.Err(), stderr.String())
		}
		return lines.Text()
	}
	waitC, errC := cli.ContainerWait(ctx, c.ID, container.WaitConditionNextExit)
	if err := cli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
		b.Fatal(err)
	}
	if l := line(); l != "ready" {
		b.Fatalf("plain container said %q", l)
	}
	before := cgroupCPU(c.ID)
	io.WriteString(hj.Conn, "go\n")
	t := parseWorkload(b, []byte(line()))
	if l := line(); l != "done" { // python3 has exited, as when Exec returns
		b.Fatalf("plain container said %q", l)
	}
	t.CPU = cgroupCPU(c.ID) - before
	io.WriteString(hj.Conn, "end\n")
	select {
	case w := <-waitC:
		if w.StatusCode != 0 {
			b.Fatalf("docker run: exit %d, stderr %q", w.StatusCode, stderr.String())
		}
	case err := <-errC:
		b.Fatal(err)
	}
	return t
}

// cgroupCPU is the CPU time, in seconds, the container's cgroup has used,
// read from the host's cgroupfs (v1 with the cgroupfs driver, or v2 with
// systemd's); 0 when it cannot be read.
func cgroupCPU(id string) float64 {
	if b, err := os.ReadFile("/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage"); err == nil {
		ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return float64(ns) / 1e9
	}
	for _, p := range []string{"/sys/fs/cgroup/system.slice/docker-" + id + ".scope/cpu.stat", "/sys/fs/cgroup/docker/" + id + "/cpu.stat"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return float64(us) / 1e6
			}
		}
	}
	return 0
}

func parseWorkload(b *testing.B, out []byte) workloadTimes {
	var t workloadTimes
	if err := json.Unmarshal(out, &t); err != nil || t.Total <= 0 {
		b.Fatalf("workload output %q: %v", out, err)
	}
	return t
}

func medianTimes(ts []workloadTimes) workloadTimes {
	med := func(f func(workloadTimes) float64) float64 {
		v := make([]float64, len(ts))
		for i, t := range ts {
			v[i] = f(t)
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		return v[len(v)/2]
	}
	return workloadTimes{
		Imports: med(func(t workloadTimes) float64 { return t.Imports }),
		Compute: med(func(t workloadTimes) float64 { return t.Compute }),
		Stat:    med(func(t workloadTimes) float64 { return t.Stat }),
		Total:   med(func(t workloadTimes) float64 { return t.Total }),
		CPU:     med(func(t workloadTimes) float64 { return t.CPU }),
	}
}
