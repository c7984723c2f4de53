package docker

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/rollbox/rollbox/internal/guesthost"
	"github.com/rollbox/rollbox/sandbox"
)

// Container is one sandbox: a container whose PID 1 is the guest agent.
// Exec, ReadFile, WriteFile and ListFiles go through the guest
// (guesthost.Conn).
type Container struct {
	*guesthost.Conn
	b      *Backend
	id     string
	spec   sandbox.Spec
	info   sandbox.Info
	hijack types.HijackedResponse
	demux  chan struct{}  // closed when the attach stream has ended
	pr     *io.PipeReader // the guest's stdout, demultiplexed; read by guest

	created time.Time // before the container was created: its engine events start after

	closeOnce sync.Once
	closeErr  error
	// paused: Diagnose found the container paused (by the engine, from
	// outside); Close unpauses it before the removal.
	paused atomic.Bool
}

func newContainer(b *Backend, id string, spec sandbox.Spec, ref, imageID string, created time.Time) *Container {
	c := &Container{
		b: b, id: id, spec: spec, demux: make(chan struct{}), created: created,
		info: sandbox.Info{
			ID: id[:12], Backend: "docker", Image: ref, ImageDigest: imageID, Runtime: spec.Runtime,
			Network: spec.Network, Limits: spec.Limits, Workdir: spec.Workdir,
		},
	}
	c.Conn = guesthost.New(guesthost.Config{
		ID: c.info.ID, Spec: spec, GuestTimeout: b.opts.GuestTimeout, Engine: c, Cut: c.cut,
	})
	return c
}

// start attaches (before the start, so nothing the guest says is lost),
// starts the container and says hello to the guest.
func (c *Container) start(ctx context.Context) error {
	var err error
	c.hijack, err = c.b.cli.ContainerAttach(ctx, c.id, container.AttachOptions{
		Stream: true, Stdin: true, Stdout: true, Stderr: true,
	})
	if err != nil {
		close(c.demux)
		return translate("attach to container "+c.info.ID, err)
	}
	pr, pw := io.Pipe()
	c.pr = pr
	go func() {
		defer close(c.demux)
		_, err := stdcopy.StdCopy(pw, c.Log(), c.hijack.Reader)
		pw.CloseWithError(err) // nil: io.EOF for the reader
	}()
	c.Attach(pr, c.hijack.Conn)
	if err := c.b.cli.ContainerStart(ctx, c.id, container.StartOptions{}); err != nil {
		return translate("start container "+c.info.ID, err)
	}
	return c.Hello(ctx)
}

// Info describes the sandbox as it runs.
func (c *Container) Info() sandbox.Info { return c.info }

// cut ends the attach stream so every pending call ends with verdict.
func (c *Container) cut(verdict error) {
	if c.hijack.Conn != nil {
		c.hijack.Close()
	}
	if c.pr != nil {
		c.pr.CloseWithError(verdict)
	}
}

// Diagnose is the engine's account of the container, for the verdict on a
// broken guest (guesthost.Engine): removed from outside, or asked by the
// engine to kill, stop or pause it (its events say so; a signal from inside
// leaves no such event), or paused, is the engine's doing.
//
// dockerd learns of an OOM kill from an event of its own, which it may handle
// after the container's exit: inspected at once, a guest the OOM killer
// ended (exit status 137) can look merely killed, and its verdict would be
// the engine's failure instead of what the commands left filling its
// memory. So a guest ended by SIGKILL that the engine was not asked to kill
// is looked at again until the OOM kill shows or oomSettle has passed.
func (c *Container) Diagnose(ctx context.Context) guesthost.Diagnosis {
	in, err := c.b.cli.ContainerInspect(ctx, c.id)
	switch {
	case isNotFound(err):
		return guesthost.Diagnosis{Err: fmt.Errorf("the container was removed from outside: %w", sandbox.ErrSandboxFailed)}
	case err != nil:
		return guesthost.Diagnosis{Err: translate("inspect the container", err)}
	}
	var d guesthost.Diagnosis
	action := c.engineAction(ctx)
	if in.State != nil && action == "" && in.State.ExitCode == 128+int(syscall.SIGKILL) && !in.State.OOMKilled &&
		(in.State.Status == "exited" || in.State.Status == "dead") {
		in.State.OOMKilled = c.oomShows(ctx)
	}
	if in.State != nil {
		d.State = fmt.Sprintf("container %s, exit code %d", in.State.Status, in.State.ExitCode)
		if in.State.OOMKilled {
			d.State += ", OOM-killed"
		}
		d.Exited = in.State.Status == "exited" || in.State.Status == "dead"
		d.ExitStatus = in.State.ExitCode
		d.OOMKilled = in.State.OOMKilled
	}
	if action != "" {
		d.Infra = "the engine was asked to " + action + " the container"
	} else if in.State != nil && in.State.Paused {
		d.Infra = "the container is paused"
	}
	if in.State != nil && in.State.Paused {
		c.paused.Store(true)
	}
	return d
}

