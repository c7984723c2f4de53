package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// Schema names the report format.
const Schema = "rollbox.audit/v1"

// Probe outcomes.
const (
	StatusPass = "pass"
	StatusFail = "fail"
	// StatusNA: the probe has no meaning for this backend (a WASI module
	// has no capabilities to drop); the evidence says why.
	StatusNA = "n/a"
)

// Probe is one line of the report.
type Probe struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	// Pass is Status == "pass".
	Pass bool `json:"pass"`
	// Evidence says what was tried and what happened.
	Evidence string         `json:"evidence"`
	Data     map[string]any `json:"data,omitempty"`
	// DurationMS is how long the probe took.
	DurationMS int64 `json:"duration_ms"`
}

// Report is the whole audit.
type Report struct {
	Schema  string       `json:"schema"`
	Backend string       `json:"backend"`
	Spec    sandbox.Spec `json:"spec"`
	// Loosened lists every way the audited sandbox is less isolated than the
	// hardened default: the spec's own (Spec.Loosened) and the backend's
	// (docker.Unsafe). Empty means fully hardened.
	Loosened []string     `json:"loosened"`
	Sandbox  sandbox.Info `json:"sandbox"`
	Probes   []Probe      `json:"probes"`
	Passed   int          `json:"passed"`
	Failed   int          `json:"failed"`
	NA       int          `json:"not_applicable"`
	// Pass is true when no probe failed.
	Pass      bool      `json:"pass"`
	StartedAt time.Time `json:"started_at"`
	DurationS float64   `json:"duration_s"`
}

// Options configure Run.
type Options struct {
	// ProbeLinux is the host path of the static linux/amd64 probe program
	// (images/probe); needed for container backends.
	ProbeLinux string
	// ProbeWASI is the host path of the wasip1 build of images/probe;
	// needed for the WASM backend.
	ProbeWASI string
	// HostBinaries are host files whose content no sandbox may change (the
	// runtime binaries, the guest agent). Default: HostBinaries(backend).
	HostBinaries []string
	// Only, when set, runs just the probes named (tests).
	Only []string
	// Progress gets one line per probe as it ends.
	Progress io.Writer
}

// GuestThreads is the headroom the docker backend gives the guest agent's
// own threads above the spec's pids limit (docker.guestThreads).
const GuestThreads = 32

// Run creates a sandbox from spec on backend, runs every probe against it,
// closes it and returns the report. An error means the audit itself could
// not run (no engine, no probe program); a probe that fails is in the
// report.
func Run(ctx context.Context, backend sandbox.Backend, spec sandbox.Spec, opts Options) (*Report, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	full := spec.WithDefaults()
	rep := &Report{Schema: Schema, Backend: backend.Name(), Spec: full, Loosened: spec.Loosened(), StartedAt: time.Now().UTC()}
	if l, ok := backend.(interface{ Loosened() []string }); ok {
		rep.Loosened = append(rep.Loosened, l.Loosened()...)
	}
	if rep.Loosened == nil {
		rep.Loosened = []string{}
	}
	wasm := backend.Name() == "wasm"
	probePath, sandboxProbe := opts.ProbeLinux, "/tmp/.rollbox-probe"
	if wasm {
		probePath, sandboxProbe = opts.ProbeWASI, "/tmp/rollbox-probe.wasm"
	}
	if probePath == "" {
		return nil, fmt.Errorf("audit: no probe program for the %s backend", backend.Name())
	}
	probeBin, err := os.ReadFile(probePath)
	if err != nil {
		return nil, fmt.Errorf("audit: probe program: %w", err)
	}
	dockerBackend := dockerOf(backend)
	if opts.HostBinaries == nil {
		opts.HostBinaries = HostBinaries(backend.Name())
		if dockerBackend != nil {
			opts.HostBinaries = append(opts.HostBinaries, dockerBackend.GuestPath())
		}
	}
	before := hashFiles(opts.HostBinaries)

	sb, err := backend.Create(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("audit: create the sandbox: %w", err)
	}
	defer sb.Close()
	rep.Sandbox = sb.Info()
	if err := sb.WriteFile(ctx, sandboxProbe, probeBin, 0o755); err != nil {
		return nil, fmt.Errorf("audit: copy the probe into the sandbox: %w", err)
	}
	r := &runner{sb: sb, spec: full, probe: sandboxProbe, rep: rep, opts: opts, wasm: wasm, docker: dockerBackend}
	for _, p := range r.plan() {
		if len(opts.Only) > 0 && !contains(opts.Only, p.name) {
			continue
		}
		start := time.Now()
		pr := p.run(ctx)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		pr.Name = p.name
		pr.DurationMS = time.Since(start).Milliseconds()
		r.add(pr)
	}
	if len(opts.Only) == 0 || contains(opts.Only, "proc-self-exe") {
		// The hashes are compared once every probe has run.
		r.judgeBinaries(before)
	}
	for _, p := range rep.Probes {
		switch p.Status {
		case StatusPass:
			rep.Passed++
		case StatusFail:
			rep.Failed++
		default:
			rep.NA++
		}
	}
	rep.Pass = rep.Failed == 0
	rep.DurationS = time.Since(rep.StartedAt).Seconds()
	return rep, nil
}

