package main

import (
	"context"
	"io"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/internal/lease"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// guestTarget is the guest agent every container runs as PID 1.
var guestTarget = images.Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"}

// openDocker wires up the docker backend: the guest agent comes from
// $ROLLBOX_GUEST (a prebuilt static binary) or is built from this module's
// source, cached by content.
func openDocker(ctx context.Context, progress io.Writer, cfg config) (sandbox.Backend, error) {
	guest, l, err := guestAndLease(ctx, progress, cfg)
	if err != nil {
		return nil, err
	}
	b, err := docker.New(ctx, docker.Options{GuestPath: guest, Owner: cfg.dockerOwner(), Labels: leaseLabels(l)})
	if err != nil {
		l.Release()
		return nil, err
	}
	return &leasedDocker{Backend: b, lease: l}, nil
}

// guestAndLease is what a container backend needs first: the guest agent
// ($ROLLBOX_GUEST, or built from this module's source, cached by content)
// and this process's lease. The lease marks the process's containers as
// live: `rollbox gc` (and serve at start-up) removes only those whose
// lease no process holds. The caller releases it.
func guestAndLease(ctx context.Context, progress io.Writer, cfg config) (string, *lease.Lease, error) {
	guest := cfg.guest
	if guest == "" {
		var err error
		if guest, err = cfg.builder(progress).Build(ctx, guestTarget); err != nil {
			return "", nil, err
		}
	}
	l, err := lease.Acquire(cfg.leaseDir)
	if err != nil {
		return "", nil, err
	}
	return guest, l, nil
}

// leaseLabels label a container with the lease of the process that made it.
func leaseLabels(l *lease.Lease) map[string]string {
	return map[string]string{lease.LabelLease: l.Token(), lease.LabelHost: lease.Host()}
}

// leasedDocker is the docker backend holding this process's lease on its
// containers until it is closed.
type leasedDocker struct {
	*docker.Backend
	lease *lease.Lease
}

func (b *leasedDocker) Close() error {
	err := b.Backend.Close()
	b.lease.Release()
	return err
}

// Unwrap is the docker backend itself, for its optional capabilities.
func (b *leasedDocker) Unwrap() sandbox.Backend { return b.Backend }

// dockerOwner is the rollbox.owner label of the containers this process
// makes: $ROLLBOX_OWNER (serve's own, derived from its data directory),
// default "rollbox". `rollbox gc` removes them.
func (c config) dockerOwner() string {
	if c.owner != "" {
		return c.owner
	}
	return docker.DefaultOwner
}
