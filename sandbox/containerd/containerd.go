package containerd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/rollbox/rollbox/internal/guesthost"
	"github.com/rollbox/rollbox/sandbox"
)

// Labels every container (and the containerd lease holding its snapshots)
// carries: the same names as the Docker backend's.
const (
	LabelOwner   = "rollbox.owner"
	LabelSpec    = "rollbox.spec"
	LabelRuntime = "rollbox.runtime"
	LabelImage   = "rollbox.image"
)

// Defaults.
const (
	// DefaultAddress is containerd's socket.
	DefaultAddress = "/run/containerd/containerd.sock"
	// DefaultNamespace keeps Rollbox's containers, images, snapshots and
	// leases apart from Docker's (moby) and Kubernetes' (k8s.io).
	DefaultNamespace = "rollbox"
	// DefaultOwner labels containers when Options.Owner is empty.
	DefaultOwner = "rollbox"
	// Snapshotter holds the images' layers and the forks' layers.
	Snapshotter = "overlayfs"
	// GuestMountPath is where the guest agent is bind-mounted.
	GuestMountPath = "/.rollbox/guest"
	// DefaultGuestTimeout is how long a ping may go unanswered (as Docker's).
	DefaultGuestTimeout = 10 * time.Second
	// DefaultRemoveTimeout is how long Close retries a failed removal.
	DefaultRemoveTimeout = 2 * time.Minute
	// DefaultSpareIdle is how long unused fork spares are kept.
	DefaultSpareIdle = 5 * time.Minute
)

// ShimRunc is the runtime shim of every sandbox: containerd's runc v2
// shim, with runc as its OCI binary, or runsc for gVisor (runtimeFor).
const ShimRunc = "io.containerd.runc.v2"

// user is the commands' user: nobody, numeric, so no image needs an
// /etc/passwd entry for it.
const uid, gid = 65534, 65534

// Options configure a Backend.
type Options struct {
	// GuestPath is the host path of the static guest agent binary. Required.
	GuestPath string
	// Address is containerd's socket (default DefaultAddress).
	Address string
	// Namespace is the containerd namespace (default DefaultNamespace).
	Namespace string
	// Owner is the rollbox.owner label (default DefaultOwner).
	Owner string
	// Labels are added to every container and lease (after the spec's,
	// before the backend's own), e.g. the lease of the process that made it.
	Labels map[string]string
	// GuestTimeout: see docker.Options.GuestTimeout.
	GuestTimeout time.Duration
	// RemoveTimeout bounds how long Close retries a failed removal.
	RemoveTimeout time.Duration
	// StateDir holds the sandboxes' files on the host (default
	// /run/rollbox/containerd): each Backend its own directory of tmpfs
	// layers and mount points, locked while its process lives.
	StateDir string
	// ForkSpares is how many fresh sandboxes of a forked spec the backend
	// keeps ready after a fork, up to that fork's n (or ahead of the first,
	// up to the n a Container.PrepareFork names), so the next fork of the
	// spec takes them instead of creating its children cold (0: none).
	// Spares carry no labels: forks of sandboxes that differ only in their
	// labels (every episode's) share them.
	ForkSpares int
	// SpareIdle: the spares of a spec no fork has taken (nor PrepareFork
	// asked for) for this long are closed (default DefaultSpareIdle).
	SpareIdle time.Duration
	// StdioOnly speaks to every guest over the task's stdio, as under
	// runsc, instead of the channel past the shim (for a guest built
	// before the channel, and for benchmarks side by side).
	StdioOnly bool
	// ChannelTimeout bounds how long a create waits for the guest to
	// connect to its channel (default DefaultChannelTimeout); a guest
	// that does not fails the create as ErrSandboxFailed.
	ChannelTimeout time.Duration
}