// oomSettle is how long Diagnose waits for dockerd to record the OOM kill
// of a guest that ended by SIGKILL. 2 s was not enough on a host at load
// ~15 (a clean-clone CI run: the conformance case "a file read that needs
// more memory than the commands left" judged the infrastructure's after
// 2.9 s), and the wait is paid only by a guest SIGKILLed without the
// engine's doing, which is rare otherwise.
const oomSettle = 10 * time.Second

// oomShows says whether the engine records an OOM kill of the container
// within oomSettle. dockerd sets the state's flag in the same handler that
// emits its "oom" event, so the state alone is looked at.
func (c *Container) oomShows(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, oomSettle)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if in, err := c.b.cli.ContainerInspect(ctx, c.id); err == nil && in.State != nil && in.State.OOMKilled {
				return true
			}
		case <-ctx.Done():
			return false
		}
	}
}

// engineAction names what the engine was asked to do to the container since
// it was created that breaks its guest ("kill (signal 9)", "pause",
// "stop"), or "" when nothing: a command's signal to PID 1 leaves no event.
func (c *Container) engineAction(ctx context.Context) string {
	now := time.Now()
	msgs, errs := c.b.cli.Events(ctx, events.ListOptions{
		Since: strconv.FormatInt(c.created.Add(-time.Second).Unix(), 10),
		Until: fmt.Sprintf("%d.%09d", now.Unix(), now.Nanosecond()),
		Filters: filters.NewArgs(filters.Arg("type", string(events.ContainerEventType)),
			filters.Arg("container", c.id)),
	})
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return ""
			}
			switch m.Action {
			case events.ActionKill:
				return "kill (signal " + m.Actor.Attributes["signal"] + ")"
			case events.ActionStop, events.ActionPause, events.ActionRestart, events.ActionDestroy:
				return string(m.Action)
			}
		case <-errs:
			return ""
		case <-ctx.Done():
			return ""
		}
	}
}

// Close ends every call in flight (they fail with ErrClosed), closes the
// attach connection and force-removes the container with its volumes, and
// returns once the engine says the container does not exist. Idempotent and
// safe to call concurrently; it runs to the end even if the caller's context
// is gone.
//
// # Errors
//
// A remove that fails (dockerd under load: "did not receive an exit event",
// "PID ... is zombie"), or that the engine accepts while the container is
// still there, is retried with back-off for Options.RemoveTimeout; then
// Close returns an ErrSandboxFailed naming the container, the attempts and
// the last failure, and Backend.RemoveFailures counts it. `rollbox gc`
// removes such a container later.
func (c *Container) Close() error {
	c.closeOnce.Do(func() {
		c.MarkClosed()
		if c.hijack.Conn != nil {
			c.hijack.Close()
		}
		if c.pr != nil {
			// The demultiplexer may be blocked writing to a reader that
			// stopped at a bad frame (a command wrote into the guest's
			// stream): closing the conn alone would not end it.
			c.pr.CloseWithError(sandbox.ErrClosed)
		}
		if c.paused.Load() {
			// dockerd kills a paused container and waits 10 s for an
			// exit that a paused gVisor sandbox never gives it before
			// removing it anyway (12 s at a load of 30; unpaused first,
			// 3.4 s). A failed unpause leaves it to the removal.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c.b.cli.ContainerUnpause(ctx, c.id)
			cancel()
		}
		if err := c.b.remove(c.id); err != nil {
			c.b.removeFailures.Add(1)
			c.closeErr = err
		}
		<-c.demux
	})
	return c.closeErr
}
