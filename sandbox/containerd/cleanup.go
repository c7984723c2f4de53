package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"golang.org/x/sys/unix"
)

// Candidate is a container CleanupWhere asks about.
type Candidate struct {
	ID      string
	Labels  map[string]string
	Running bool
	Created time.Time
}

// CleanupWhere removes every container in cli's namespace carrying an
// owner label (any owner) for which orphan says yes — its task, the
// container, its snapshots, its lease — and returns the ids it removed,
// and the files on the host under stateDir ("" for the default) of
// backends whose process is gone. Then it
// deletes the leases of sandboxes whose container is gone and the fork
// leases for which orphan says yes about their labels, so containerd's
// garbage collector takes their snapshots. Safe to run twice and
// concurrently with itself.
func CleanupWhere(ctx context.Context, cli *client.Client, stateDir string, orphan func(Candidate) bool) ([]string, error) {
	if stateDir == "" {
		stateDir = "/run/rollbox/containerd"
	}
	ctx = context.WithoutCancel(ctx)
	list, err := cli.Containers(ctx, `labels."`+LabelOwner+`"`)
	if err != nil {
		return nil, translate("list containers", err)
	}
	var removed []string
	var errs []error
	for _, ctr := range list {
		info, err := ctr.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil {
			continue
		}
		running := false
		task, terr := ctr.Task(ctx, nil)
		if terr == nil {
			if st, err := task.Status(ctx); err == nil && st.Status == client.Running {
				running = true
			}
		}
		if orphan != nil && !orphan(Candidate{ID: ctr.ID(), Labels: info.Labels, Running: running, Created: info.CreatedAt}) {
			continue
		}
		c := &Container{b: &Backend{cli: cli, opts: Options{StateDir: stateDir}}, id: ctr.ID(), ctr: ctr}
		if terr == nil {
			c.task = task
		}
		if err := c.b.removeOnce(ctx, c); err != nil {
			errs = append(errs, translate("remove container "+ctr.ID(), err))
			continue
		}
		removed = append(removed, ctr.ID())
	}
	if err := releaseDeadInstances(stateDir); err != nil {
		errs = append(errs, err)
	}
	if err := removeLeases(ctx, cli, orphan); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// Cleanup removes every container labelled with owner (running or not) and
// returns how many it removed.
func Cleanup(ctx context.Context, cli *client.Client, owner string) (int, error) {
	removed, err := CleanupWhere(ctx, cli, "", func(c Candidate) bool { return c.Labels[LabelOwner] == owner })
	return len(removed), err
}

// releaseDeadInstances unmounts and removes the state directories of
// backends whose process is gone (their lock is free): the files of their
// sandboxes, which no one can reach any more.
func releaseDeadInstances(stateDir string) error {
	dirs, _ := filepath.Glob(filepath.Join(stateDir, "i-*"))
	var errs []error
	for _, d := range dirs {
		f, err := os.OpenFile(filepath.Join(d, "lock"), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue // alive
		}
		points := Mounts(d)
		// The deepest first; each point may hold more than one mount.
		sort.Sort(sort.Reverse(sort.StringSlice(points)))
		for _, p := range points {
			for range 4 {
				if unix.Unmount(p, unix.MNT_DETACH) != nil {
					break
				}
			}
		}
		if left := Mounts(d); len(left) > 0 {
			errs = append(errs, fmt.Errorf("state directory %s: %d mounts left", d, len(left)))
		} else if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
		f.Close()
	}
	return errors.Join(errs...)
}

// removeLeases deletes sandbox leases whose container is gone, and fork
// leases orphan says yes about (by their labels).
func removeLeases(ctx context.Context, cli *client.Client, orphan func(Candidate) bool) error {
	ls := cli.LeasesService()
	all, err := ls.List(ctx)
	if err != nil {
		return translate("list leases", err)
	}
	var errs []error
	for _, l := range all {
		if _, ok := l.Labels[LabelOwner]; !ok {
			continue
		}
		var gone bool
		switch {
		case strings.HasPrefix(l.ID, forkLeasePrefix):
			gone = orphan == nil || orphan(Candidate{ID: l.ID, Labels: l.Labels, Created: l.CreatedAt})
		case strings.HasPrefix(l.ID, leasePrefix):
			_, err := cli.LoadContainer(ctx, strings.TrimPrefix(l.ID, leasePrefix))
			gone = isNotFound(err) && time.Since(l.CreatedAt) > time.Minute
		}
		if !gone {
			continue
		}
		if err := ls.Delete(ctx, leases.Lease{ID: l.ID}); err != nil && !isNotFound(err) {
			errs = append(errs, translate("delete lease "+l.ID, err))
		}
	}
	return errors.Join(errs...)
}

// Mounts lists the host's mount points under stateDir ("" for the
// default): the files of sandboxes (see Backend.Mounts for one backend's).
func Mounts(stateDir string) []string {
	if stateDir == "" {
		stateDir = "/run/rollbox/containerd"
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.HasPrefix(f[4], stateDir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// Mounts lists the host's mount points of this backend's sandboxes' files.
func (b *Backend) Mounts() []string {
	inst, err := b.instance()
	if err != nil {
		return nil
	}
	return Mounts(inst.dir)
}
