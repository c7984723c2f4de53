package wasm

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/helper"
)

var (
	_ sandbox.Inspector = (*Backend)(nil)
	_ sandbox.Confiner  = (*Backend)(nil)
)

// Inspect reports a sandbox as the host sees it: running until closed, and
// the CPU time the helper processes spent on its commands.
func (b *Backend) Inspect(ctx context.Context, id string) (sandbox.HostState, error) {
	v, ok := b.live.Load(id)
	if !ok {
		return sandbox.HostState{}, fmt.Errorf("wasm sandbox %s: %w", id, sandbox.ErrNotFound)
	}
	sb := v.(*Sandbox)
	return sandbox.HostState{Running: true, CPU: time.Duration(sb.cpu.Load()),
		CPUScope: "the helper processes, during its commands"}, nil
}

// HostFiles are the service's executable and the helper program.
func (b *Backend) HostFiles() []string {
	var out []string
	if exe, err := os.Executable(); err == nil {
		out = append(out, exe)
	}
	if argv, err := b.helperCommand(context.Background()); err == nil {
		out = append(out, argv[0])
	}
	sort.Strings(out)
	return out
}

// HostAddrs is empty: a WASM sandbox has no network interface at all.
func (b *Backend) HostAddrs(context.Context) ([]string, error) { return nil, nil }

// TaskLimit is the spec's pids: the jobs (goroutines) a command line may run
// at once. Host threads are bounded per helper, whatever the script does.
func (b *Backend) TaskLimit(spec sandbox.Spec) int { return spec.WithDefaults().Limits.PIDs }

// ConfinementChecks starts a helper program confined as a helper is and
// reports what it tried on the host, then the confinement a running helper
// reports of itself.
func (b *Backend) ConfinementChecks(ctx context.Context) ([]sandbox.ConfinementCheck, error) {
	argv, err := b.helperCommand(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "rollbox-selftest-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rep, err := helper.SelfTest(ctx, argv, dir)
	if err != nil {
		return nil, err
	}
	var out []sandbox.ConfinementCheck
	for _, c := range rep.Checks {
		out = append(out, sandbox.ConfinementCheck{Name: c.Name, OK: c.OK, Detail: c.Detail})
	}
	conf, err := b.Confinement(ctx)
	if err != nil {
		return out, err
	}
	out = append(out,
		sandbox.ConfinementCheck{Name: "no_new_privs", OK: conf.NoNewPrivs},
		sandbox.ConfinementCheck{Name: "seccomp filter", OK: conf.Seccomp},
		sandbox.ConfinementCheck{Name: "no capabilities", OK: conf.CapsDropped},
		sandbox.ConfinementCheck{Name: fmt.Sprintf("landlock (ABI %d)", conf.Landlock), OK: conf.Landlock > 0 || !helper.LandlockAvailable()},
		sandbox.ConfinementCheck{Name: "rlimits", OK: conf.Rlimits},
		sandbox.ConfinementCheck{Name: "cgroup (memory and pids)", OK: b.cg != nil, Detail: b.cgNote},
	)
	for _, n := range conf.Notes {
		out = append(out, sandbox.ConfinementCheck{Name: "note", OK: true, Detail: n})
	}
	return out, nil
}

// threadsFor is GOMAXPROCS for an exec: the spec's CPUs, rounded up.
func threadsFor(cpus float64) int {
	return max(1, int(math.Ceil(cpus)))
}