// dockerOf finds the docker backend under wrappers (an audit log, a
// lease), or nil.
func dockerOf(b sandbox.Backend) *docker.Backend {
	for {
		if d, ok := b.(*docker.Backend); ok {
			return d
		}
		u, ok := b.(interface{ Unwrap() sandbox.Backend })
		if !ok {
			return nil
		}
		b = u.Unwrap()
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Names lists the probes in the order they run.
func Names() []string {
	r := &runner{}
	var out []string
	for _, p := range r.plan() {
		out = append(out, p.name)
	}
	return out
}

// HostBinaries finds the runtime binaries a container escape of the
// CVE-2019-5736 class would overwrite (runc, runsc, the containerd shims,
// docker-init) in PATH, or for the WASM backend the running executable,
// which is its runtime.
func HostBinaries(backend string) []string {
	if backend == "wasm" {
		if exe, err := os.Executable(); err == nil {
			return []string{exe}
		}
		return nil
	}
	seen := map[string]bool{}
	var out []string
	addPath := func(p string) {
		if r, err := filepath.EvalSymlinks(p); err == nil && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	for _, name := range []string{"runc", "runsc", "docker-init", "containerd-shim"} {
		if p, err := exec.LookPath(name); err == nil {
			addPath(p)
		}
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		matches, _ := filepath.Glob(filepath.Join(dir, "containerd-shim*"))
		for _, m := range matches {
			addPath(m)
		}
	}
	sort.Strings(out)
	return out
}

func hashFiles(paths []string) map[string]string {
	out := map[string]string{}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			out[p] = "error: " + err.Error()
			continue
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			out[p] = "error: " + err.Error()
			continue
		}
		out[p] = hex.EncodeToString(h.Sum(nil))
	}
	return out
}

// runner runs the probes against one sandbox.
type runner struct {
	sb     sandbox.Sandbox
	spec   sandbox.Spec
	probe  string
	rep    *Report
	opts   Options
	wasm   bool
	docker *docker.Backend

	exeEvidence string // the in-sandbox half of proc-self-exe
	exePass     bool
}

type planned struct {
	name string
	run  func(ctx context.Context) Probe
}

func (r *runner) plan() []planned {
	return []planned{
		{"runtime-identity", r.identity},
		{"network-egress", r.simple("net-egress")},
		{"network-gateway", r.gateway},
		{"network-metadata", r.linuxOnly("net-metadata", "a WASI module has no sockets: the network-egress probe covers the metadata address")},
		{"network-dns", r.linuxOnly("net-dns", "a WASI module has no sockets: the network-egress probe's lookup covers DNS")},
		{"capabilities", r.linuxOnly("caps", wasmNoKernel)},
		{"seccomp", r.linuxOnly("seccomp", wasmNoKernel)},
		{"no-new-privileges", r.linuxOnly("no-new-privs", wasmNoKernel)},
		{"mounts", r.mounts},
		{"proc-sys-writes", r.linuxOnly("proc-sys", "there is no /proc or /sys in the episode's filesystem (the mounts probe lists what is)")},
		{"escape-syscalls", r.linuxOnly("syscalls", wasmNoKernel)},
		{"guest-isolation", r.guest},
		{"copy-out-symlink", r.copyOut},
		{"fork-bomb", r.forkBomb},
		{"memory-balloon", r.balloon},
		{"disk-fill", r.diskFill},
		{"cpu-quota", r.cpu},
		{"output-flood", r.flood},
		{"proc-self-exe", r.exe},
	}
}

const wasmNoKernel = "no kernel interface to probe: a WASI preview 1 module calls only WASI functions (the episode's in-memory files, clocks, random, stdio), and the shell runs in the host process on an interpreter confined to that filesystem (see SECURITY.md)"

func (r *runner) add(p Probe) {
	p.Pass = p.Status == StatusPass
	r.rep.Probes = append(r.rep.Probes, p)
	if r.opts.Progress != nil && p.Status != statusPending {
		fmt.Fprintf(r.opts.Progress, "rollbox audit: %-18s %-4s %s\n", p.Name, p.Status, oneLine(p.Evidence, 160))
	}
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func status(pass bool) string {
	if pass {
		return StatusPass
	}
	return StatusFail
}

// finding is what the probe program prints.
type finding struct {
	Name     string         `json:"name"`
	Pass     bool           `json:"pass"`
	Evidence string         `json:"evidence"`
	Data     map[string]any `json:"data"`
}

// run runs the probe program inside the sandbox.
func (r *runner) run(ctx context.Context, timeout time.Duration, args ...string) (finding, sandbox.Result, error) {
	res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Argv: append([]string{r.probe}, args...), Timeout: timeout})
	if err != nil {
		return finding{}, res, err
	}
	out := strings.TrimSpace(string(res.Stdout))
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	var f finding
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		return finding{}, res, fmt.Errorf("probe %s printed no finding (exit %d%s): stdout %q, stderr %q",
			args[0], res.ExitCode, sig(res), oneLine(string(res.Stdout), 200), oneLine(string(res.Stderr), 300))
	}
	return f, res, nil
}

