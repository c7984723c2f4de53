package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/cio"
	"golang.org/x/sys/unix"

	"github.com/rollbox/rollbox/internal/guesthost"
	"github.com/rollbox/rollbox/sandbox"
)

// Container is one sandbox: a containerd container whose task's init
// process is the guest agent, spoken to over the channel (a unix socket
// past the shim, under runc: channel.go) or the task's stdin and stdout
// (FIFOs the shim copies: under runsc, or with Options.StdioOnly). Exec,
// ReadFile, WriteFile and ListFiles go through the guest (guesthost.Conn).
type Container struct {
	*guesthost.Conn
	b    *Backend
	id   string
	spec sandbox.Spec
	info sandbox.Info

	ctr    client.Container
	task   client.Task
	exit   <-chan client.ExitStatus
	dio    *cio.DirectIO
	logEnd chan struct{} // closed when the guest's stderr has ended

	// ch is the channel's listener until the guest connected (nil under
	// runsc and with Options.StdioOnly); conn the guest's connection.
	ch   *channel
	conn atomic.Pointer[net.UnixConn]

	// wsMu orders forks and the release of the files.
	wsMu  sync.Mutex
	ws    *workspace // the files on the host; nil under runsc
	forks int        // forks made, naming their layers

	closeOnce sync.Once
	closeErr  error
}

func newContainer(b *Backend, id string, spec sandbox.Spec, ref, digest string) *Container {
	c := &Container{
		b: b, id: id, spec: spec,
		info: sandbox.Info{
			ID: id, Backend: sandbox.BackendContainerd, Image: ref, ImageDigest: digest, Runtime: spec.Runtime,
			Network: spec.Network, Limits: spec.Limits, Workdir: spec.Workdir,
		},
	}
	c.Conn = guesthost.New(guesthost.Config{
		ID: id, Spec: spec, GuestTimeout: b.opts.GuestTimeout, Engine: c, Cut: c.cut,
	})
	return c
}

// Info describes the sandbox as it runs.
func (c *Container) Info() sandbox.Info { return c.info }

