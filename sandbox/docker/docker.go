package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"

	"github.com/rollbox/rollbox/internal/guesthost"
	"github.com/rollbox/rollbox/sandbox"
)

// Labels every container carries.
const (
	LabelOwner   = "rollbox.owner"
	LabelSpec    = "rollbox.spec"
	LabelRuntime = "rollbox.runtime"
	LabelImage   = "rollbox.image"
)

// GuestMountPath is where the guest agent is bind-mounted in a container.
const GuestMountPath = "/.rollbox/guest"

// DefaultUser is the user commands run as: nobody. A numeric uid:gid needs no
// entry in the image's /etc/passwd, so it works with any image; an image
// whose programs insist on root must say so with Options.User.
const DefaultUser = "65534:65534"

// DefaultOwner labels containers when Options.Owner is empty.
const DefaultOwner = "rollbox"

// guestThreads is what the pids limit allows beyond Limits.PIDs for the
// guest agent's own threads, so the commands get the whole of their budget.
const guestThreads = guesthost.GuestThreads

// Options configure a Backend.
type Options struct {
	// GuestPath is the host path of the static guest agent binary
	// (images.Builder builds it from images/guest). Required.
	GuestPath string
	// Owner is the rollbox.owner label of every container, so Cleanup can
	// find leftovers. Default "rollbox".
	Owner string
	// User is the container user (default 65534:65534).
	User string
	// Client, if set, is used instead of one from the environment
	// (DOCKER_HOST etc.); the backend does not close it.
	Client *client.Client
	// Labels are added to every container (after the spec's, before the
	// backend's own), e.g. the lease of the process that made it, so a
	// cleanup can tell a crashed process's leftovers from a live one's.
	Labels map[string]string
	// Unsafe loosens every container; for audits' tests only. See Unsafe.
	Unsafe Unsafe
	// GuestTimeout is how long the guest may take to answer a ping while
	// calls wait for it before the sandbox is failed (default
	// DefaultGuestTimeout).
	GuestTimeout time.Duration
	// RemoveTimeout bounds how long Close keeps retrying to remove a
	// container the engine failed to remove (default DefaultRemoveTimeout).
	RemoveTimeout time.Duration
}

// DefaultGuestTimeout is how long a ping may go unanswered by default: far
// above the guest's latency under load (p99 under 1 s with 200 sandboxes on
// 2 cores), far below a command's timeout.
const DefaultGuestTimeout = 10 * time.Second

// DefaultRemoveTimeout is how long Close retries a failed remove by default.
const DefaultRemoveTimeout = 2 * time.Minute

// Backend creates container sandboxes on a Docker engine.
type Backend struct {
	cli     *client.Client
	ownsCli bool
	opts    Options

	removeFailures atomic.Int64
}

// New connects to the engine (client.FromEnv, API version negotiated) and
// checks it answers.
//
// # Errors
//
// ErrEngineUnavailable when the engine cannot be reached, with a one-line
// hint; ErrInvalidSpec when GuestPath is missing.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if err := guesthost.CheckGuest("docker.guest", opts.GuestPath); err != nil {
		return nil, err
	}
	if opts.Owner == "" {
		opts.Owner = DefaultOwner
	}
	if opts.User == "" {
		opts.User = DefaultUser
	}
	if opts.GuestTimeout <= 0 {
		opts.GuestTimeout = DefaultGuestTimeout
	}
	if opts.RemoveTimeout <= 0 {
		opts.RemoveTimeout = DefaultRemoveTimeout
	}
	b := &Backend{cli: opts.Client, opts: opts}
	if b.cli == nil {
		var err error
		b.cli, err = NewClient()
		if err != nil {
			return nil, err
		}
		b.ownsCli = true
	}
	if err := ping(ctx, b.cli); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// NewClient returns a docker client from the environment with API version
// negotiation.
func NewClient() (*client.Client, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, translate("docker client", err)
	}
	return cli, nil
}

func ping(ctx context.Context, cli *client.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("docker engine did not answer in 10s (%s): %w", engineHint, sandbox.ErrEngineUnavailable)
		}
		return translate("docker engine", err)
	}
	return nil
}

// Client is the backend's docker client, for tests and tools.
func (b *Backend) Client() *client.Client { return b.cli }

// Name is "docker".
func (b *Backend) Name() string { return "docker" }

// Close closes the client if the backend made it. Sandboxes already handed
// out keep their own connections.
func (b *Backend) Close() error {
	if b.ownsCli && b.cli != nil {
		return b.cli.Close()
	}
	return nil
}

// Create validates spec, creates and starts a container with the guest as
// PID 1, and returns once the guest has answered. A failure removes what was
// made.
//
// # Errors
//
// ErrInvalidSpec (a *FieldError) for a bad spec; ErrImageNotFound naming the
// image and the command that builds it; ErrEngineUnavailable when the engine
// or the runtime is missing; ErrSandboxFailed when the container does not
// come up.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	spec = spec.WithDefaults()
	if spec.Limits.OutputBytes > sandbox.MaxFileBytes {
		return nil, &sandbox.FieldError{Field: "limits.output_bytes", Message: fmt.Sprintf("%d is above the %d maximum", spec.Limits.OutputBytes, sandbox.MaxFileBytes)}
	}
	ref, err := ResolveImage(spec.Image)
	if err != nil {
		return nil, err
	}
	img, err := b.cli.ImageInspect(ctx, ref)
	if err != nil {
		if isNotFound(err) {
			return nil, imageNotFound(spec.Image, ref)
		}
		return nil, translate("inspect image "+ref, err)
	}
	cfg, hc := b.containerConfig(spec, img.ID)
	name := "rollbox-" + randomHex(6)
	now := time.Now()
	// The create itself is never abandoned midway: an engine that was asked
	// goes on making the container after the caller gives up (a warm pool
	// closing, an episode cancelled), so the call runs to its answer and a
	// container made for a caller that is gone is removed.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	created, err := b.cli.ContainerCreate(cctx, cfg, hc, nil, nil, name)
	cancel()
	if err != nil {
		return nil, translate("create container", err)
	}
	if err := context.Cause(ctx); err != nil {
		b.remove(created.ID)
		return nil, fmt.Errorf("create container: %w", err)
	}
	c := newContainer(b, created.ID, spec, ref, img.ID, now)
	if err := c.start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// containerConfig is the hardened configuration of spec's container.