func sig(res sandbox.Result) string {
	s := ""
	if res.Signal != "" {
		s += ", " + res.Signal
	}
	if res.OOMKilled {
		s += ", OOM-killed"
	}
	if res.TimedOut {
		s += ", timed out"
	}
	if res.Trap != "" {
		s += ", trap: " + res.Trap
	}
	return s
}

// fromFinding turns the probe's own verdict into a report line.
func fromFinding(f finding, err error) Probe {
	if err != nil {
		return Probe{Status: StatusFail, Evidence: err.Error()}
	}
	return Probe{Status: status(f.Pass), Evidence: f.Evidence, Data: f.Data}
}

// simple runs a probe whose verdict the program gives.
func (r *runner) simple(name string, args ...string) func(context.Context) Probe {
	return func(ctx context.Context) Probe {
		f, _, err := r.run(ctx, 30*time.Second, append([]string{name}, args...)...)
		return fromFinding(f, err)
	}
}

// linuxOnly is simple on containers and not applicable on WASM.
func (r *runner) linuxOnly(name, why string) func(context.Context) Probe {
	return func(ctx context.Context) Probe {
		if r.wasm {
			return Probe{Status: StatusNA, Evidence: why}
		}
		args := []string{name}
		if name == "mounts" {
			args = append(args, "-dir", r.spec.Workdir)
		}
		return r.simple(args[0], args[1:]...)(ctx)
	}
}

// alive checks that the sandbox still answers: destructive probes must
// hurt only the command that ran them.
func (r *runner) alive(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	f, res, err := r.run(ctx, 30*time.Second, "ping")
	if err != nil {
		return err
	}
	if f.Name != "ping" || !f.Pass {
		return fmt.Errorf("ping answered %q", oneLine(string(res.Stdout), 200))
	}
	return nil
}

