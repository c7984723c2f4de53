package audit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// The probes of the attacks that reached the host through the WASM
// backend's former interpreter (host temp files and FIFOs chosen by
// $TMPDIR, a FIFO per process substitution blocking a host thread each,
// the memory guard bypassed by code built at run time, pwd -P and $$ as
// oracles of the host), run on every backend, and the checks of the
// processes a backend confines on the host (the WASM helpers).

// hostTree lists a host directory tree.
func hostTree(dir string) string {
	var out []string
	filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		out = append(out, p)
		return nil
	})
	return strings.Join(out, "\n")
}

// threads is this process's OS thread count (the WASM backend's host side
// runs in it).
func threads() int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return -1
	}
	return len(ents)
}

// tmpdirWrite asks the sandbox's shell to create temp files, FIFOs and
// files in a host directory named by $TMPDIR, and checks on the host that
// nothing appeared there.
func (r *runner) tmpdirWrite(ctx context.Context) Probe {
	dir, err := os.MkdirTemp("", "rollbox-audit-tmpdir-")
	if err != nil {
		return Probe{Status: StatusFail, Evidence: "host temp dir: " + err.Error()}
	}
	defer os.RemoveAll(dir)
	before := hostTree(dir)
	script := fmt.Sprintf(`export TMPDIR=%[1]s; cat <(echo pwned) >/dev/null; cat <<EOF >/dev/null
here-document
EOF
env TMPDIR=%[1]s sh -c 'cat <(echo x) > /dev/null; echo pwned > %[1]s/file'; mkdir %[1]s/d; mkfifo %[1]s/fifo; exec 3>%[1]s/fd3; echo x >&3; echo done`, dir)
	res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Shell: script, Timeout: 30 * time.Second})
	if err != nil {
		return Probe{Status: StatusFail, Evidence: "the sandbox broke: " + err.Error()}
	}
	after := hostTree(dir)
	ev := fmt.Sprintf("TMPDIR=%s, process substitution, a here-document, sh -c, mkdir, mkfifo and a redirection into it: exit %d, %q", dir, res.ExitCode, lastLine(string(res.Stderr)))
	if after != before {
		return Probe{Status: StatusFail, Evidence: ev + "; the host directory CHANGED: " + after}
	}
	return Probe{Status: StatusPass, Evidence: ev + "; the host directory is unchanged"}
}

// fifoThreads runs thousands of process substitutions (each was a host FIFO
// blocking a host thread) and checks the host's threads and temp dir.
func (r *runner) fifoThreads(ctx context.Context) Probe {
	tmp := os.TempDir()
	// The former interpreter's FIFOs lived in sh-interp-* directories of
	// the host's temp dir: compare those names as sets (a walk of a busy
	// host's whole /tmp compared line by line was quadratic).
	interp := func() map[string]bool {
		names, _ := filepath.Glob(filepath.Join(tmp, "sh-interp*"))
		set := make(map[string]bool, len(names))
		for _, n := range names {
			set[n] = true
		}
		return set
	}
	// 2,000 where the substitutions run in this host's processes (the
	// WASM backend's interpreter and helpers): a leak of one thread in 30
	// outgrows the slack below. A container runs them in its own kernel
	// view (or gVisor's: 2,000 took 60 s on a loaded host), where 300
	// show that the sandbox survives them and nothing reaches this process.
	n := 300
	if r.wasm {
		n = 2000
	}
	before, t0 := interp(), threads()
	start := time.Now()
	res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Shell: fmt.Sprintf(`n=0; for i in $(seq %d); do eval 'cat <(echo hi) >/dev/null' && n=$((n+1)); done; echo $n`, n), Timeout: 120 * time.Second})
	if err != nil {
		return Probe{Status: StatusFail, Evidence: "the sandbox broke: " + err.Error()}
	}
	t1 := threads()
	ev := []string{fmt.Sprintf("%d process substitutions through eval: exit %d, stdout %q in %v", n, res.ExitCode, strings.TrimSpace(string(res.Stdout)), time.Since(start).Round(time.Millisecond))}
	pass := true
	// The WASM backend keeps one thread per live helper (waiting for it):
	// bounded by its helpers, not by what a script does.
	slack := 64
	if t1 > t0+slack {
		pass = false
		ev = append(ev, fmt.Sprintf("host threads grew from %d to %d", t0, t1))
	} else {
		ev = append(ev, fmt.Sprintf("host threads %d -> %d", t0, t1))
	}
	var leftovers []string
	for n := range interp() {
		if !before[n] {
			leftovers = append(leftovers, n)
		}
	}
	sort.Strings(leftovers)
	if len(leftovers) > 0 {
		pass = false
		ev = append(ev, "host FIFOs left: "+strings.Join(leftovers, ", "))
	}
	if err := r.alive(ctx); err != nil {
		pass = false
		ev = append(ev, "the sandbox stopped answering: "+err.Error())
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; ")}
}

