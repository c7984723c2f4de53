package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/rollbox/rollbox/sandbox"
)

// A fork's files: the parent's workdir and /tmp copied once into a
// committed snapshot (layer), which every child mounts as the read-only
// lower layer of an overlay whose upper layer is the child's own
// size-limited tmpfs. A child pays only for what it writes.
type forkLayer struct {
	snapshot string // the committed snapshot's name
}

// forkViewPrefix names a child's view of its fork snapshot.
const forkViewPrefix = "rollbox-fork-view-"

// layer directories inside a fork snapshot.
const (
	layerWork = "work"
	layerTmp  = "tmp"
)

// Fork makes n sandboxes of this one's spec whose workdir and /tmp hold the
// files this one has now (sandbox.Forker): the files are copied once, from
// the host's side of the container's mount namespace, into a containerd
// snapshot that is committed; each child mounts a view of it under an
// overlay (copy-on-write) with its own tmpfs on top, sized like the
// parent's. Processes are not forked. Under runsc (gVisor keeps the files
// in its sentry's memory, out of the host's reach) the files are copied
// into each child through the guests instead (sandbox.CopyFiles).
//
// # Errors
//
// All or nothing (see sandbox.Forker). ErrInvalidSpec for n out of range.
func (c *Container) Fork(ctx context.Context, n int) ([]sandbox.Sandbox, error) {
	if err := sandbox.CheckFork(n); err != nil {
		return nil, err
	}
	if c.IsClosed() {
		return nil, fmt.Errorf("fork sandbox %s: %w", c.id, sandbox.ErrClosed)
	}
	if err := c.Broken(); err != nil {
		return nil, err
	}
	if c.spec.Runtime == sandbox.RuntimeRunsc {
		kids, err := sandbox.CreateAll(ctx, n, func(ctx context.Context) (sandbox.Sandbox, error) { return c.b.Create(ctx, c.spec) })
		if err != nil {
			return nil, err
		}
		if err := sandbox.CopyFiles(ctx, c, kids, c.spec.Workdir, "/tmp"); err != nil {
			sandbox.CloseAll(kids)
			return nil, err
		}
		return kids, nil
	}
	layer, done, err := c.commitLayer(ctx)
	if err != nil {
		return nil, err
	}
	// The layer's lease goes once every child holds a view of it (a
	// snapshot is kept while a view of it is); on failure, with them.
	defer done()
	return sandbox.CreateAll(ctx, n, func(ctx context.Context) (sandbox.Sandbox, error) {
		return c.b.create(ctx, c.spec, layer)
	})
}

// commitLayer copies the sandbox's workdir and /tmp into a new snapshot and
// commits it, under a lease that done deletes.
func (c *Container) commitLayer(ctx context.Context) (*forkLayer, func(), error) {
	b := c.b
	ctx = context.WithoutCancel(ctx)
	id := randomHex(8)
	labels := map[string]string{LabelOwner: b.opts.Owner}
	for k, v := range b.opts.Labels {
		labels[k] = v
	}
	// Expiring: a process that dies before done leaves nothing containerd
	// keeps for long.
	l, err := b.cli.LeasesService().Create(ctx, leases.WithID(forkLeasePrefix+id), leases.WithLabels(labels),
		leases.WithExpiration(time.Hour))
	if err != nil {
		return nil, nil, translate("create fork lease", err)
	}
	done := func() {
		b.cli.LeasesService().Delete(context.Background(), l)
	}
	lctx := leases.WithLease(ctx, l.ID)
	sn := b.cli.SnapshotService(Snapshotter)
	key := "rollbox-fork-prepare-" + id
	mounts, err := sn.Prepare(lctx, key, "")
	if err != nil {
		done()
		return nil, nil, translate("prepare fork snapshot", err)
	}
	dir, err := bindSource(mounts)
	if err != nil {
		done()
		return nil, nil, err
	}
	pid := int(c.task.Pid())
	root := "/proc/" + strconv.Itoa(pid) + "/root"
	for _, r := range []struct{ from, to string }{{c.spec.Workdir, layerWork}, {"/tmp", layerTmp}} {
		if err := copyTree(root+r.from, filepath.Join(dir, r.to)); err != nil {
			done()
			return nil, nil, fmt.Errorf("fork sandbox %s: copy %s: %v: %w", c.id, r.from, err, sandbox.ErrSandboxFailed)
		}
	}
	// The task's pid names the same process only while it runs: a
	// container that died meanwhile could have given its pid away.
	if st, err := c.task.Status(ctx); err != nil || st.Status != "running" || c.task.Pid() != uint32(pid) {
		done()
		return nil, nil, fmt.Errorf("fork sandbox %s: the task stopped while its files were copied: %w", c.id, sandbox.ErrSandboxFailed)
	}
	name := "rollbox-fork-" + id
	if err := sn.Commit(lctx, name, key); err != nil {
		done()
		return nil, nil, translate("commit fork snapshot", err)
	}
	return &forkLayer{snapshot: name}, done, nil
}