func (r *runner) identity(ctx context.Context) Probe {
	f, _, err := r.run(ctx, 30*time.Second, "identity")
	if err != nil {
		return fromFinding(f, err)
	}
	kernel, _ := f.Data["kernel"].(string)
	ev := []string{f.Evidence}
	data := map[string]any{"kernel": kernel}
	pass := true
	switch {
	case r.wasm:
		pass = kernel == "wasi"
		ev = append(ev, "backend wasm: wazero runs the module in this process")
	default:
		want := map[string]string{sandbox.RuntimeRunc: "linux", sandbox.RuntimeRunsc: "gvisor"}[r.spec.Runtime]
		if kernel != want {
			pass = false
			ev = append(ev, fmt.Sprintf("runtime %s should answer as %s, answered as %s", r.spec.Runtime, want, kernel))
		}
		if r.docker != nil {
			st, err := r.docker.State(ctx, r.rep.Sandbox.ID)
			if err != nil {
				pass = false
				ev = append(ev, "engine: "+err.Error())
			} else {
				ev = append(ev, fmt.Sprintf("engine: container runtime %q", st.Runtime))
				data["engine_runtime"] = st.Runtime
				if st.Runtime != r.spec.Runtime {
					pass = false
				}
			}
		}
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; "), Data: data}
}

// gateway listens on the host's bridge address and asks the sandbox to
// reach it and its default gateway.
func (r *runner) gateway(ctx context.Context) Probe {
	if r.wasm {
		return Probe{Status: StatusNA, Evidence: "a WASI module has no sockets: the network-egress probe shows dialing fails"}
	}
	var args []string
	var hostEv []string
	var accepted []string
	var mu sync.Mutex
	if r.docker != nil {
		if gw, err := r.docker.BridgeGateway(ctx); err != nil {
			hostEv = append(hostEv, "no bridge gateway: "+err.Error())
		} else if ln, err := net.Listen("tcp", net.JoinHostPort(gw, "0")); err != nil {
			hostEv = append(hostEv, fmt.Sprintf("cannot listen on the bridge gateway %s: %v", gw, err))
		} else {
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					accepted = append(accepted, c.RemoteAddr().String())
					mu.Unlock()
					c.Close()
				}
			}()
			args = append(args, "-gateways", ln.Addr().String())
			hostEv = append(hostEv, "host listening on "+ln.Addr().String())
		}
	}
	f, _, err := r.run(ctx, 30*time.Second, append([]string{"net-gateway"}, args...)...)
	p := fromFinding(f, err)
	time.Sleep(50 * time.Millisecond) // let the accept loop see a late connection
	mu.Lock()
	if len(accepted) > 0 {
		p.Status = StatusFail
		hostEv = append(hostEv, fmt.Sprintf("the host listener accepted connections from %v", accepted))
	}
	mu.Unlock()
	p.Evidence = strings.Join(append([]string{p.Evidence}, hostEv...), "; ")
	return p
}

func (r *runner) mounts(ctx context.Context) Probe {
	if r.wasm {
		f, _, err := r.run(ctx, 30*time.Second, "files")
		return fromFinding(f, err)
	}
	return r.simple("mounts", "-dir", r.spec.Workdir)(ctx)
}