// Backend creates container sandboxes on containerd directly: no dockerd in
// the path.
type Backend struct {
	cli  *client.Client
	opts Options

	removeFailures atomic.Int64

	instOnce sync.Once
	inst     *instance
	instErr  error

	layersMu sync.Mutex // guards layer.refs

	spares spares

	// channelHook, when set (tests), is called with each channel's socket
	// path once it listens, before the container exists.
	channelHook func(path string)
	// trace, when set (benchmarks), is called as each step of a create
	// ends ("" as one begins); creates must then run one at a time.
	trace func(step string)
	// shimGroup, when set (benchmarks), makes every create join the shim
	// of the sandbox of that id instead of starting its own.
	shimGroup string
	// allABIs, when set (benchmarks), keeps the default seccomp profile's
	// every system call ABI (withNativeSyscallsOnly's baseline).
	allABIs bool

	runscOnce sync.Once
	runsc     string // the runsc wrapper (runtimeFor)
	runscErr  error

	mu       sync.Mutex
	unpacked map[string]bool // image config digests known unpacked
}

// instance is the backend's own state directory, made on first use.
func (b *Backend) instance() (*instance, error) {
	b.instOnce.Do(func() { b.inst, b.instErr = newInstance(b.opts.StateDir) })
	return b.inst, b.instErr
}

// New connects to containerd and checks it answers.
//
// # Errors
//
// ErrEngineUnavailable when containerd cannot be reached, with a one-line
// hint; ErrInvalidSpec when GuestPath is missing.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if err := guesthost.CheckGuest("containerd.guest", opts.GuestPath); err != nil {
		return nil, err
	}
	if opts.Address == "" {
		opts.Address = DefaultAddress
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.Owner == "" {
		opts.Owner = DefaultOwner
	}
	if opts.GuestTimeout <= 0 {
		opts.GuestTimeout = DefaultGuestTimeout
	}
	if opts.RemoveTimeout <= 0 {
		opts.RemoveTimeout = DefaultRemoveTimeout
	}
	if opts.SpareIdle <= 0 {
		opts.SpareIdle = DefaultSpareIdle
	}
	if opts.ChannelTimeout <= 0 {
		opts.ChannelTimeout = DefaultChannelTimeout
	}
	if opts.StateDir == "" {
		opts.StateDir = "/run/rollbox/containerd"
	}
	cli, err := Dial(ctx, opts.Address, opts.Namespace)
	if err != nil {
		return nil, err
	}
	b := &Backend{cli: cli, opts: opts, unpacked: map[string]bool{}}
	b.spares.init()
	return b, nil
}