// make creates the lease, the container (an active snapshot of the image
// as its root, mounted read-only by the runtime once the mount points are
// made), its stdio FIFOs and its task, not started.
func (c *Container) make(ctx context.Context, img client.Image, shim string, shimOpts any, labels map[string]string) error {
	b := c.b
	l, err := b.newLease(ctx, c.id, labels)
	if err != nil {
		return err
	}
	b.step("lease")
	lctx := leases.WithLease(ctx, l.ID)
	files := tmpfsMounts(c.spec)
	if c.spec.Runtime != sandbox.RuntimeRunsc {
		// gVisor's gofer takes no mounts from the host after the start:
		// its files stay in the runtime's tmpfs (and forks copy them).
		c.wsMu.Lock()
		c.ws, files, err = b.newWorkspace(c.id, c.spec)
		c.wsMu.Unlock()
		if err != nil {
			return err
		}
	}
	b.step("workspace")
	channelPath := ""
	if b.useChannel(c.spec) {
		if c.ch, err = b.newChannel(c.id); err != nil {
			return err
		}
		channelPath = c.ch.path
		if b.channelHook != nil {
			b.channelHook(channelPath)
		}
	}
	b.step("channel")
	c.ctr, err = b.cli.NewContainer(lctx, c.id,
		client.WithImage(img),
		client.WithSnapshotter(Snapshotter),
		client.WithNewSnapshot(c.id, img),
		client.WithRuntime(shim, shimOpts),
		client.WithNewSpec(append(b.ociSpec(c.spec, files, channelPath), b.shimGroupOpts()...)...),
		withLabels(labels),
	)
	if err != nil {
		return translate("create container "+c.id, err)
	}
	b.step("container")
	fifoDir := filepath.Join(b.opts.StateDir, "fifo")
	if err := os.MkdirAll(fifoDir, 0o700); err != nil {
		return fmt.Errorf("fifo directory: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	fifos, err := cio.NewFIFOSetInDir(fifoDir, c.id, false)
	if err != nil {
		return fmt.Errorf("stdio fifos of %s: %v: %w", c.id, err, sandbox.ErrSandboxFailed)
	}
	c.dio, err = cio.NewDirectIO(context.WithoutCancel(ctx), fifos)
	if err != nil {
		fifos.Close()
		c.dio = nil
		return fmt.Errorf("open the stdio of %s: %v: %w", c.id, err, sandbox.ErrSandboxFailed)
	}
	c.logEnd = make(chan struct{})
	go func() {
		defer close(c.logEnd)
		io.Copy(c.Log(), c.dio.Stderr)
	}()
	if c.ch == nil {
		c.Attach(c.dio.Stdout, c.dio.Stdin)
	} else {
		// The guest writes nothing there; a byte would be read and
		// dropped rather than block the writer.
		go io.Copy(io.Discard, c.dio.Stdout)
	}
	b.step("fifos")
	c.task, err = c.ctr.NewTask(ctx, func(string) (cio.IO, error) { return c.dio, nil })
	if err != nil {
		return translate("create task of "+c.id, err)
	}
	b.step("task")
	// Before the start, so no exit is missed.
	c.exit, err = c.task.Wait(context.Background())
	if err != nil {
		return translate("wait for task of "+c.id, err)
	}
	if c.ws != nil {
		// The container's mount namespace exists: the files mounted on
		// the anchors now show in it.
		return c.ws.bindUppers()
	}
	return nil
}

// start starts the task, takes the guest's connection to the channel (if
// it has one) and says hello to the guest.
func (c *Container) start(ctx context.Context) error {
	c.b.step("wait+binds")
	if err := c.task.Start(ctx); err != nil {
		return translate("start task of "+c.id, err)
	}
	c.b.step("start")
	if c.ch != nil {
		conn, err := c.ch.accept(ctx, c.task.Pid(), c.exit, c.b.opts.ChannelTimeout)
		if err != nil {
			return fmt.Errorf("sandbox %s: %w%s", c.id, err, c.logTail())
		}
		c.conn.Store(conn)
		if c.IsClosed() {
			conn.Close()
		}
		c.Attach(conn, conn)
		c.b.step("accept")
	}
	err := c.Hello(ctx)
	c.b.step("hello")
	return err
}

// logTail is the guest's log, for an error.
func (c *Container) logTail() string {
	if c.logEnd != nil {
		// The guest has exited when its log ends: wait briefly for the
		// last of it.
		select {
		case <-c.logEnd:
		case <-time.After(100 * time.Millisecond):
		}
	}
	if s := c.Log().String(); s != "" {
		return "; guest log: " + s
	}
	return ""
}

// cut ends the guest's stream so every pending call ends.
func (c *Container) cut(error) {
	if conn := c.conn.Load(); conn != nil {
		conn.Close()
	}
	if c.dio != nil {
		c.dio.Cancel()
		c.dio.Close()
	}
}

// Diagnose is containerd's account of the container, for the verdict on a
// broken guest (guesthost.Engine). containerd records no event for a kill
// it was asked for (Docker does), so the verdict is built from what it does
// give (RATIONALE.md, "Who killed the task?"):
//
//   - the container or the task missing, or deleted (a /containers/delete
//     or /tasks/delete event of this container, watched from before the
//     look and for outsideWait after a stopped task is seen): removed from
//     outside (`rollbox gc`, a test's cleanup), infrastructure;
//   - under runc, the task's init (the guest) ended by SIGKILL (exit status
//     137) while its memory cgroup counts no OOM kill: killed from outside
//     (`ctr task kill`), infrastructure. No process of the sandbox can
//     send its PID namespace's init SIGKILL (the kernel drops it), nor set
//     the RLIMIT_CPU whose SIGKILL the kernel would send (the guest's
//     seccomp filter), so only the host or the OOM killer can; under runsc
//     a command can (gVisor lets it), so there only a removal tells;
//   - the task paused: infrastructure.
//
// Anything else (the guest ended otherwise, or OOM-killed, or a stopped task
// nobody removes) is the commands' doing. The backend's own kill (Close)
// marks the sandbox closed first, so it never reaches this verdict.
func (c *Container) Diagnose(ctx context.Context) guesthost.Diagnosis {
	// Watch for the deletions before looking, so one between the look
	// and the watch is not missed.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	ns := "namespace==" + strconv.Quote(c.b.opts.Namespace)
	deleted, _ := c.b.cli.Subscribe(wctx,
		ns+`,topic=="/tasks/delete",event.container_id==`+strconv.Quote(c.id),
		ns+`,topic=="/containers/delete",event.id==`+strconv.Quote(c.id))
	// The guest's stream can end before the shim has reaped the task, and
	// an outside removal (gc kills, waits for the exit, then deletes)
	// follows its kill within moments: look again until the task has
	// stopped and a deletion has had outsideWait to show.
	deadline := time.NewTimer(outsideWait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	d, stopped := c.look(ctx)
	for {
		if d.Err != nil || d.Infra != "" {
			return d.Diagnosis
		}
		poll := tick.C
		if stopped {
			if why := c.killedFromOutside(ctx, d.exitStatus); why != "" {
				d.Infra = why
				return d.Diagnosis
			}
			if d.exitStatus == 128+uint32(syscall.SIGKILL) {
				n, err := c.oomKills(ctx)
				d.OOMKilled = err == nil && n > 0
			}
			poll = nil // only a deletion or the deadline changes the verdict now
		}
		select {
		case <-deleted:
			deleted = nil
		case <-poll:
		case <-deadline.C:
			if again, _ := c.look(ctx); again.Err != nil {
				return again.Diagnosis
			}
			return d.Diagnosis
		case <-ctx.Done():
			return d.Diagnosis
		}
		d, stopped = c.look(ctx)
	}
}

// outsideWait is how long Diagnose waits for a broken guest's task to stop
// and for the deletion that follows an outside removal's kill.
const outsideWait = 1500 * time.Millisecond

type look struct {
	guesthost.Diagnosis
	exitStatus uint32
}

// look asks containerd about the container and its task: whether they exist,
// the task's status, and whether it stopped.
func (c *Container) look(ctx context.Context) (look, bool) {
	if _, err := c.b.cli.LoadContainer(ctx, c.id); err != nil {
		if isNotFound(err) {
			return look{Diagnosis: guesthost.Diagnosis{Err: fmt.Errorf("the container was removed from outside: %w", sandbox.ErrSandboxFailed)}}, false
		}
		return look{Diagnosis: guesthost.Diagnosis{Err: translate("load the container", err)}}, false
	}
	st, err := c.task.Status(ctx)
	if err != nil {
		if isNotFound(err) {
			return look{Diagnosis: guesthost.Diagnosis{Err: fmt.Errorf("the task was deleted from outside: %w", sandbox.ErrSandboxFailed)}}, false
		}
		return look{Diagnosis: guesthost.Diagnosis{Err: translate("task status", err)}}, false
	}
	d := look{Diagnosis: guesthost.Diagnosis{State: "task " + string(st.Status)}}
	if st.Status == client.Stopped {
		d.State += fmt.Sprintf(", exit status %d", st.ExitStatus)
		d.exitStatus = st.ExitStatus
		d.Exited, d.ExitStatus = true, int(st.ExitStatus)
	}
	if st.Status == client.Paused || st.Status == client.Pausing {
		d.Infra = "the task is paused"
	}
	return d, st.Status == client.Stopped
}

// killedFromOutside says why a stopped task with this exit status was
// killed from outside the sandbox, or "" when that is not known: under runc
// only, the guest ended by SIGKILL while the memory cgroup counts no OOM
// kill (an unreadable count says nothing).
func (c *Container) killedFromOutside(ctx context.Context, exitStatus uint32) string {
	if c.spec.Runtime == sandbox.RuntimeRunsc || exitStatus != 128+uint32(syscall.SIGKILL) {
		return ""
	}
	n, err := c.oomKills(ctx)
	if err != nil || n != 0 {
		return ""
	}
	return "the guest was killed by SIGKILL from outside the sandbox (no process in it can send its init SIGKILL under runc, and its memory cgroup counts no OOM kill)"
}

// oomKills reads how many processes the kernel's OOM killer has killed in
// the container's memory cgroup (cgroup v1's memory.oom_control, v2's
// memory.events).
func (c *Container) oomKills(ctx context.Context) (int, error) {
	spec, err := c.ctr.Spec(ctx)
	if err != nil {
		return 0, err
	}
	if spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return 0, fmt.Errorf("no cgroups path")
	}
	p := spec.Linux.CgroupsPath
	if strings.Contains(p, ":") {
		return 0, fmt.Errorf("systemd cgroups path %q", p)
	}
	files := []string{
		filepath.Join("/sys/fs/cgroup/memory", p, "memory.oom_control"),
		filepath.Join("/sys/fs/cgroup", p, "memory.events"),
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" {
				return strconv.Atoi(strings.TrimSpace(v))
			}
		}
		return 0, fmt.Errorf("%s counts no oom_kill", f)
	}
	return 0, fmt.Errorf("no memory cgroup for %s", p)
}