// guest checks that a command cannot reach the guest agent, cannot kill
// it, and that replies it forges are not believed.
func (r *runner) guest(ctx context.Context) Probe {
	if r.wasm {
		return Probe{Status: StatusNA, Evidence: "no guest agent: commands run in this process's interpreter or as WASI modules, which have no processes, signals or /proc to reach the host's runtime through"}
	}
	f, res, err := r.run(ctx, 30*time.Second, "guest", "-forge")
	var ev []string
	pass := true
	switch {
	case strings.Contains(string(res.Stdout), forgedMarker):
		pass = false
		ev = append(ev, "the host believed a reply forged by the command (its stdout is the forged one)")
	case err != nil:
		pass = false
		ev = append(ev, err.Error())
	default:
		// What must hold on every runtime: no ptrace, no memory, no
		// forged reply believed, and the guest survives (below). The
		// stream itself is reachable under gVisor, whose /proc ignores the
		// guest's non-dumpable flag: replies are sealed, so a command can
		// garble the stream (failing its own sandbox) but not forge.
		reach, _ := f.Data["reachable"].(map[string]any)
		pass = reach["ptrace"] == nil && reach["/proc/1/mem"] == nil && reach["/proc/1/root/."] == nil
		ev = append(ev, f.Evidence)
		if reach["/proc/1/fd/1"] != nil || reach["/proc/1/fd/0"] != nil {
			ev = append(ev, "WARNING: the guest's stream is reachable from a command (gVisor's /proc does not honour the guest's non-dumpable flag); replies are sealed with a per-sandbox key, so the forged ones were dropped, but a command can garble the stream and fail its own sandbox")
		}
	}
	if err := r.alive(ctx); err != nil {
		pass = false
		ev = append(ev, "the guest did not survive: "+err.Error())
	} else {
		ev = append(ev, "the guest still answers")
	}
	// A forged reply for a later request would show here.
	res2, err := r.sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{r.probe, "ping"}})
	if err == nil && strings.Contains(string(res2.Stdout), forgedMarker) {
		pass = false
		ev = append(ev, "a later request got a forged reply")
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; "), Data: f.Data}
}

// forgedMarker is what the probe program's forged replies print.
const forgedMarker = "ROLLBOX-PROBE-FORGED-REPLY"

// copyOut plants symlinks to host paths in the workdir and reads them back
// through the sandbox's file API, as an episode's copy-out would, while a
// command swaps a directory and a symlink underneath (CVE-2018-15664).
func (r *runner) copyOut(ctx context.Context) Probe {
	wd := r.spec.Workdir
	links := []struct{ name, target string }{
		{"leak-shadow", "/etc/shadow"}, {"leak-root", "/"}, {"leak-relative", "../../../../../../../../etc/hostname"},
		{"leak-proc", "/proc/1/root/etc/shadow"}, {"leak-self", "/proc/self/root/etc/passwd"},
	}
	var ev []string
	if r.wasm {
		var sh strings.Builder
		for _, l := range links {
			fmt.Fprintf(&sh, "ln -s %s %s/%s; ", l.target, wd, l.name)
		}
		res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Shell: sh.String()})
		if err != nil {
			return Probe{Status: StatusFail, Evidence: "planting symlinks: " + err.Error()}
		}
		ev = append(ev, fmt.Sprintf("planted %d symlinks with ln -s (exit %d)", len(links), res.ExitCode))
	} else {
		f, _, err := r.run(ctx, 30*time.Second, "plant", "-dir", wd)
		if err != nil {
			return Probe{Status: StatusFail, Evidence: "planting symlinks: " + err.Error()}
		}
		ev = append(ev, "planted: "+f.Evidence)
	}
	pass := true
	leaked := func(host string, got []byte) bool {
		want, err := os.ReadFile(host)
		return err == nil && len(want) > 0 && string(want) == string(got)
	}
	reads := []struct{ path, host string }{
		{wd + "/leak-shadow", "/etc/shadow"}, {wd + "/leak-root/etc/shadow", "/etc/shadow"},
		{wd + "/leak-root/etc/hostname", "/etc/hostname"}, {wd + "/leak-relative", "/etc/hostname"},
		{wd + "/leak-proc", "/etc/shadow"}, {wd + "/leak-self", "/etc/passwd"},
	}
	refusedN := 0
	for _, rd := range reads {
		data, err := r.sb.ReadFile(ctx, rd.path, 1<<20)
		switch {
		case err != nil:
			refusedN++
			ev = append(ev, fmt.Sprintf("ReadFile %s: %s", rd.path, errKind(err)))
		case leaked(rd.host, data):
			pass = false
			ev = append(ev, fmt.Sprintf("ReadFile %s returned the host's %s", rd.path, rd.host))
		default:
			ev = append(ev, fmt.Sprintf("ReadFile %s: %d bytes of the sandbox's own file, not the host's", rd.path, len(data)))
		}
	}
	if list, err := r.sb.ListFiles(ctx, wd+"/leak-root"); err != nil {
		ev = append(ev, fmt.Sprintf("ListFiles %s/leak-root: %s", wd, errKind(err)))
	} else if sameNames(list, "/") {
		pass = false
		ev = append(ev, fmt.Sprintf("ListFiles %s/leak-root listed the host's /", wd))
	} else {
		ev = append(ev, fmt.Sprintf("ListFiles %s/leak-root: %d entries of the sandbox's own root", wd, len(list)))
	}
	if !r.wasm {
		p, e := r.race(ctx)
		pass = pass && p
		ev = append(ev, e)
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; "), Data: map[string]any{"refused": refusedN, "reads": len(reads)}}
}

