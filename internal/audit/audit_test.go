package audit_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/internal/audit"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

var env struct {
	probe, probeWASI, guest string
	owner                   string
	skip                    string
}

func TestMain(m *testing.M) {
	code := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		env.owner = fmt.Sprintf("rollbox-audit-test-%d", os.Getpid())
		b := images.NewBuilder(os.Stderr)
		var err error
		if env.probe, err = b.Build(ctx, images.Target{Package: "images/probe", GOOS: "linux", GOARCH: "amd64", Name: "probe"}); err != nil {
			env.skip = "building the probe: " + err.Error()
			return m.Run()
		}
		if env.probeWASI, err = b.Build(ctx, images.Target{Package: "images/probe", GOOS: "wasip1", GOARCH: "wasm", Name: "probe.wasm"}); err != nil {
			env.skip = "building the wasip1 probe: " + err.Error()
			return m.Run()
		}
		if env.guest, err = b.Build(ctx, images.Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"}); err != nil {
			env.skip = "building the guest: " + err.Error()
			return m.Run()
		}
		defer func() {
			cli, err := docker.NewClient()
			if err != nil {
				return
			}
			defer cli.Close()
			if n, err := docker.Cleanup(context.Background(), cli, env.owner); err != nil || n > 0 {
				fmt.Fprintf(os.Stderr, "cleanup: removed %d leftover containers, err %v\n", n, err)
			}
		}()
		return m.Run()
	}()
	os.Exit(code)
}

// dockerBackend opens the docker backend with unsafe options, or skips
// (fails under CI=true) without an engine and the base image.
func dockerBackend(t *testing.T, unsafe docker.Unsafe) *docker.Backend {
	t.Helper()
	if env.skip != "" {
		t.Fatal(env.skip)
	}
	ctx := context.Background()
	b, err := docker.New(ctx, docker.Options{GuestPath: env.guest, Owner: env.owner, Unsafe: unsafe})
	if err == nil {
		_, err = b.Client().ImageInspect(ctx, "rollbox/base:latest")
		if err != nil {
			b.Close()
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("docker engine and rollbox/base required under CI=true: %v", err)
		}
		t.Skipf("no docker engine or base image (run .ci/engine.sh): %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func run(t *testing.T, b sandbox.Backend, spec sandbox.Spec, only ...string) *audit.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := audit.Run(ctx, b, spec, audit.Options{ProbeLinux: env.probe, ProbeWASI: env.probeWASI, Only: only})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Probes {
		t.Logf("%-18s %-4s %5dms %s", p.Name, p.Status, p.DurationMS, p.Evidence)
	}
	return rep
}

func probe(rep *audit.Report, name string) audit.Probe {
	for _, p := range rep.Probes {
		if p.Name == name {
			return p
		}
	}
	return audit.Probe{Name: name, Status: "missing"}
}

func TestTheDefaultSpecPassesEveryProbe(t *testing.T) {
	t.Parallel() // beside the loosened audits: the WASM audit (it counts host threads) runs first, alone
	// The runtimes' audits are independent (a backend and a sandbox each,
	// every probe judged inside its own sandbox or by its own container's
	// host view) and mostly wait on the engine: run them side by side.
	// gVisor's is the longest audit of the package: it starts first.
	for _, rt := range []string{sandbox.RuntimeRunsc, sandbox.RuntimeRunc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			b := dockerBackend(t, docker.Unsafe{})
			// Every probe, but output-flood under gVisor: its 1 GiB
			// through the sentry was 13-18 s of the longest audit (load
			// 15). The probe's own judgement (the cap kept, every byte
			// counted, the host's heap) runs on runc, through the same
			// backend and guest stream; the flood through gVisor is
			// sandbox/docker's conformance suite's (TestConformance/runsc,
			// "a 1 GB flood comes back capped with the dropped count").
			want := audit.Names()
			if rt == sandbox.RuntimeRunsc {
				want = slices.DeleteFunc(want, func(n string) bool { return n == "output-flood" })
			}
			rep := run(t, b, sandbox.Spec{Image: "base", Runtime: rt}, want...)
			if len(rep.Probes) != len(want) {
				t.Errorf("%d probes ran, want %d", len(rep.Probes), len(want))
			}
			for _, p := range rep.Probes {
				// A container has its own root: the helpers' host
				// filesystem checks are the WASM backend's.
				if p.Status != audit.StatusPass && !(p.Name == "host-filesystem" && p.Status == audit.StatusNA) {
					t.Errorf("%s: %s: %s", p.Name, p.Status, p.Evidence)
				}
			}
			if !rep.Pass || len(rep.Loosened) != 0 {
				t.Errorf("report pass=%v loosened=%v", rep.Pass, rep.Loosened)
			}
		})
	}
}