// Close ends every call in flight (they fail with ErrClosed), kills the
// task, deletes it, the container with its snapshot and its lease, and
// returns once containerd says the container does not exist. Idempotent
// and safe to call concurrently; it runs to the end even if the caller's
// context is gone.
//
// # Errors
//
// A removal that fails is retried with back-off for
// Options.RemoveTimeout; then Close returns an ErrSandboxFailed naming the
// container, the attempts and the last failure, and
// Backend.RemoveFailures counts it. `rollbox gc` removes it later.
func (c *Container) Close() error {
	c.closeOnce.Do(func() {
		c.MarkClosed()
		c.cut(sandbox.ErrClosed)
		if err := c.b.remove(c); err != nil {
			c.b.removeFailures.Add(1)
			c.closeErr = err
		}
		if c.logEnd != nil {
			<-c.logEnd
		}
	})
	return c.closeErr
}

// remove deletes what a sandbox made, retrying with back-off until
// containerd says the container is gone or RemoveTimeout has passed.
func (b *Backend) remove(c *Container) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.RemoveTimeout)
	defer cancel()
	delay := 50 * time.Millisecond
	var last error
	for attempt := 1; ; attempt++ {
		err := b.removeOnce(ctx, c)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("remove container %s: %d attempts in %v, the last: %s: %w",
				c.id, attempt, time.Since(start).Round(time.Millisecond), firstLine(last.Error()), sandbox.ErrSandboxFailed)
		case <-t.C:
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (b *Backend) removeOnce(ctx context.Context, c *Container) error {
	var errs []error
	if c.task != nil {
		if c.exit == nil {
			// A task loaded from the store (gc): wait before the kill, so
			// the delete below never races the exit.
			if ch, err := c.task.Wait(context.WithoutCancel(ctx)); err == nil {
				c.exit = ch
			}
		}
		// Under runsc the task's process is the sandbox's sentry: killing
		// it on the host ends every process of the sandbox at once.
		// `runsc kill --all` (what the shim runs for a kill of all) asks
		// the sentry to pause every task first, and waits forever on a
		// sentry that does not answer or on a task stuck in a call to a
		// gofer that does not.
		if !killSentry(c.task.Pid(), c.id) {
			kctx, cancel := context.WithTimeout(ctx, killTimeout)
			err := c.task.Kill(kctx, syscall.SIGKILL, client.WithKillAll)
			cancel()
			if err != nil && !isNotFound(err) && !isNotRunning(err) {
				errs = append(errs, fmt.Errorf("kill: %w", err))
			}
		}
		if c.exit != nil {
			select {
			case <-c.exit:
			case <-time.After(10 * time.Second):
			}
		}
		dctx, cancel := context.WithTimeout(ctx, deleteTimeout)
		_, err := c.task.Delete(dctx)
		cancel()
		if err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("delete task: %w", err))
		}
	}
	if c.ctr != nil {
		if err := c.ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container: %w", err))
		}
	} else if ctr, err := b.cli.LoadContainer(ctx, c.id); err == nil {
		// NewContainer failed after it stored the container.
		if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container: %w", err))
		}
	}
	if c.ch != nil {
		c.ch.close()
	}
	c.wsMu.Lock()
	if c.ws != nil {
		if err := b.releaseWorkspace(c.ws); err != nil {
			errs = append(errs, err)
		}
	}
	c.wsMu.Unlock()
	if err := b.cli.LeasesService().Delete(ctx, leases.Lease{ID: leasePrefix + c.id}); err != nil && !isNotFound(err) {
		errs = append(errs, fmt.Errorf("delete lease: %w", err))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if _, err := b.cli.LoadContainer(ctx, c.id); !isNotFound(err) {
		if err == nil {
			return fmt.Errorf("still there after its deletion was accepted")
		}
		return err
	}
	return nil
}

// Each call of a removal gets at most this long, so one that hangs leaves
// the removal's later attempts their time.
const (
	killTimeout   = 10 * time.Second
	deleteTimeout = 30 * time.Second
)

// killSentry sends SIGKILL to the host process pid if it is the sentry of
// the runsc sandbox id (its command line is runsc-sandbox's, ending with
// the id), through a pidfd, so a pid reused after the sentry was reaped is
// never signalled. It says whether it killed one.
func killSentry(pid uint32, id string) bool {
	if pid == 0 {
		return false
	}
	fd, err := unix.PidfdOpen(int(pid), 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	// Read after the pidfd is open: if pid is still the sentry's now, the
	// pidfd is the sentry's (if it has died since, the signal fails).
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) < 2 || args[0] != "runsc-sandbox" || args[len(args)-1] != id {
		return false
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
}

func isNotRunning(err error) bool {
	return err != nil && (errors.Is(err, os.ErrProcessDone) || containsAny(err.Error(), "not running", "process already finished", "no such process"))
}

// KillTask kills the sandbox's task from outside, as an operator would: for
// tests of what follows.
func (c *Container) KillTask(ctx context.Context) error {
	if err := c.task.Kill(ctx, syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-c.exit:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
