package containerd

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	cgroupsv1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroupsv2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/typeurl/v2"

	"github.com/rollbox/rollbox/internal/guesthost"
	"github.com/rollbox/rollbox/sandbox"
)

// Inspect is containerd's view of the sandbox id (an Info().ID), for audits
// (sandbox.Inspector): the runtime it was created with, whether its task
// runs, and the CPU time its cgroup was charged.
func (b *Backend) Inspect(ctx context.Context, id string) (sandbox.HostState, error) {
	ctr, err := b.cli.LoadContainer(ctx, id)
	if err != nil {
		if isNotFound(err) {
			return sandbox.HostState{}, fmt.Errorf("container %s: %w", id, sandbox.ErrNotFound)
		}
		return sandbox.HostState{}, translate("load container "+id, err)
	}
	st := sandbox.HostState{CPUScope: "the container's cgroup"}
	if info, err := ctr.Info(ctx); err == nil {
		st.Runtime = info.Labels[LabelRuntime]
		if st.Runtime == "" {
			st.Runtime = sandbox.RuntimeRunc
		}
	}
	if spec, err := ctr.Spec(ctx); err == nil {
		q := 0.0
		if l := spec.Linux; l != nil && l.Resources != nil && l.Resources.CPU != nil {
			if c := l.Resources.CPU; c.Quota != nil && *c.Quota > 0 {
				period := uint64(100000) // the kernel's default
				if c.Period != nil && *c.Period > 0 {
					period = *c.Period
				}
				q = float64(*c.Quota) / float64(period)
			}
		}
		st.CPUQuota = &q
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		if isNotFound(err) {
			return st, nil
		}
		return st, translate("task of "+id, err)
	}
	status, err := task.Status(ctx)
	if err != nil {
		return st, translate("task status of "+id, err)
	}
	st.Running = status.Status == "running"
	if !st.Running {
		return st, nil
	}
	m, err := task.Metrics(ctx)
	if err != nil {
		return st, translate("metrics of "+id, err)
	}
	data, err := typeurl.UnmarshalAny(m.Data)
	if err != nil {
		return st, fmt.Errorf("metrics of %s: %v: %w", id, err, sandbox.ErrSandboxFailed)
	}
	switch v := data.(type) {
	case *cgroupsv1.Metrics:
		if v.CPU != nil && v.CPU.Usage != nil {
			st.CPU = time.Duration(v.CPU.Usage.Total)
		}
	case *cgroupsv2.Metrics:
		if v.CPU != nil {
			st.CPU = time.Duration(v.CPU.UsageUsec) * time.Microsecond
		}
	}
	return st, nil
}

// HostAddrs are the host's own addresses (sandbox.Inspector): containerd
// gives a sandbox a network namespace of its own with nothing in it, so no
// address of the host may be reachable from it.
func (b *Backend) HostAddrs(ctx context.Context) ([]string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range addrs {
		// Loopback is the sandbox's own inside its namespace.
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			out = append(out, ipn.IP.String())
		}
	}
	return out, nil
}

// TaskLimit is the container's task ceiling (sandbox.Inspector): the
// spec's pids and the guest agent's own threads.
func (b *Backend) TaskLimit(spec sandbox.Spec) int {
	return spec.WithDefaults().Limits.PIDs + guesthost.GuestThreads
}

// HostFiles are the host files a container escape of the CVE-2019-5736
// class would overwrite (sandbox.Inspector): the runtime binaries and
// containerd's shims as the executable search path finds them, and the
// guest agent bind-mounted into every container.
func (b *Backend) HostFiles() []string {
	seen := map[string]bool{}
	var out []string
	for _, name := range []string{"runc", "runsc", "containerd", "containerd-shim-runc-v2", "containerd-shim-runsc-v1"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		if r, err := filepath.EvalSymlinks(p); err == nil && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	if _, err := os.Stat(filepath.Join(b.opts.StateDir, "runsc")); err == nil {
		out = append(out, filepath.Join(b.opts.StateDir, "runsc"))
	}
	sort.Strings(out)
	return append(out, b.opts.GuestPath)
}

var _ sandbox.Inspector = (*Backend)(nil)