// memoryBypass grows a variable without bound through code built at run
// time (eval, sh -c, a trap, a function, source): each must stop at the
// memory limit, hurting only its command.
//
// On the WASM backend each is a path of the host-side interpreter that must
// charge the memory itself (one bypassed the former interpreter's guard).
// In a container the memory limit is the kernel's cgroup (or gVisor's
// sentry's), charged for every page of every process whatever code grew it:
// a trap, a function and a sourced file grow the command's own shell as
// eval does, so a container runs eval (the command's shell killed) and
// sh -c (a process it started killed, its shell answering): each case took
// 4 to 35 s of a shell copying bytes on a 2-core host at loads of 8 to 15.
func (r *runner) memoryBypass(ctx context.Context) Probe {
	grow := `x=0123456789abcdef; while :; do x="$x$x"; done`
	cases := []struct{ what, shell string }{
		{"eval", "eval '" + grow + "'"},
		{"sh -c", "sh -c '" + grow + "'"},
	}
	if r.wasm {
		cases = append(cases, []struct{ what, shell string }{
			{"a trap", "trap '" + grow + "' EXIT"},
			{"a function", "f() { " + grow + "; }; f"},
			{"a sourced file", "echo '" + grow + "' > /tmp/.rollbox-grow; . /tmp/.rollbox-grow"},
			// The path that bypassed the former interpreter's guard (a
			// container image's sh may have no process substitution).
			{"eval of process substitution", "eval 'cat <(" + grow + ")'"},
		}...)
	}
	pass := true
	var ev []string
	for _, c := range cases {
		start := time.Now()
		// A grow that reaches its timeout fails: 120 s, four times the
		// slowest seen (a WASM case at a load of 17).
		res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Shell: c.shell, Timeout: 120 * time.Second})
		switch {
		case err != nil && !sandbox.IsAbuse(err):
			pass = false
			ev = append(ev, fmt.Sprintf("%s broke the sandbox: %v", c.what, err))
		case err != nil:
			// Its helper died of its memory limit: contained, and
			// scored as the agent's doing.
			ev = append(ev, fmt.Sprintf("%s: its helper was killed (%v)", c.what, err))
		case res.TimedOut || !res.OOMKilled && res.Signal != "SIGKILL" && res.ExitCode != 137:
			// A command killed at its timeout grew on without a limit
			// (its exit is 137 too).
			pass = false
			ev = append(ev, fmt.Sprintf("%s: exit %d%s, not stopped for memory", c.what, res.ExitCode, sig(res)))
		default:
			ev = append(ev, fmt.Sprintf("%s: exit %d%s in %v", c.what, res.ExitCode, sig(res), time.Since(start).Round(time.Millisecond)))
		}
	}
	if r.spec.Runtime == sandbox.RuntimeRunsc {
		// gVisor's sentry frees a killed shell's memory late: a ping at
		// once was itself killed by the guest's memory guard.
		ev = append(ev, r.settle(ctx))
	}
	if err := r.alive(ctx); err != nil {
		pass = false
		ev = append(ev, "the sandbox stopped answering: "+err.Error())
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; ")}
}

