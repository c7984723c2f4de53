package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
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

// State is what the engine says about a sandbox's container: for audits,
// which must not take the sandbox's own word for it.
type State struct {
	// Runtime is the OCI runtime the engine started it with.
	Runtime string
	Running bool
	// OOMKilled is set when the engine saw the container's main process
	// killed for memory: a sandbox-wide kill, not one command's.
	OOMKilled bool
	ExitCode  int
	// CPU is the container's CPU time so far as the host accounts it (the
	// cgroup's usage), which a runtime cannot misreport from inside.
	CPU time.Duration
	// Labels are the container's labels.
	Labels map[string]string
}

// State inspects the container of the sandbox id (an Info().ID).
func (b *Backend) State(ctx context.Context, id string) (State, error) {
	in, err := b.cli.ContainerInspect(ctx, id)
	if err != nil {
		if isNotFound(err) {
			return State{}, fmt.Errorf("container %s: %w", id, sandbox.ErrNotFound)
		}
		return State{}, translate("inspect container "+id, err)
	}
	st := State{}
	if in.HostConfig != nil {
		st.Runtime = in.HostConfig.Runtime
	}
	if in.State != nil {
		st.Running, st.OOMKilled, st.ExitCode = in.State.Running, in.State.OOMKilled, in.State.ExitCode
	}
	if in.Config != nil {
		st.Labels = in.Config.Labels
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

// BridgeGateway is the host's address on the engine's default bridge
// network (docker0): what a sandbox with network "bridge" reaches the host
// by. Audits listen there to prove a sandbox cannot.
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

// GuestPath is the host path of the guest agent bind-mounted into every
// container: a host file audits check no sandbox changed.
func (b *Backend) GuestPath() string { return b.opts.GuestPath }