func TestLoosenedSandboxesFailTheProbesThatCoverThem(t *testing.T) {
	t.Parallel() // its audits fill the time the runsc audit runs on alone
	tests := []struct {
		name     string
		spec     sandbox.Spec
		unsafe   docker.Unsafe
		fail     []string // these probes must fail
		loosened string   // and the report must say why
	}{
		{"a bridge network fails the network probes", sandbox.Spec{Network: sandbox.NetworkBridge},
			docker.Unsafe{}, []string{"network-egress", "network-gateway", "network-metadata", "network-dns"}, "network=bridge"},
		{"an added capability fails the capabilities probe", sandbox.Spec{},
			docker.Unsafe{CapAdd: []string{"SYS_ADMIN"}}, []string{"capabilities"}, "docker.cap_add=SYS_ADMIN"},
		{"the docker socket mounted in fails the mounts probe", sandbox.Spec{},
			docker.Unsafe{Binds: []string{"/var/run/docker.sock:/var/run/docker.sock:ro"}}, []string{"mounts"}, "docker.bind=/var/run/docker.sock"},
		{"no seccomp profile fails the seccomp and syscall probes", sandbox.Spec{},
			docker.Unsafe{SeccompUnconfined: true}, []string{"seccomp", "escape-syscalls"}, "docker.seccomp=unconfined"},
		// Failed by the engine's configuration (no quota), whatever the
		// host's load: at a load of 121 two unthrottled spinning threads
		// got 0.18 CPUs, under the 0.21 a measurement allows 0.1.
		{"no CPU quota fails the CPU probe", sandbox.Spec{Limits: sandbox.Limits{CPUs: 0.1}},
			docker.Unsafe{NoCPUQuota: true}, []string{"cpu-quota"}, "docker.cpu_quota=none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // a backend and a sandbox of its own
			b := dockerBackend(t, tt.unsafe)
			spec := tt.spec
			spec.Image = "base"
			rep := run(t, b, spec, tt.fail...)
			for _, name := range tt.fail {
				if p := probe(rep, name); p.Status != audit.StatusFail {
					t.Errorf("%s: %s, want fail: %s", name, p.Status, p.Evidence)
				}
			}
			if p := probe(rep, "cpu-quota"); tt.unsafe.NoCPUQuota && !strings.Contains(p.Evidence, "the engine enforces no CPU quota") {
				t.Errorf("cpu-quota evidence does not name the missing quota: %s", p.Evidence)
			}
			if rep.Pass || !strings.Contains(strings.Join(rep.Loosened, " "), tt.loosened) {
				t.Errorf("report pass=%v loosened=%v, want fail and %q", rep.Pass, rep.Loosened, tt.loosened)
			}
		})
	}
}

func TestTheWASMBackendPassesOrExplainsEveryProbe(t *testing.T) {
	if env.skip != "" {
		t.Fatal(env.skip)
	}
	ctx := context.Background()
	b, err := wasm.New(ctx, wasm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rep := run(t, b, sandbox.Spec{})
	for _, p := range rep.Probes {
		if p.Status == audit.StatusFail {
			t.Errorf("%s failed: %s", p.Name, p.Evidence)
		}
		if p.Status == audit.StatusNA && p.Evidence == "" {
			t.Errorf("%s is n/a without a reason", p.Name)
		}
	}
	for _, must := range []string{"network-egress", "mounts", "memory-balloon", "disk-fill", "output-flood", "copy-out-symlink", "fork-bomb",
		// The helpers' confinement and the attacks that reached the host
		// through the former in-process interpreter.
		"capabilities", "seccomp", "no-new-privileges", "escape-syscalls", "host-filesystem",
		"tmpdir-host-write", "fifo-threads", "memory-bypass", "host-path-oracle", "cpu-quota", "command-leftovers"} {
		if p := probe(rep, must); p.Status != audit.StatusPass {
			t.Errorf("%s: %s, want pass on wasm: %s", must, p.Status, p.Evidence)
		}
	}
}

// hostView adds a host side (sandbox.Inspector) to the real WASM backend:
// the seam through which a backend gives the audit what only the host sees.
type hostView struct {
	sandbox.Backend
	state   sandbox.HostState
	file    string
	changed bool
}

func (h *hostView) Inspect(ctx context.Context, id string) (sandbox.HostState, error) {
	if !h.changed { // what an escape would do to a runtime binary
		h.changed = true
		os.WriteFile(h.file, []byte("overwritten"), 0o644)
	}
	return h.state, nil
}
func (h *hostView) HostFiles() []string                             { return []string{h.file} }
func (h *hostView) HostAddrs(ctx context.Context) ([]string, error) { return nil, nil }
func (h *hostView) TaskLimit(spec sandbox.Spec) int                 { return spec.Limits.PIDs }

func TestTheAuditJudgesByTheHostViewOfAnyBackendThatHasOne(t *testing.T) {
	t.Parallel() // a backend, a sandbox and a host file of its own; it counts no host threads (fifo-threads is not among its probes)
	if env.skip != "" {
		t.Fatal(env.skip)
	}
	b, err := wasm.New(context.Background(), wasm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	file := filepath.Join(t.TempDir(), "runtime-binary")
	os.WriteFile(file, []byte("the runtime"), 0o755)
	// The host says the sandbox as a whole died of memory, and a runtime
	// binary changed: both probes fail, whatever the sandbox says itself.
	h := &hostView{Backend: b, state: sandbox.HostState{Running: false, OOMKilled: true}, file: file}
	// 64 MB: the balloons the host's verdict overrules are an eighth of
	// the default spec's (TestTheWASMBackendPassesOrExplainsEveryProbe
	// blows those), and the verdict is the same.
	rep := run(t, h, sandbox.Spec{Limits: sandbox.Limits{MemoryMB: 64}}, "memory-balloon", "proc-self-exe")
	if p := probe(rep, "memory-balloon"); p.Status != audit.StatusFail || !strings.Contains(p.Evidence, "the whole sandbox was hit") {
		t.Errorf("memory-balloon: %s: %s", p.Status, p.Evidence)
	}
	if p := probe(rep, "proc-self-exe"); p.Status != audit.StatusFail || !strings.Contains(p.Evidence, file+" CHANGED") {
		t.Errorf("proc-self-exe: %s: %s", p.Status, p.Evidence)
	}
}
