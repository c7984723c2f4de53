package docker

import (
	"context"
	"fmt"

	"github.com/rollbox/rollbox/sandbox"
)

// Fork makes n containers of this one's spec holding the files this one
// has now in its workdir and /tmp (sandbox.Forker), not its processes.
//
// Docker cannot snapshot a sandbox's files: they are on tmpfs mounts, which
// `docker commit` leaves out, and checkpoints need CRIU (experimental, and
// absent here). So this is the best the engine allows: n fresh containers
// made at once, then the files copied into each through the guests
// (sandbox.CopyFiles): each file read once, written n times. It costs a
// cold start plus O(size × n); the containerd backend's fork is
// copy-on-write.
//
// # Errors
//
// All or nothing (see sandbox.Forker).
func (c *Container) Fork(ctx context.Context, n int) ([]sandbox.Sandbox, error) {
	if err := sandbox.CheckFork(n); err != nil {
		return nil, err
	}
	if c.IsClosed() {
		return nil, fmt.Errorf("fork sandbox %s: %w", c.info.ID, sandbox.ErrClosed)
	}
	if err := c.Broken(); err != nil {
		return nil, err
	}
	// Walk first: a tree over the copy budget is refused before any
	// child is made (ErrTooLarge, the sandbox's doing).
	plan, err := sandbox.PlanCopy(ctx, c, c.spec.Workdir, "/tmp")
	if err != nil {
		return nil, err
	}
	defer plan.Release(context.WithoutCancel(ctx))
	kids, err := sandbox.CreateAll(ctx, n, func(ctx context.Context) (sandbox.Sandbox, error) { return c.b.Create(ctx, c.spec) })
	if err != nil {
		return nil, err
	}
	if err := plan.CopyTo(ctx, kids); err != nil {
		sandbox.CloseAll(kids)
		return nil, err
	}
	if err := plan.Release(ctx); err != nil {
		sandbox.CloseAll(kids)
		return nil, err
	}
	return kids, nil
}

var _ sandbox.Forker = (*Container)(nil)