// race reads through a path whose directory a command keeps swapping with
// a symlink to /.
func (r *runner) race(ctx context.Context) (bool, string) {
	wd := r.spec.Workdir
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := r.sb.Exec(rctx, sandbox.ExecRequest{Argv: []string{r.probe, "swap", "-dir", wd, "-for", "1700ms"}})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	want, _ := os.ReadFile("/etc/hostname")
	reads, inside, leaks := 0, 0, 0
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		data, err := r.sb.ReadFile(ctx, wd+"/race/etc/hostname", 1<<16)
		reads++
		if err == nil {
			if len(want) > 0 && string(data) == string(want) {
				leaks++
			} else {
				inside++
			}
		}
	}
	<-done
	if leaks > 0 {
		return false, fmt.Sprintf("race: %d of %d reads of %s/race/etc/hostname, while a command swapped race with a symlink to /, returned the host's /etc/hostname", leaks, reads, wd)
	}
	return true, fmt.Sprintf("race: %d reads of %s/race/etc/hostname while a command swapped race with a symlink to /: %d got the sandbox's file, the rest were refused, none the host's", reads, wd, inside)
}

func sameNames(list []sandbox.FileInfo, hostDir string) bool {
	entries, err := os.ReadDir(hostDir)
	if err != nil || len(entries) != len(list) {
		return false
	}
	for i, e := range entries {
		if list[i].Name != e.Name() {
			return false
		}
	}
	return true
}

