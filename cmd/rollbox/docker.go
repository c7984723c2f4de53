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
	guest := cfg.guest
	if guest == "" {
		var err error
		if guest, err = cfg.builder(progress).Build(ctx, guestTarget); err != nil {
			return nil, err
		}
	}
	// The process's lease marks its containers as live: `rollbox gc` (and
	// serve at start-up) removes only those whose lease no process holds.
	l, err := lease.Acquire(cfg.leaseDir)
	if err != nil {
		return nil, err
	}
	b, err := docker.New(ctx, docker.Options{GuestPath: guest, Owner: cfg.dockerOwner(),
		Labels: map[string]string{lease.LabelLease: l.Token(), lease.LabelHost: lease.Host()}})
	if err != nil {
		l.Release()
		return nil, err
	}
	return &leasedDocker{Backend: b, lease: l}, nil
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