// Dial connects to containerd at address (default DefaultAddress) in
// namespace (default DefaultNamespace) and checks it answers within 10 s.
func Dial(ctx context.Context, address, namespace string) (*client.Client, error) {
	if address == "" {
		address = DefaultAddress
	}
	if namespace == "" {
		namespace = DefaultNamespace
	}
	if _, err := os.Stat(address); err != nil {
		return nil, fmt.Errorf("containerd socket %s: %v (%s): %w", address, err, engineHint, sandbox.ErrEngineUnavailable)
	}
	cli, err := client.New(address, client.WithDefaultNamespace(namespace), client.WithTimeout(10*time.Second))
	if err != nil {
		return nil, translate("containerd client", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Version(pctx); err != nil {
		cli.Close()
		if pctx.Err() != nil {
			return nil, fmt.Errorf("containerd did not answer in 10s (%s): %w", engineHint, sandbox.ErrEngineUnavailable)
		}
		return nil, translate("containerd", err)
	}
	return cli, nil
}

// Client is the backend's containerd client, for tests and tools.
func (b *Backend) Client() *client.Client { return b.cli }

// Name is "containerd".
func (b *Backend) Name() string { return sandbox.BackendContainerd }

// Close closes the fork spares and the client. Sandboxes already handed
// out are not closed.
func (b *Backend) Close() error {
	b.spares.close()
	return b.cli.Close()
}

// RemoveFailures counts the containers this backend's sandboxes could not
// remove (Close returned the error): leftovers for `rollbox gc`.
func (b *Backend) RemoveFailures() int64 { return b.removeFailures.Load() }

// Create validates spec, creates a container and its task with the guest as
// PID 1 on the task's stdio, starts it and returns once the guest has
// answered. A failure removes what was made.
//
// # Errors
//
// ErrInvalidSpec (a *FieldError) for a bad spec (a "bridge" network too:
// containerd has no network of its own to join); ErrImageNotFound naming
// the image and the command that imports it; ErrEngineUnavailable when
// containerd or the runtime's shim is missing; ErrSandboxFailed when the
// container does not come up.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	return b.create(ctx, spec)
}

func (b *Backend) create(ctx context.Context, spec sandbox.Spec) (*Container, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	spec = spec.WithDefaults()
	if spec.Limits.OutputBytes > sandbox.MaxFileBytes {
		return nil, &sandbox.FieldError{Field: "limits.output_bytes", Message: fmt.Sprintf("%d is above the %d maximum", spec.Limits.OutputBytes, sandbox.MaxFileBytes)}
	}
	if spec.Network != sandbox.NetworkNone {
		return nil, &sandbox.FieldError{Field: "network", Message: fmt.Sprintf("%q: the containerd backend has no network but none (no CNI is configured); use the docker backend", spec.Network)}
	}
	shim, shimOpts, err := b.runtimeFor(spec.Runtime)
	if err != nil {
		return nil, err
	}
	b.step("")
	img, ref, digest, err := b.image(ctx, spec.Image)
	if err != nil {
		return nil, err
	}
	b.step("image")
	id := randomHex(6)
	labels := b.labels(spec)
	// The create is never abandoned midway (see docker.Backend.Create): it
	// runs to its answer, and what was made for a caller that is gone is
	// removed.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	c := newContainer(b, id, spec, ref, digest)
	if err := c.make(cctx, img, shim, shimOpts, labels); err != nil {
		c.Close()
		return nil, err
	}
	if err := context.Cause(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("create container: %w", err)
	}
	if err := c.start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// shimGroupOpts joins the shim of the sandbox b.shimGroup names (a
// measurement of what a shim's start costs: RATIONALE.md).
func (b *Backend) shimGroupOpts() []oci.SpecOpts {
	if b.shimGroup == "" {
		return nil
	}
	return []oci.SpecOpts{oci.WithAnnotations(map[string]string{"io.containerd.runc.v2.group": b.shimGroup})}
}

// step marks the end of a create's step for trace.
func (b *Backend) step(name string) {
	if b.trace != nil {
		b.trace(name)
	}
}

func (b *Backend) labels(spec sandbox.Spec) map[string]string {
	labels := map[string]string{}
	for k, v := range spec.Labels {
		labels[k] = v
	}
	for k, v := range b.opts.Labels {
		labels[k] = v
	}
	labels[LabelOwner] = b.opts.Owner
	labels[LabelSpec] = spec.Key()
	labels[LabelRuntime] = spec.Runtime
	labels[LabelImage] = spec.Image
	return labels
}

// runtimeFor is the containerd runtime of an OCI runtime name: its shim and
// the shim's options. gVisor runs as dockerd runs it: containerd's runc
// shim with runsc as its OCI binary (through a wrapper that adds
// --network=none, runscWrapper), not gVisor's own shim
// (containerd-shim-runsc-v1), which sets its process's OOM score to -999
// and fails where that is refused (no CAP_SYS_RESOURCE: RATIONALE.md).
func (b *Backend) runtimeFor(runtime string) (shim string, opts any, err error) {
	switch runtime {
	case "", sandbox.RuntimeRunc:
		return ShimRunc, nil, nil
	case sandbox.RuntimeRunsc:
		b.runscOnce.Do(func() { b.runsc, b.runscErr = writeRunscWrapper(b.opts.StateDir) })
		if b.runscErr != nil {
			return "", nil, b.runscErr
		}
		return ShimRunc, &runcoptions.Options{BinaryName: b.runsc}, nil
	}
	return "", nil, &sandbox.FieldError{Field: "runtime", Message: fmt.Sprintf("%q is not one of runc, runsc", runtime)}
}

// writeRunscWrapper writes, in dir, the OCI binary the runc shim runs for
// gVisor: runsc with --network=none (as dockerd's runtimes wrapper does).
// runsc's default network mode builds its network from the interfaces of
// the container's network namespace, which it must be given by path (a
// CNI's); a sandbox has none, so runsc runs with no network stack beyond
// its loopback.
func writeRunscWrapper(dir string) (string, error) {
	bin, err := exec.LookPath("runsc")
	if err != nil {
		return "", fmt.Errorf("runtime runsc on containerd needs gVisor's runsc on the PATH (apt-get install runsc): %w", sandbox.ErrEngineUnavailable)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return "", fmt.Errorf("runsc: %v: %w", err, sandbox.ErrEngineUnavailable)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("runsc wrapper: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	script := "#!/bin/sh\nexec " + strconv.Quote(bin) + " --network=none \"$@\"\n"
	path := filepath.Join(dir, "runsc")
	if old, err := os.ReadFile(path); err == nil && string(old) == script {
		return path, nil
	}
	tmp, err := os.CreateTemp(dir, ".runsc-*")
	if err != nil {
		return "", fmt.Errorf("runsc wrapper: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(script); err != nil {
		tmp.Close()
		return "", fmt.Errorf("runsc wrapper: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", fmt.Errorf("runsc wrapper: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	tmp.Close()
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("runsc wrapper: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	return path, nil
}

// ociSpec is the hardened OCI spec of a sandbox: the guest as PID 1, no
// network interfaces (a new, empty network namespace), no capabilities,
// no-new-privileges, containerd's default seccomp profile, a read-only root,
// the workdir and /tmp on size-limited tmpfs (binds of the host's mount
// points under runc, see workspace.go; the runtime's own tmpfs under runsc), memory (swap equal to it), CPU quota and pids
// through the cgroup, user 65534:65534.
//
// channel, when not empty, is the host path of the sandbox's channel
// socket: bound read-only at ChannelMountPath and named on the guest's
// command line.
func (b *Backend) ociSpec(spec sandbox.Spec, files []specs.Mount, channel string) []oci.SpecOpts {
	l := spec.Limits
	memory := int64(l.MemoryMB) << 20
	pids := int64(l.PIDs + guesthost.GuestThreads)
	if spec.Runtime == sandbox.RuntimeRunsc {
		// As on Docker: the guest enforces the limits inside the sentry,
		// and the host's sit above them as a backstop (see
		// sandbox/docker/RATIONALE.md, "Why is gVisor special?").
		memory = memory*2 + 128<<20
		pids = 32768
	}
	mounts := []specs.Mount{{
		Destination: GuestMountPath, Type: "bind", Source: b.opts.GuestPath,
		Options: []string{"rbind", "ro", "nosuid", "nodev"},
	}, {
		// The container's own cgroups, read-only, as Docker mounts them:
		// the guest reads the memory cgroup's OOM-kill count to tell a
		// command killed for memory from one killed otherwise.
		Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup",
		Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"},
	}}
	args := []string{GuestMountPath}
	if channel != "" {
		mounts = append(mounts, specs.Mount{
			Destination: ChannelMountPath, Type: "bind", Source: channel,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		})
		args = append(args, "-channel", ChannelMountPath)
	}
	mounts = append(mounts, files...)
	opts := []oci.SpecOpts{
		oci.WithProcessArgs(args...),
		oci.WithProcessCwd(spec.Workdir),
		oci.WithEnv([]string{"PATH=" + guesthost.DefaultPath}),
		oci.WithHostname(spec.Hostname),
		oci.WithUIDGID(uid, gid),
		oci.WithCapabilities(nil),
		oci.WithAmbientCapabilities(nil),
		oci.WithNoNewPrivileges,
		oci.WithRootFSReadonly(),
		oci.WithoutRunMount, // Docker mounts no /run either: nothing writable but the workdir and /tmp
		oci.WithMounts(mounts),
		oci.WithMemoryLimit(uint64(memory)),
		oci.WithMemorySwap(memory),
		oci.WithPidsLimit(pids),
		seccomp.WithDefaultProfile(),
	}
	if !b.allABIs {
		opts = append(opts, withNativeSyscallsOnly)
	}
	if l.CPUs > 0 {
		const period = 100000
		opts = append(opts, oci.WithCPUCFS(int64(l.CPUs*period), period))
	}
	return opts
}

// withNativeSyscallsOnly narrows the seccomp profile to the host's own
// system call ABI: containerd's default lists, on amd64, x86-64, x86 and
// x32, for images built for any of them. The sandboxes' images are the
// host's architecture; a call through another ABI (int 0x80, or an x32
// number) is then killed (SIGSYS) as of an unknown architecture: less
// kernel surface, and a filter a third as long for runc to compile (~20 ms
// of every create here: RATIONALE.md).
func withNativeSyscallsOnly(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
	if s.Linux == nil || s.Linux.Seccomp == nil || len(s.Linux.Seccomp.Architectures) == 0 {
		return nil
	}
	native, ok := nativeArch[goruntime.GOARCH]
	if !ok {
		return nil
	}
	s.Linux.Seccomp.Architectures = []specs.Arch{native}
	return nil
}

// nativeArch is the seccomp architecture of each GOARCH a sandbox runs on.
var nativeArch = map[string]specs.Arch{
	"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64, "386": specs.ArchX86,
	"ppc64le": specs.ArchPPC64LE, "s390x": specs.ArchS390X, "riscv64": specs.ArchRISCV64,
}

// useChannel says whether a sandbox of spec speaks to its guest over the
// channel: under runc, unless Options.StdioOnly. gVisor's gofer opens no
// host socket bound into the sandbox without --host-uds, which would widen
// what every sandbox reaches: runsc keeps the stdio.
func (b *Backend) useChannel(spec sandbox.Spec) bool {
	return !b.opts.StdioOnly && spec.Runtime != sandbox.RuntimeRunsc
}

// tmpfsMounts are the workdir and /tmp of a sandbox that starts empty.
func tmpfsMounts(spec sandbox.Spec) []specs.Mount {
	l := spec.Limits
	opt := func(sizeMB int, mode string) []string {
		return []string{"nosuid", "nodev", "size=" + strconv.Itoa(sizeMB) + "m", "mode=" + mode,
			"uid=" + strconv.Itoa(uid), "gid=" + strconv.Itoa(gid)}
	}
	return []specs.Mount{
		{Destination: spec.Workdir, Type: "tmpfs", Source: "tmpfs", Options: opt(l.DiskMB, "0755")},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: opt(l.TmpMB, "1777")},
	}
}

// withLabels is the container's labels.
func withLabels(labels map[string]string) client.NewContainerOpts {
	return func(ctx context.Context, _ *client.Client, c *containers.Container) error {
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		for k, v := range labels {
			c.Labels[k] = v
		}
		return nil
	}
}

// newLease makes the containerd lease that holds what a sandbox makes in
// containerd's stores besides its container (a fork's views), labelled
// like the container so a cleanup finds it.
func (b *Backend) newLease(ctx context.Context, id string, labels map[string]string) (leases.Lease, error) {
	l, err := b.cli.LeasesService().Create(ctx, leases.WithID(leasePrefix+id), leases.WithLabels(labels))
	if err != nil {
		return leases.Lease{}, translate("create lease for "+id, err)
	}
	return l, nil
}

// leasePrefix names the leases of sandboxes; forkLeasePrefix those of fork
// snapshots (an earlier version's: a cleanup still removes them).
const (
	leasePrefix     = "rollbox-"
	forkLeasePrefix = "rollbox-fork-"
)

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
