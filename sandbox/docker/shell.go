package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/rollbox/rollbox/sandbox"
)

// ImageID is the local image a Spec's image names (a recipe, docker:NAME:TAG,
// or docker:sha256:ID), as its content id ("sha256:..."): what Info reports
// as ImageDigest. Replay compares it with a trajectory's.
//
// # Errors
//
// ErrImageNotFound naming the image and how to make it; ErrInvalidSpec for a
// name that is neither a recipe nor docker:...
func (b *Backend) ImageID(ctx context.Context, image string) (string, error) {
	ref, err := ResolveImage(image)
	if err != nil {
		return "", err
	}
	img, err := b.cli.ImageInspect(ctx, ref)
	if err != nil {
		if isNotFound(err) {
			return "", imageNotFound(image, ref)
		}
		return "", translate("inspect image "+ref, err)
	}
	return img.ID, nil
}

// ShellOptions configure Container.Shell.
type ShellOptions struct {
	// Argv is the program (default /bin/sh).
	Argv   []string
	Stdin  io.Reader
	Stdout io.Writer
	// TTY gives the program a terminal (the caller puts its own in raw
	// mode); without one, stdout and stderr both go to Stdout.
	TTY bool
	// Width and Height are the terminal's size, in cells.
	Width, Height uint
	// Resize, if set, carries the caller's new sizes as [width, height]
	// until it is closed or the program ends.
	Resize <-chan [2]uint
}

// Shell runs an interactive program in the container (default /bin/sh) as
// the sandbox's user, in its workdir, with its environment, attached to the
// caller's streams through a hijacked connection to the engine, and returns
// its exit code. It is for people (rollbox replay --shell), not for agents:
// the guest's limits on one command do not apply, the container's do.
//
// The copy from Stdin ends when Stdin ends or, after the program has
// exited, at its next read; a terminal's reader is left blocked in that read
// until the user types (the caller is about to exit).
func (c *Container) Shell(ctx context.Context, opts ShellOptions) (int, error) {
	if c.IsClosed() {
		return 0, fmt.Errorf("sandbox %s: %w", c.info.ID, sandbox.ErrClosed)
	}
	argv := opts.Argv
	if len(argv) == 0 {
		argv = []string{"/bin/sh"}
	}
	eo := container.ExecOptions{
		User: c.b.opts.User, Tty: opts.TTY, AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Env: c.Env(nil), WorkingDir: c.spec.Workdir, Cmd: argv,
	}
	var size *[2]uint
	if opts.TTY && opts.Width > 0 && opts.Height > 0 {
		size = &[2]uint{opts.Height, opts.Width}
		eo.ConsoleSize = size
	}
	created, err := c.b.cli.ContainerExecCreate(ctx, c.id, eo)
	if err != nil {
		return 0, translate("exec in container "+c.info.ID, err)
	}
	hj, err := c.b.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{Tty: opts.TTY, ConsoleSize: size})
	if err != nil {
		return 0, translate("attach to exec in container "+c.info.ID, err)
	}
	defer hj.Close()

	out := make(chan error, 1)
	go func() {
		var err error
		if opts.TTY {
			_, err = io.Copy(opts.Stdout, hj.Reader)
		} else {
			_, err = stdcopy.StdCopy(opts.Stdout, opts.Stdout, hj.Reader)
		}
		out <- err
	}()
	if opts.Stdin != nil {
		go func() {
			io.Copy(hj.Conn, opts.Stdin)
			if !opts.TTY { // with a terminal the engine would end the output too
				hj.CloseWrite()
			}
		}()
	}
	done := make(chan struct{})
	defer close(done)
	if opts.Resize != nil {
		go func() {
			for {
				select {
				case <-done:
					return
				case sz, ok := <-opts.Resize:
					if !ok {
						return
					}
					c.b.cli.ContainerExecResize(ctx, created.ID, container.ResizeOptions{Width: sz[0], Height: sz[1]})
				}
			}
		}()
	}
	select {
	case err = <-out:
	case <-ctx.Done():
		hj.Close()
		<-out
		return 0, ctx.Err()
	}
	if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("sandbox %s: shell stream: %v: %w", c.info.ID, err, sandbox.ErrSandboxFailed)
	}
	// The stream ends as the program exits; the engine may record the exit
	// a moment later.
	for i := 0; ; i++ {
		st, err := c.b.cli.ContainerExecInspect(context.WithoutCancel(ctx), created.ID)
		if err != nil {
			return 0, translate("inspect exec in container "+c.info.ID, err)
		}
		if !st.Running || i == 100 {
			return st.ExitCode, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}
