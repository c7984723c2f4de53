package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/internal/lease"
	"github.com/rollbox/rollbox/sandbox/containerd"
	"github.com/rollbox/rollbox/sandbox/docker"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

// newGCCmd is `rollbox gc [--owner NAME]`: it removes what crashed rollbox
// processes left on this host (gcAll). Running it twice is harmless, and so
// is running it beside live rollbox processes: their containers carry a
// lease a live process holds. --owner NAME removes every container of that
// owner label, live or not, for when you know nothing of it runs.
func newGCCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gc [--owner NAME]",
		Short: "Remove what crashed rollbox processes left: containers, mounts, temp dirs, leases",
		Long: `Remove what crashed rollbox processes left on this host: containers whose
process is gone (by lease), their mounts, image build directories, half-written
cache files and stale leases. What a live rollbox process uses is never touched,
so gc is safe beside running processes and safe to run twice. --owner NAME also
removes every container of that owner label, live or not.`,
		Args: noArgs,
	}
	owner := cmd.Flags().String("owner", "", "also remove every container whose rollbox.owner label is this `NAME`, live or not")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		var errs []error
		if *owner != "" {
			cli, err := docker.NewClient()
			if err != nil {
				return err
			}
			defer cli.Close()
			n, err := docker.Cleanup(ctx, cli, *owner)
			if err != nil {
				return err
			}
			fmt.Fprintf(env.stdout, "removed %d containers of owner %q\n", n, *owner)
			if containerdMayAnswer() {
				ccli, err := containerd.Dial(ctx, "", "")
				if err != nil {
					return err
				}
				defer ccli.Close()
				n, err := containerd.Cleanup(ctx, ccli, *owner)
				if err != nil {
					return err
				}
				fmt.Fprintf(env.stdout, "removed %d containerd containers of owner %q\n", n, *owner)
			}
		}
		errs = append(errs, gcAll(ctx, env.stdout, env.cfg))
		return errors.Join(errs...)
	}
	return cmd
}

// gcAll removes what crashed rollbox processes left on this host and
// reports each kind on w:
//
//   - docker containers (of any owner) whose process lease no live process
//     holds (openDocker labels every container with its process's lease),
//     and any mount the engine left of them;
//   - image build directories no build holds (a killed `images build`);
//   - half-written programs in the build cache and half-written compiled
//     modules in wazero's cache (the caches themselves stay);
//   - lease files no process holds.
//
// The WASM backend keeps an episode's state in memory only: it dies with its
// process and leaves nothing else. What a live process uses is never
// touched, so `rollbox serve` can call gcAll at start-up while other rollbox
// processes run. Without a docker engine the container step is skipped.
// Safe to run twice.
func gcAll(ctx context.Context, w io.Writer, cfg config) error {
	var errs []error
	leases := cfg.leaseDir
	host := lease.Host()

	removed, unleased, err := gcContainers(ctx, cfg, leases, host, "")
	switch {
	case errors.Is(err, errNoEngine):
		fmt.Fprintf(w, "gc: docker: no engine answers; no containers to remove\n")
	case err != nil:
		errs = append(errs, err)
	default:
		fmt.Fprintf(w, "gc: docker: removed %d orphaned containers", len(removed))
		if unleased > 0 {
			fmt.Fprintf(w, " (%d without a lease label left alone: remove them with --owner)", unleased)
		}
		fmt.Fprintln(w)
		mounts := docker.LeftoverMounts(removed)
		unmounted := 0
		for _, m := range mounts {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("gc: a mount of a removed container is left: %s: %v", m, err))
				continue
			}
			unmounted++
		}
		if len(mounts) > 0 {
			fmt.Fprintf(w, "gc: mounts: unmounted %d left by removed containers\n", unmounted)
		}
	}

	errs = append(errs, gcContainerdAll(ctx, w, leases, host, ""))

	dirs, err := docker.CleanupBuildDirs("")
	errs = append(errs, err)
	fmt.Fprintf(w, "gc: temp: removed %d image build directories%s\n", len(dirs), list(dirs))

	b := cfg.builder(nil)
	partial, err := b.CleanupPartial()
	errs = append(errs, err)
	compiled, err := wasm.CleanupCache(b.CacheDir, 10*time.Minute)
	errs = append(errs, err)
	fmt.Fprintf(w, "gc: cache: removed %d half-built programs and %d half-written compiled modules%s\n", len(partial), len(compiled), list(append(partial, compiled...)))

	n, err := lease.Sweep(leases)
	errs = append(errs, err)
	fmt.Fprintf(w, "gc: leases: removed %d lease files of dead processes\n", n)
	return errors.Join(errs...)
}

