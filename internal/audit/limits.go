package audit

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// The resource probes: a fork bomb, a memory balloon, a disk fill, a CPU
// spin and an output flood must each hurt only the command that ran it.

func (r *runner) forkBomb(ctx context.Context) Probe {
	if r.wasm {
		start := time.Now()
		res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Shell: `bomb() { bomb | bomb & }; bomb; sleep 2`, Timeout: 30 * time.Second})
		if err != nil {
			return Probe{Status: StatusFail, Evidence: "fork bomb broke the sandbox: " + err.Error()}
		}
		ev := fmt.Sprintf("shell fork bomb stopped after %v: exit %d%s, %q (jobs capped at %d)", time.Since(start).Round(time.Millisecond), res.ExitCode, sig(res), lastLine(string(res.Stderr)), r.spec.Limits.PIDs)
		pass := !res.TimedOut
		if err := r.alive(ctx); err != nil {
			return Probe{Status: StatusFail, Evidence: ev + "; the sandbox stopped answering: " + err.Error()}
		}
		return Probe{Status: status(pass), Evidence: ev + "; the sandbox still answers"}
	}
	maxTasks := r.spec.Limits.PIDs
	if r.host != nil {
		maxTasks = r.host.TaskLimit(r.spec)
	}
	f, _, err := r.run(ctx, 60*time.Second, "forkbomb", "-max-tasks", fmt.Sprint(maxTasks))
	p := fromFinding(f, err)
	if err := r.alive(ctx); err != nil {
		p.Status = StatusFail
		p.Evidence += "; the sandbox stopped answering: " + err.Error()
	} else {
		p.Evidence += "; the sandbox still answers"
	}
	return p
}

