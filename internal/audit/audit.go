package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/rollbox/rollbox/sandbox"
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
	host, _ := sandbox.Find[sandbox.Inspector](backend)
	confiner, _ := sandbox.Find[sandbox.Confiner](backend)
	if opts.HostBinaries == nil {
		opts.HostBinaries = hostFiles(host, wasm)
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
	r := &runner{sb: sb, spec: full, probe: sandboxProbe, rep: rep, opts: opts, wasm: wasm, host: host, confiner: confiner,
		backend: backend, origSpec: spec, probeBin: probeBin}
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
	if len(opts.Only) == 0 || contains(opts.Only, sandboxRemoved) {
		start := time.Now()
		pr := r.removed(ctx)
		pr.Name = sandboxRemoved
		pr.DurationMS = time.Since(start).Milliseconds()
		r.add(pr)
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
	return append(out, sandboxRemoved)
}

// sandboxRemoved is the last probe: it closes the sandbox (runner.removed).
const sandboxRemoved = "sandbox-removed"

// hostFiles are the host files no sandbox may change: what the backend's
// Inspector names (a container backend's runtime binaries, the guest
// agent; the WASM backend's service and helper programs).
func hostFiles(host sandbox.Inspector, wasm bool) []string {
	if host != nil {
		return host.HostFiles()
	}
	return nil
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

// runner runs the probes against one sandbox. host is the backend's view
// from the host side (nil when the backend has none): the probes judge by it
// where a sandbox could misreport.
type runner struct {
	sb    sandbox.Sandbox
	spec  sandbox.Spec
	probe string
	rep   *Report
	opts  Options
	wasm  bool
	host  sandbox.Inspector
	// confiner's checks, once asked.
	confiner  sandbox.Confiner
	checks    []sandbox.ConfinementCheck
	checksErr error
	// backend, origSpec and probeBin make the sandboxes of the probes that
	// break their own (sandbox-abuse).
	backend  sandbox.Backend
	origSpec sandbox.Spec
	probeBin []byte

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
		{"capabilities", r.kernelOrConfined("caps", "no capabilities", "become root (setuid 0)")},
		{"seccomp", r.kernelOrConfined("seccomp", "seccomp filter", "open a network socket", "open a unix socket", "start a host program")},
		{"no-new-privileges", r.kernelOrConfined("no-new-privs", "no_new_privs")},
		{"mounts", r.mounts},
		{"proc-sys-writes", r.linuxOnly("proc-sys", "there is no /proc or /sys in the episode's filesystem (the mounts probe lists what is)")},
		{"escape-syscalls", r.kernelOrConfined("syscalls", "trace the parent process", "change root", "mount", "signal the parent process", "signal init")},
		{"host-filesystem", r.hostFS},
		{"tmpdir-host-write", r.tmpdirWrite},
		{"fifo-threads", r.fifoThreads},
		{"host-path-oracle", r.pathOracle},
		{"guest-isolation", r.guest},
		{"copy-out-symlink", r.copyOut},
		{"file-api-identity", r.fileIdentity},
		{"sandbox-abuse", r.abuse},
		{"fork-bomb", r.forkBomb},
		{"command-leftovers", r.leftovers},
		{"memory-balloon", r.balloon},
		{"memory-bypass", r.memoryBypass},
		{"disk-fill", r.diskFill},
		{"cpu-quota", r.cpu},
		{"output-flood", r.flood},
		{"proc-self-exe", r.exe},
	}
}

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