func (b *Backend) containerConfig(spec sandbox.Spec, imageID string) (*container.Config, *container.HostConfig) {
	l := spec.Limits
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
	cfg := &container.Config{
		Image:           imageID,
		Entrypoint:      []string{GuestMountPath},
		Hostname:        spec.Hostname,
		User:            b.opts.User,
		WorkingDir:      spec.Workdir,
		Env:             []string{"PATH=" + defaultPath},
		OpenStdin:       true,
		AttachStdin:     true,
		AttachStdout:    true,
		AttachStderr:    true,
		StdinOnce:       false,
		Tty:             false,
		NetworkDisabled: spec.Network == sandbox.NetworkNone,
		Labels:          labels,
	}
	uid, gid := userIDs(b.opts.User)
	memory := int64(l.MemoryMB) << 20
	pids := int64(l.PIDs + guestThreads)
	if spec.Runtime == sandbox.RuntimeRunsc {
		// gVisor's sentry holds all the sandbox's memory and threads: when
		// the host's memory or pids limit is hit, the whole sandbox dies
		// (exit 2) instead of one command failing. So the guest enforces the
		// spec's limits inside (the memory guard, RLIMIT_NPROC, which gVisor
		// applies per sandbox) and the host limits sit above them as a
		// backstop: twice the memory plus the sentry's own, and a pids limit
		// the sentry's host threads never reach (2048 did, under a fork bomb
		// capped at 96 tasks inside).
		memory = memory*2 + 128<<20
		pids = 32768
	}
	noInit := false
	hc := &container.HostConfig{
		NetworkMode:    container.NetworkMode(spec.Network),
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		ReadonlyRootfs: true,
		Init:           &noInit,
		Runtime:        spec.Runtime,
		LogConfig:      container.LogConfig{Type: "none"}, // the protocol is not a log
		Mounts: []mount.Mount{{
			Type: mount.TypeBind, Source: b.opts.GuestPath, Target: GuestMountPath, ReadOnly: true,
		}},
		Tmpfs: map[string]string{
			spec.Workdir: fmt.Sprintf("rw,exec,nosuid,nodev,size=%dm,mode=0755,uid=%d,gid=%d", l.DiskMB, uid, gid),
			// Owned by the commands' user too: the engine copies the
			// image's /tmp mode over mode= (runc's tmpcopyup), and the
			// guest, as the owner, makes it 1777 again (guest.fixRootMode).
			"/tmp": fmt.Sprintf("rw,exec,nosuid,nodev,size=%dm,mode=1777,uid=%d,gid=%d", l.TmpMB, uid, gid),
		},
		Resources: container.Resources{
			Memory:     memory,
			MemorySwap: memory,
			NanoCPUs:   int64(l.CPUs * 1e9),
			PidsLimit:  &pids,
		},
	}
	b.opts.Unsafe.apply(hc)
	return cfg, hc
}

// userIDs parses "uid:gid" (numeric); anything else gives 0, 0.
func userIDs(user string) (int, int) {
	u, g, _ := strings.Cut(user, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil {
		return 0, 0
	}
	if err2 != nil {
		gid = uid
	}
	return uid, gid
}

const defaultPath = guesthost.DefaultPath

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Cleanup removes every container labelled with owner (running or not) and
// returns how many it removed: CleanupWhere for one owner. Safe to run
// twice and concurrently with itself.
func Cleanup(ctx context.Context, cli *client.Client, owner string) (int, error) {
	removed, err := removeContainers(ctx, cli, LabelOwner+"="+owner, nil)
	return len(removed), err
}

// RemoveFailures counts the containers this backend's sandboxes could not
// remove (Close returned the error): leftovers for `rollbox gc`.
func (b *Backend) RemoveFailures() int64 { return b.removeFailures.Load() }

// remove force-removes a container and returns once the engine says it does
// not exist. A remove that fails, or that the engine accepts while the
// container is still there (another removal in progress, an exit event it
// has not received yet), is retried with back-off for opts.RemoveTimeout.
func (b *Backend) remove(id string) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.RemoveTimeout)
	defer cancel()
	delay := 50 * time.Millisecond
	var last error
	attempt := 0
	for {
		attempt++
		var failed error
		err := b.cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
		switch {
		case err == nil || isNotFound(err) || isRemovalInProgress(err):
			in, ierr := b.cli.ContainerInspect(ctx, id)
			switch {
			case isNotFound(ierr):
				return nil
			case ierr != nil:
				failed = ierr
			default:
				state := "?"
				if in.State != nil {
					state = in.State.Status
				}
				failed = fmt.Errorf("still there (%s) after the engine accepted its removal (%v)", state, err)
			}
		default:
			failed = err
		}
		if ctx.Err() == nil || last == nil { // not the timeout's own error
			last = failed
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("remove container %s: %d attempts in %v, the last: %s: %w",
				id[:12], attempt, time.Since(start).Round(time.Millisecond), firstLine(last.Error()), sandbox.ErrSandboxFailed)
		case <-t.C:
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func isRemovalInProgress(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "already in progress") || strings.Contains(err.Error(), "is already being removed"))
}