var errNoEngine = errors.New("no docker engine")

// gcOwner is rollbox serve's start-up clean-up: the containers of its own
// owner label that no live process holds (what its crashed predecessor on
// the same data directory left), and nothing of anyone else's. It reports
// on log.
func gcOwner(ctx context.Context, log *slog.Logger, cfg config) {
	removed, _, err := gcContainers(ctx, cfg, cfg.leaseDir, lease.Host(), cfg.owner)
	switch {
	case errors.Is(err, errNoEngine):
		log.Info("no docker engine answers; no orphaned containers to remove")
	case err != nil:
		log.Error("removing the containers a previous process left", "owner", cfg.owner, "err", err)
	}
	if len(removed) > 0 {
		log.Warn("removed containers a previous process left", "owner", cfg.owner, "containers", len(removed))
	}
	for _, m := range docker.LeftoverMounts(removed) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			log.Error("a mount of a removed container is left", "mount", m, "err", err)
		}
	}
	if err := gcContainerdAll(ctx, nil, cfg.leaseDir, lease.Host(), cfg.owner); err != nil {
		log.Error("removing the containerd sandboxes a previous process left", "owner", cfg.owner, "err", err)
	}
}

// gcContainers removes the containers whose lease is dead, and counts those
// carrying no lease (made by an older rollbox or by a test). With owner set
// it looks only at that owner's containers, and removes its unleased ones
// too (rollbox serve at start-up: its owner label is its data directory's,
// which it holds locked).
func gcContainers(ctx context.Context, cfg config, leases, host, owner string) (removed []string, unleased int, err error) {
	if !cfg.dockerEngineMayAnswer() {
		return nil, 0, errNoEngine
	}
	cli, err := docker.NewClient()
	if err != nil {
		return nil, 0, errNoEngine
	}
	defer cli.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(pctx); err != nil {
		return nil, 0, errNoEngine
	}
	var lerrs []error
	orphaned := orphanRule(leases, host, owner, &unleased, &lerrs)
	removed, err = docker.CleanupWhere(ctx, cli, func(c docker.Candidate) bool {
		return orphaned(c.Labels, c.Running, c.Created)
	})
	return removed, unleased, errors.Join(append(lerrs, err)...)
}

// orphanRule says which sandbox (container) is an orphan by its labels:
// one whose process lease is dead, or (with owner set) one of that owner's
// without a lease. It counts the unleased ones and collects lease errors.
func orphanRule(leases, host, owner string, unleased *int, lerrs *[]error) func(labels map[string]string, running bool, created time.Time) bool {
	return func(labels map[string]string, running bool, created time.Time) bool {
		if owner != "" && labels[docker.LabelOwner] != owner {
			return false
		}
		token := labels[lease.LabelLease]
		if token == "" {
			*unleased++
			return owner != ""
		}
		if labels[lease.LabelHost] != host {
			return false // another host's process: its lease is not visible here
		}
		st, err := lease.Check(leases, token)
		if err != nil {
			*lerrs = append(*lerrs, err)
			return false
		}
		// A missing lease is a released one or a reboot's (then nothing
		// runs), or one in another lease directory: a container that runs,
		// or was made in the last minute (it may be starting), is left.
		return st == lease.Dead || (st == lease.Missing && !running && time.Since(created) > time.Minute)
	}
}

// gcContainerdAll is gcContainerd with the lease rule (owner "" for any),
// reported on w.
func gcContainerdAll(ctx context.Context, w io.Writer, leases, host, owner string) error {
	var lerrs []error
	unleased := 0
	removed, err := gcContainerd(ctx, orphanRule(leases, host, owner, &unleased, &lerrs))
	if errors.Is(err, errNoEngine) {
		if w != nil {
			fmt.Fprintf(w, "gc: containerd: not reachable; no containers to remove\n")
		}
		return nil
	}
	if w != nil {
		fmt.Fprintf(w, "gc: containerd: removed %d orphaned containers with their snapshots and leases\n", len(removed))
	}
	return errors.Join(append(lerrs, err)...)
}

func list(paths []string) string {
	if len(paths) == 0 {
		return ""
	}
	if len(paths) > 5 {
		paths = append(paths[:5:5], "...")
	}
	return ": " + strings.Join(paths, " ")
}