// pathOracle asks for host facts a shell could leak: pwd -P through
// /proc/self/exe, realpath, $$ and $PPID.
func (r *runner) pathOracle(ctx context.Context) Probe {
	res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Shell: `PWD=/proc/self/exe pwd -P; cd -P /proc/self 2>&1; pwd -P; readlink -f /proc/self/exe; realpath /proc/self/exe 2>&1; echo "pid $$ ppid $PPID"`, Timeout: 30 * time.Second})
	if err != nil {
		return Probe{Status: StatusFail, Evidence: "the sandbox broke: " + err.Error()}
	}
	out := string(res.Stdout) + string(res.Stderr)
	var leaks []string
	if exe, err := os.Executable(); err == nil && strings.Contains(out, exe) {
		leaks = append(leaks, "the host executable's path "+exe)
	}
	if r.host != nil {
		for _, f := range r.host.HostFiles() {
			if strings.Contains(out, f) {
				leaks = append(leaks, "the host file "+f)
			}
		}
	}
	pid := strconv.Itoa(os.Getpid())
	for _, f := range strings.Fields(out) {
		if f == pid {
			leaks = append(leaks, "this process's pid "+pid)
		}
	}
	ev := "pwd -P with PWD=/proc/self/exe, cd -P, readlink -f, realpath, $$/$PPID: " + oneLine(out, 200)
	if len(leaks) > 0 {
		return Probe{Status: StatusFail, Evidence: ev + "; LEAKED " + strings.Join(leaks, ", ")}
	}
	return Probe{Status: StatusPass, Evidence: ev + "; nothing of the host"}
}

// confined judges a probe by the checks of a confined host process (the
// WASM helpers'): each named check must be OK.
func (r *runner) confined(ctx context.Context, names ...string) Probe {
	checks, err := r.confinement(ctx)
	if err != nil {
		return Probe{Status: StatusFail, Evidence: "the helper's self-test: " + err.Error()}
	}
	pass := true
	var ev []string
	for _, n := range names {
		found := false
		for _, c := range checks {
			if c.Name != n {
				continue
			}
			found = true
			verdict := "refused"
			if !c.OK {
				verdict = "NOT REFUSED"
				pass = false
			}
			if strings.HasPrefix(n, "read the allowed") || n == "no_new_privs" || n == "seccomp filter" || n == "no capabilities" || n == "rlimits" || strings.HasPrefix(n, "landlock") || strings.HasPrefix(n, "cgroup") || strings.HasPrefix(n, "no file may grow") {
				verdict = "in force"
				if !c.OK {
					verdict = "MISSING"
				}
			}
			d := c.Detail
			if d != "" {
				d = " (" + oneLine(d, 80) + ")"
			}
			ev = append(ev, n+": "+verdict+d)
		}
		if !found {
			pass = false
			ev = append(ev, n+": no such check")
		}
	}
	return Probe{Status: status(pass), Evidence: "a helper process confined as the WASM backend's are: " + strings.Join(ev, "; ")}
}

func (r *runner) confinement(ctx context.Context) ([]sandbox.ConfinementCheck, error) {
	if r.checks != nil || r.checksErr != nil {
		return r.checks, r.checksErr
	}
	if r.confiner == nil {
		r.checksErr = fmt.Errorf("the backend confines no host process")
		return nil, r.checksErr
	}
	r.checks, r.checksErr = r.confiner.ConfinementChecks(ctx)
	return r.checks, r.checksErr
}

// kernelOrConfined is a container probe of the probe program on container
// backends, and on WASM the helper's checks named.
func (r *runner) kernelOrConfined(name string, checks ...string) func(context.Context) Probe {
	return func(ctx context.Context) Probe {
		if r.wasm {
			return r.confined(ctx, checks...)
		}
		return r.simple(name)(ctx)
	}
}

// hostFS is, on WASM, the helper's view of the host filesystem (Landlock
// and seccomp); containers have their own root (the mounts probe).
func (r *runner) hostFS(ctx context.Context) Probe {
	if !r.wasm {
		return Probe{Status: StatusNA, Evidence: "a container has its own root filesystem: the mounts probe lists what of the host is in it"}
	}
	return r.confined(ctx, "write a host file", "create a host directory", "make a host FIFO", "read a host file (/etc/passwd)",
		"list the host's root", "resolve a host path (/proc/self/exe)", "look up a host path (stat /etc/passwd)",
		"read the allowed directory", "no file may grow (RLIMIT_FSIZE 0)", "cgroup (memory and pids)")
}
