package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"github.com/rollbox/rollbox/sandbox"
)

// Unsafe loosens every container a backend makes in ways a sandbox.Spec
// cannot ask for. It exists so that an audit can show its probes fail on a
// weakened sandbox (the audit's tests use it); nothing that runs episodes
// should set it. Backend.Loosened lists what it changes, and audit reports
// print that list.
type Unsafe struct {
	// CapAdd keeps these capabilities (e.g. "SYS_ADMIN").
	CapAdd []string
	// Binds are extra HOST:CONTAINER[:ro] bind mounts (e.g. the docker socket).
	Binds []string
	// SeccompUnconfined runs without the engine's seccomp profile.
	SeccompUnconfined bool
	// NoCPUQuota drops the CPU quota of Limits.CPUs.
	NoCPUQuota bool
}

// loosened describes u for reports.
func (u Unsafe) loosened() []string {
	var out []string
	for _, c := range u.CapAdd {
		out = append(out, "docker.cap_add="+c)
	}
	for _, b := range u.Binds {
		out = append(out, "docker.bind="+b)
	}
	if u.SeccompUnconfined {
		out = append(out, "docker.seccomp=unconfined")
	}
	if u.NoCPUQuota {
		out = append(out, "docker.cpu_quota=none")
	}
	return out
}

func (u Unsafe) apply(hc *container.HostConfig) {
	hc.CapAdd = append(hc.CapAdd, u.CapAdd...)
	hc.Binds = append(hc.Binds, u.Binds...)
	if u.SeccompUnconfined {
		hc.SecurityOpt = append(hc.SecurityOpt, "seccomp=unconfined")
	}
	if u.NoCPUQuota {
		hc.NanoCPUs = 0
	}
}

// Loosened lists what Options.Unsafe changes in every container this
// backend makes, beyond what its Spec says; empty when nothing.
func (b *Backend) Loosened() []string { return b.opts.Unsafe.loosened() }

// Inspect is the engine's view of the sandbox id (an Info().ID): for
// audits, which must not take the sandbox's own word for it
// (sandbox.Inspector). CPU is the container's cgroup usage.
func (b *Backend) Inspect(ctx context.Context, id string) (sandbox.HostState, error) {
	in, err := b.cli.ContainerInspect(ctx, id)
	if err != nil {
		if isNotFound(err) {
			return sandbox.HostState{}, fmt.Errorf("container %s: %w", id, sandbox.ErrNotFound)
		}
		return sandbox.HostState{}, translate("inspect container "+id, err)
	}
	st := sandbox.HostState{CPUScope: "the container's cgroup"}
	if hc := in.HostConfig; hc != nil {
		st.Runtime = hc.Runtime
		q := float64(hc.NanoCPUs) / 1e9
		if q == 0 && hc.CPUQuota > 0 {
			period := hc.CPUPeriod
			if period == 0 {
				period = 100000 // the kernel's default, as Docker's
			}
			q = float64(hc.CPUQuota) / float64(period)
		}
		st.CPUQuota = &q
	}
	if in.State != nil {
		st.Running, st.OOMKilled = in.State.Running, in.State.OOMKilled
	}
	if !st.Running {
		return st, nil
	}
	r, err := b.cli.ContainerStatsOneShot(ctx, id)
	if err != nil {
		return st, translate("stats of container "+id, err)
	}
	defer r.Body.Close()
	var stats container.StatsResponse
	if err := json.NewDecoder(r.Body).Decode(&stats); err != nil {
		return st, fmt.Errorf("stats of container %s: %v: %w", id, err, sandbox.ErrSandboxFailed)
	}
	st.CPU = time.Duration(stats.CPUStats.CPUUsage.TotalUsage)
	return st, nil
}

// HostAddrs is the host's address on the engine's default bridge network
// (sandbox.Inspector): what a sandbox with network "bridge" reaches the
// host by, and one without must not.
func (b *Backend) HostAddrs(ctx context.Context) ([]string, error) {
	gw, err := b.BridgeGateway(ctx)
	if err != nil {
		return nil, err
	}
	return []string{gw}, nil
}

// TaskLimit is the container's task ceiling (sandbox.Inspector): the
// spec's pids and the guest agent's own threads.
func (b *Backend) TaskLimit(spec sandbox.Spec) int {
	return spec.WithDefaults().Limits.PIDs + guestThreads
}

// HostFiles are the host files a container escape of the CVE-2019-5736
// class would overwrite (sandbox.Inspector): the runtime binaries (runc,
// runsc, docker-init, the containerd shims) as the executable search path
// finds them, and the guest agent bind-mounted into every container.
func (b *Backend) HostFiles() []string {
	seen := map[string]bool{}
	var out []string
	for _, name := range []string{"runc", "runsc", "docker-init", "containerd-shim",
		"containerd-shim-runc-v1", "containerd-shim-runc-v2", "containerd-shim-runsc-v1"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		if r, err := filepath.EvalSymlinks(p); err == nil && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	sort.Strings(out)
	return append(out, b.opts.GuestPath)
}

// BridgeGateway is the host's address on the engine's default bridge
// network (docker0): what a sandbox with network "bridge" reaches the host
// by.
func (b *Backend) BridgeGateway(ctx context.Context) (string, error) {
	nw, err := b.cli.NetworkInspect(ctx, "bridge", network.InspectOptions{})
	if err != nil {
		return "", translate("inspect network bridge", err)
	}
	for _, c := range nw.IPAM.Config {
		if ip := net.ParseIP(strings.TrimSpace(c.Gateway)); ip != nil {
			return ip.String(), nil
		}
	}
	// Older engines leave the default bridge's gateway out of its IPAM
	// config: it is the bridge interface's own address.
	if name := nw.Options["com.docker.network.bridge.name"]; name != "" {
		if ifc, err := net.InterfaceByName(name); err == nil {
			addrs, _ := ifc.Addrs()
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
					return ipn.IP.String(), nil
				}
			}
		}
	}
	return "", fmt.Errorf("network bridge has no gateway address: %w", sandbox.ErrNotFound)
}

var _ sandbox.Inspector = (*Backend)(nil)
