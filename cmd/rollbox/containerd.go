package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rollbox/rollbox/internal/lease"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// openContainerd wires up the containerd backend, with the same guest agent
// and process lease as openDocker.
// forkSpares is Options.ForkSpares.
func openContainerd(ctx context.Context, progress io.Writer, cfg config, forkSpares int) (sandbox.Backend, error) {
	guest, l, err := guestAndLease(ctx, progress, cfg)
	if err != nil {
		return nil, err
	}
	b, err := containerd.New(ctx, containerd.Options{GuestPath: guest, Owner: cfg.dockerOwner(), Labels: leaseLabels(l), ForkSpares: forkSpares})
	if err != nil {
		l.Release()
		return nil, err
	}
	return &leasedContainerd{Backend: b, lease: l}, nil
}

// leasedContainerd is the containerd backend holding this process's lease
// on its containers until it is closed.
type leasedContainerd struct {
	*containerd.Backend
	lease *lease.Lease
}

func (b *leasedContainerd) Close() error {
	err := b.Backend.Close()
	b.lease.Release()
	return err
}

// Unwrap is the containerd backend itself, for its optional capabilities.
func (b *leasedContainerd) Unwrap() sandbox.Backend { return b.Backend }

// containerdMayAnswer reports whether containerd's socket is there.
func containerdMayAnswer() bool {
	_, err := os.Stat(containerd.DefaultAddress)
	return err == nil
}

// importIntoContainerd imports each built image into containerd's
// namespace, reporting a line for each on w.
func importIntoContainerd(ctx context.Context, w io.Writer, built []docker.BuiltImage, save func(ctx context.Context, refs []string) (io.ReadCloser, error)) error {
	if !containerdMayAnswer() {
		fmt.Fprintf(w, "containerd: no socket at %s; images not imported there\n", containerd.DefaultAddress)
		return nil
	}
	cli, err := containerd.Dial(ctx, "", "")
	if err != nil {
		return err
	}
	defer cli.Close()
	for _, img := range built {
		start := time.Now()
		_, hash, _ := strings.Cut(img.Ref, ":")
		im, err := containerd.ImportRecipe(ctx, cli, img.Recipe, hash, func(refs []string) (io.ReadCloser, error) {
			return save(ctx, refs)
		})
		if err != nil {
			return err
		}
		if im.ID != img.ID {
			return fmt.Errorf("containerd: %s has id %s there, %s in docker: %w", im.Ref, im.ID, img.ID, sandbox.ErrSandboxFailed)
		}
		state := "up to date"
		if im.Imported {
			state = fmt.Sprintf("imported in %v", time.Since(start).Round(100*time.Millisecond))
		}
		fmt.Fprintf(w, "containerd:%s\t%s\t%s\n", im.Ref, im.ID, state)
	}
	return nil
}

// gcContainerd removes the containerd sandboxes whose process lease is dead
// (the same rule as Docker's, orphaned), their snapshots, leases and fork
// mounts.
func gcContainerd(ctx context.Context, orphaned func(labels map[string]string, running bool, created time.Time) bool) ([]string, error) {
	if !containerdMayAnswer() {
		return nil, errNoEngine
	}
	cli, err := containerd.Dial(ctx, "", "")
	if err != nil {
		if errors.Is(err, sandbox.ErrEngineUnavailable) {
			return nil, errNoEngine
		}
		return nil, err
	}
	defer cli.Close()
	return containerd.CleanupWhere(ctx, cli, "", func(c containerd.Candidate) bool {
		return orphaned(c.Labels, c.Running, c.Created)
	})
}
