package docker

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
)

// buildDirPrefix names the temporary directories BuildImage fills.
const buildDirPrefix = "rollbox-image-"

// Candidate is a container CleanupWhere asks about.
type Candidate struct {
	ID      string
	Labels  map[string]string
	Running bool
	Created time.Time
}

// CleanupWhere removes every container carrying an owner label (any owner)
// for which orphan says yes, and returns the full ids it removed. Safe to
// run twice and concurrently with itself: a container already gone is not
// an error.
func CleanupWhere(ctx context.Context, cli *client.Client, orphan func(Candidate) bool) ([]string, error) {
	return removeContainers(ctx, cli, LabelOwner, orphan)
}

// removeContainers removes the containers matching a label filter ("KEY"
// or "KEY=VALUE") for which orphan (nil: every one) says yes, and returns
// the full ids it removed; one already gone is not an error.
func removeContainers(ctx context.Context, cli *client.Client, label string, orphan func(Candidate) bool) ([]string, error) {
	list, err := cli.ContainerList(ctx, container.ListOptions{
		All: true, Filters: filters.NewArgs(filters.Arg("label", label)),
	})
	if err != nil {
		return nil, translate("list containers", err)
	}
	var removed []string
	var errs []error
	for _, c := range list {
		if orphan != nil && !orphan(Candidate{ID: c.ID, Labels: c.Labels, Running: c.State == "running", Created: time.Unix(c.Created, 0)}) {
			continue
		}
		err := cli.ContainerRemove(context.WithoutCancel(ctx), c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		switch {
		case err == nil:
			removed = append(removed, c.ID)
		case isNotFound(err) || isRemovalInProgress(err):
		default:
			errs = append(errs, translate("remove container "+c.ID[:12], err))
		}
	}
	return removed, errors.Join(errs...)
}

// CleanupBuildDirs removes the image build directories in tmpDir ("" means
// os.TempDir()) that no build holds and that are older than a minute: what
// an image build killed midway left. It returns the paths it removed.
func CleanupBuildDirs(tmpDir string) ([]string, error) {
	if tmpDir == "" {
		tmpDir = os.TempDir()
	}
	matches, err := filepath.Glob(filepath.Join(tmpDir, buildDirPrefix+"*"))
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, dir := range matches {
		st, err := os.Lstat(dir)
		if err != nil || !st.IsDir() || time.Since(st.ModTime()) < time.Minute {
			continue
		}
		f, err := os.Open(dir)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			if err := os.RemoveAll(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			} else {
				removed = append(removed, dir)
			}
		}
		f.Close()
	}
	return removed, errors.Join(errs...)
}

// LeftoverMounts lists the host's mount points that name one of ids (a
// container's shm or bind mounts the engine failed to unmount).
func LeftoverMounts(ids []string) []string {
	if len(ids) == 0 {
		return nil
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		for _, id := range ids {
			if strings.Contains(f[4], id) {
				out = append(out, f[4])
				break
			}
		}
	}
	return out
}