// bindSource is the directory a snapshot without parents is: its one bind
// mount's source.
func bindSource(mounts []mount.Mount) (string, error) {
	if len(mounts) != 1 || mounts[0].Type != "bind" {
		return "", fmt.Errorf("snapshotter %s gave %d mounts (%v) for a snapshot without parents, want one bind mount: %w", Snapshotter, len(mounts), mounts, sandbox.ErrSandboxFailed)
	}
	return mounts[0].Source, nil
}

// mounts gives a child its workdir and /tmp: a view of the layer (held by
// the child's lease) as the lower directory of an overlay whose upper and
// work directories are on a tmpfs of the spec's size, made for the child
// on the host.
func (f *forkLayer) mounts(ctx context.Context, b *Backend, id string, spec sandbox.Spec) ([]specs.Mount, error) {
	view, err := b.cli.SnapshotService(Snapshotter).View(ctx, forkViewPrefix+id, f.snapshot)
	if err != nil {
		return nil, translate("view of fork snapshot "+f.snapshot, err)
	}
	lower, err := viewSource(view)
	if err != nil {
		return nil, err
	}
	base := filepath.Join(b.opts.StateDir, "upper", id)
	var out []specs.Mount
	for _, r := range []struct {
		dest, layer string
		sizeMB      int
		mode        os.FileMode
	}{{spec.Workdir, layerWork, spec.Limits.DiskMB, 0o755}, {"/tmp", layerTmp, spec.Limits.TmpMB, 0o1777}} {
		dir := filepath.Join(base, r.layer)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("fork upper directory: %v: %w", err, sandbox.ErrSandboxFailed)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.Itoa(r.sizeMB)+"m,mode=0700"); err != nil {
			return nil, fmt.Errorf("fork upper tmpfs %s: %v: %w", dir, err, sandbox.ErrSandboxFailed)
		}
		upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
		for _, d := range []string{upper, work} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return nil, fmt.Errorf("fork upper directory: %v: %w", err, sandbox.ErrSandboxFailed)
			}
		}
		// The merged root takes the upper root's owner and mode.
		if err := os.Chown(upper, uid, gid); err == nil {
			err = os.Chmod(upper, r.mode)
		}
		out = append(out, specs.Mount{
			Destination: r.dest, Type: "overlay", Source: "overlay",
			Options: []string{"lowerdir=" + filepath.Join(lower, r.layer), "upperdir=" + upper, "workdir=" + work, "nosuid", "nodev"},
		})
	}
	return out, nil
}

// viewSource is the directory of a read-only view of a one-layer snapshot.
func viewSource(mounts []mount.Mount) (string, error) {
	for _, m := range mounts {
		if m.Type == "bind" {
			return m.Source, nil
		}
		for _, o := range m.Options {
			if v, ok := cutPrefix(o, "lowerdir="); ok {
				return v, nil
			}
		}
	}
	return "", fmt.Errorf("snapshotter %s gave no directory for a fork view (%v): %w", Snapshotter, mounts, sandbox.ErrSandboxFailed)
}

// release unmounts a child's tmpfs and removes its directories.
func (f *forkLayer) release(b *Backend, id string) error {
	base := filepath.Join(b.opts.StateDir, "upper", id)
	var errs []error
	for _, l := range []string{layerWork, layerTmp} {
		dir := filepath.Join(base, l)
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", dir, err))
		}
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(base); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