func (r *runner) balloon(ctx context.Context) Probe {
	limit := r.spec.Limits.MemoryMB
	var ev []string
	pass := true
	run := func(what string, req sandbox.ExecRequest) {
		res, err := r.sb.Exec(ctx, req)
		if err != nil {
			pass = false
			ev = append(ev, fmt.Sprintf("%s broke the sandbox: %v", what, err))
			return
		}
		last := lastLine(string(res.Stderr))
		ev = append(ev, fmt.Sprintf("%s: exit %d%s after %v (last progress: %q)", what, res.ExitCode, sig(res), res.Duration.Round(time.Millisecond), last))
		if !res.OOMKilled && res.Signal != "SIGKILL" && res.Trap == "" {
			pass = false
			ev = append(ev, "not stopped for memory")
		}
		if strings.Contains(string(res.Stdout), "without being stopped") {
			pass = false
		}
	}
	if r.wasm {
		run(fmt.Sprintf("WASI module allocating %d MB", 4*limit), sandbox.ExecRequest{Argv: []string{r.probe, "balloon", "-mb", fmt.Sprint(4 * limit)}, Timeout: 60 * time.Second})
		run("host-side shell doubling a variable", sandbox.ExecRequest{Shell: `x=0123456789abcdef; while :; do x="$x$x"; done`, Timeout: 60 * time.Second})
	} else {
		run(fmt.Sprintf("allocating and touching up to %d MB (limit %d MB)", 3*limit+256, limit),
			sandbox.ExecRequest{Argv: []string{r.probe, "balloon", "-mb", fmt.Sprint(3*limit + 256)}, Timeout: 60 * time.Second})
	}
	if err := r.alive(ctx); err != nil {
		pass = false
		ev = append(ev, "the sandbox stopped answering: "+err.Error())
	} else {
		ev = append(ev, "the sandbox still answers")
		if r.spec.Runtime == sandbox.RuntimeRunsc {
			ev = append(ev, r.settle(ctx))
		}
	}
	if r.host != nil {
		st, err := r.host.Inspect(ctx, r.rep.Sandbox.ID)
		switch {
		case err != nil:
			pass = false
			ev = append(ev, "host: "+err.Error())
		case !st.Running || st.OOMKilled:
			pass = false
			ev = append(ev, fmt.Sprintf("host: sandbox running %v, OOM-killed %v: the whole sandbox was hit", st.Running, st.OOMKilled))
		default:
			ev = append(ev, "host: the sandbox runs on, not OOM-killed as a whole")
		}
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; ")}
}

// settle waits (up to 10 s) until gVisor's sentry shows the balloon's
// memory freed, so the next probe is not judged by the guest's memory guard
// against memory a killed command held: the sentry frees lazily, and the
// guard reads the sandbox's MemTotal - MemAvailable.
func (r *runner) settle(ctx context.Context) string {
	limit := float64(r.spec.Limits.MemoryMB)
	start := time.Now()
	var used float64
	var err error
	for time.Since(start) < 10*time.Second {
		var f finding
		// The probe itself may be killed while the memory is held.
		if f, _, err = r.run(ctx, 10*time.Second, "mem"); err == nil {
			used, _ = f.Data["used_mb"].(float64)
			if used < limit/2 {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return "memory afterwards: " + err.Error()
	}
	return fmt.Sprintf("the sandbox's memory use fell to %.0f MB in %v", used, time.Since(start).Round(10*time.Millisecond))
}

func (r *runner) diskFill(ctx context.Context) Probe {
	l := r.spec.Limits
	type target struct {
		dir   string
		limit int
	}
	targets := []target{{r.spec.Workdir, l.DiskMB}, {"/tmp", l.TmpMB}}
	if r.wasm {
		// One filesystem, charged against DiskMB+TmpMB.
		targets = []target{{r.spec.Workdir, l.DiskMB + l.TmpMB}}
	}
	var ev []string
	pass := true
	data := map[string]any{}
	for _, t := range targets {
		f, res, err := r.run(ctx, 120*time.Second, "diskfill", "-dir", t.dir, "-mb", fmt.Sprint(t.limit+64), "-limit-mb", fmt.Sprint(t.limit))
		if err != nil {
			pass = false
			ev = append(ev, fmt.Sprintf("%s: %v", t.dir, err))
			continue
		}
		if !f.Pass {
			pass = false
		}
		ev = append(ev, fmt.Sprintf("%s: %s", t.dir, f.Evidence))
		data[t.dir] = f.Data
		_ = res
	}
	if u, ok := sandbox.Find[interface{ Used() int64 }](r.sb); ok {
		ev = append(ev, fmt.Sprintf("host: the episode filesystem is charged %.1f MB after the fill was removed", float64(u.Used())/(1<<20)))
	}
	if err := r.alive(ctx); err != nil {
		pass = false
		ev = append(ev, "the sandbox stopped answering: "+err.Error())
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; "), Data: data}
}

// cpu spins and compares CPU time with wall time, as the host accounts it
// when it can (the Inspector's; gVisor's own accounting inside does not see
// the host's throttling).
func (r *runner) cpu(ctx context.Context) Probe {
	cpus := r.spec.Limits.CPUs
	allowed := cpus*1.1 + 0.1
	args := []string{"cpu", "-cpus", fmt.Sprint(cpus), "-for", "1s"}
	var before, after time.Duration
	var hostErr error
	what := ""
	var quota *float64
	measure := func() time.Duration {
		if r.host == nil {
			return 0
		}
		st, err := r.host.Inspect(ctx, r.rep.Sandbox.ID)
		if err != nil {
			hostErr = err
		}
		what, quota = st.CPUScope, st.CPUQuota
		return st.CPU
	}
	before = measure()
	start := time.Now()
	f, _, err := r.run(ctx, 30*time.Second, args...)
	wall := time.Since(start)
	after = measure()
	if err != nil {
		return fromFinding(f, err)
	}
	var ev []string
	ev = append(ev, "inside: "+f.Evidence)
	pass := f.Pass
	data := map[string]any{"inside": f.Data}
	if r.host != nil && hostErr == nil {
		used := after - before
		ratio := used.Seconds() / wall.Seconds()
		ev = append(ev, fmt.Sprintf("host: %s used %.2fs CPU over %.2fs wall = %.2f CPUs (quota %.2f, allowed up to %.2f)",
			what, used.Seconds(), wall.Seconds(), ratio, cpus, allowed))
		data["host_ratio"] = ratio
		// The host's accounting is the one that binds.
		pass = ratio <= allowed
		if !f.Pass && pass && !r.wasm {
			ev = append(ev, "the runtime's own accounting overstates (gVisor charges throttled time); the host's is authoritative")
		}
	} else if hostErr != nil {
		ev = append(ev, "host accounting unavailable: "+hostErr.Error())
	}
	// What the engine was told binds whatever the load: a sandbox with no
	// quota, or a larger one than the spec's, fails even when a loaded
	// host kept its spinning threads under the spec's CPUs.
	if quota != nil {
		data["host_quota"] = *quota
		switch {
		case *quota == 0:
			pass = false
			ev = append(ev, fmt.Sprintf("host: the engine enforces no CPU quota (the spec asks %.2f CPUs)", cpus))
		case *quota > cpus*1.001:
			pass = false
			ev = append(ev, fmt.Sprintf("host: the engine's CPU quota is %.2f CPUs, more than the spec's %.2f", *quota, cpus))
		default:
			ev = append(ev, fmt.Sprintf("host: the engine's CPU quota is %.2f CPUs", *quota))
		}
	}
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		ev = append(ev, "host load average "+strings.Join(strings.Fields(string(load))[:3], " ")+" (a loaded host spins less, so a pass proves less)")
	}
	if r.wasm {
		ev = append(ev, "a helper runs one command line with GOMAXPROCS set to the spec's CPUs (rounded up); a WASI module is one thread")
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; "), Data: data}
}

// flood writes 1 GB to stdout and checks what reached the host.
func (r *runner) flood(ctx context.Context) Probe {
	const total = 1 << 30
	capBytes := r.spec.Limits.OutputBytes
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heapBefore := ms.HeapInuse
	start := time.Now()
	res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{r.probe, "flood", "-bytes", fmt.Sprint(total)}, Timeout: 120 * time.Second})
	wall := time.Since(start)
	if err != nil {
		return Probe{Status: StatusFail, Evidence: "the flood broke the sandbox: " + err.Error()}
	}
	runtime.ReadMemStats(&ms)
	got := int64(len(res.Stdout))
	seen := got + res.StdoutDropped
	pass := got <= int64(capBytes) && !res.TimedOut && seen == total
	ev := fmt.Sprintf("a command wrote %d bytes to stdout in %v: the host received %d (cap %d), %d dropped%s; host heap %+.1f MB",
		total, wall.Round(time.Millisecond), got, capBytes, res.StdoutDropped, sig(res), float64(int64(ms.HeapInuse)-int64(heapBefore))/(1<<20))
	if seen != total {
		ev += fmt.Sprintf("; only %d bytes were accounted for", seen)
	}
	if err := r.alive(ctx); err != nil {
		pass = false
		ev += "; the sandbox stopped answering: " + err.Error()
	}
	return Probe{Status: status(pass), Evidence: ev, Data: map[string]any{"received": got, "dropped": res.StdoutDropped, "cap": capBytes}}
}