func errKind(err error) string {
	for _, k := range []error{sandbox.ErrPathEscape, sandbox.ErrNotFound, sandbox.ErrInvalidSpec, sandbox.ErrTooLarge} {
		if errors.Is(err, k) {
			return "refused (" + k.Error() + ")"
		}
	}
	return err.Error()
}

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
	maxTasks := r.spec.Limits.PIDs + GuestThreads
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
	if r.docker != nil {
		st, err := r.docker.State(ctx, r.rep.Sandbox.ID)
		switch {
		case err != nil:
			pass = false
			ev = append(ev, "engine: "+err.Error())
		case !st.Running || st.OOMKilled:
			pass = false
			ev = append(ev, fmt.Sprintf("engine: container running %v, OOM-killed %v: the whole sandbox was hit", st.Running, st.OOMKilled))
		default:
			ev = append(ev, "engine: the container runs on, not OOM-killed as a whole")
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
	for time.Since(start) < 10*time.Second {
		f, _, err := r.run(ctx, 10*time.Second, "mem")
		if err != nil {
			return "memory afterwards: " + err.Error()
		}
		used, _ = f.Data["used_mb"].(float64)
		if used < limit/2 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Sprintf("the sandbox's memory use fell to %.0f MB in %v", used, time.Since(start).Round(10*time.Millisecond))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return oneLine(s, 120)
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
	if u, ok := unwrapSandbox(r.sb).(interface{ Used() int64 }); ok {
		ev = append(ev, fmt.Sprintf("host: the episode filesystem is charged %.1f MB after the fill was removed", float64(u.Used())/(1<<20)))
	}
	if err := r.alive(ctx); err != nil {
		pass = false
		ev = append(ev, "the sandbox stopped answering: "+err.Error())
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; "), Data: data}
}

// cpu spins and compares CPU time with wall time, as the host accounts it
// when it can (gVisor's own accounting inside does not see the host's
// throttling).
func (r *runner) cpu(ctx context.Context) Probe {
	cpus := r.spec.Limits.CPUs
	allowed := cpus*1.1 + 0.1
	args := []string{"cpu", "-cpus", fmt.Sprint(cpus), "-for", "1s"}
	var before, after time.Duration
	var hostErr error
	measure := func() time.Duration {
		switch {
		case r.docker != nil:
			st, err := r.docker.State(ctx, r.rep.Sandbox.ID)
			if err != nil {
				hostErr = err
			}
			return st.CPU
		case r.wasm:
			var ru syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
			return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
		return 0
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
	if (r.docker != nil || r.wasm) && hostErr == nil {
		used := after - before
		ratio := used.Seconds() / wall.Seconds()
		what := "the container's cgroup"
		if r.wasm {
			what = "this process (the WASM runtime runs in it)"
		}
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
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		ev = append(ev, "host load average "+strings.Join(strings.Fields(string(load))[:3], " ")+" (a loaded host spins less, so a pass proves less)")
	}
	if r.wasm {
		ev = append(ev, "a module is one thread and at most Options.MaxInstances run at once in the process; the shell is bounded by the exec timeout, not a CPU share")
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

// exe tries the /proc/self/exe overwrite from inside; the host's binaries
// are hashed once every probe has run (judgeBinaries).
func (r *runner) exe(ctx context.Context) Probe {
	if r.wasm {
		r.exePass, r.exeEvidence = true, "no /proc/self/exe in a WASI module (see mounts)"
	} else {
		f, _, err := r.run(ctx, 30*time.Second, "exe", "-dir", r.spec.Workdir)
		if err != nil {
			r.exePass, r.exeEvidence = false, err.Error()
		} else {
			r.exePass, r.exeEvidence = f.Pass, f.Evidence
		}
	}
	return Probe{Status: statusPending}
}

// statusPending marks proc-self-exe until judgeBinaries completes it.
const statusPending = "pending"

// judgeBinaries completes proc-self-exe with the hashes of the host's
// runtime binaries before and after every probe.
func (r *runner) judgeBinaries(before map[string]string) {
	after := hashFiles(r.opts.HostBinaries)
	pass := r.exePass
	ev := []string{"inside: " + r.exeEvidence}
	var names []string
	for p := range before {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if before[p] != after[p] {
			pass = false
			ev = append(ev, fmt.Sprintf("host %s CHANGED: %s -> %s", p, short(before[p]), short(after[p])))
		} else {
			ev = append(ev, fmt.Sprintf("host %s unchanged (sha256 %s)", p, short(before[p])))
		}
	}
	if len(names) == 0 {
		ev = append(ev, "no host runtime binaries found in PATH to hash")
	}
	for i := range r.rep.Probes {
		if r.rep.Probes[i].Name == "proc-self-exe" {
			r.rep.Probes[i].Status = status(pass)
			r.rep.Probes[i].Pass = pass
			r.rep.Probes[i].Evidence = strings.Join(ev, "; ")
			r.rep.Probes[i].Data = map[string]any{"hashes": after}
			if r.opts.Progress != nil {
				fmt.Fprintf(r.opts.Progress, "rollbox audit: %-18s %-4s %s\n", "proc-self-exe", r.rep.Probes[i].Status, oneLine(r.rep.Probes[i].Evidence, 160))
			}
		}
	}
}

func short(h string) string {
	if len(h) > 16 && !strings.HasPrefix(h, "error") {
		return h[:16]
	}
	return h
}

func unwrapSandbox(s sandbox.Sandbox) sandbox.Sandbox {
	for {
		u, ok := s.(interface{ Unwrap() sandbox.Sandbox })
		if !ok {
			return s
		}
		s = u.Unwrap()
	}
}
