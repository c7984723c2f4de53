package containerd

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/client"
	"golang.org/x/sys/unix"

	"github.com/rollbox/rollbox/sandbox"
)

// The channel is the guest's stream past the shim under runc: a unix
// socket the host listens on in a directory of its own, the socket file
// alone bound read-only into the container, one connection taken from the
// task's init and then the listener closed and unlinked. The design and
// its threats are in RATIONALE.md ("Why a channel past the shim").

// ChannelMountPath is where the channel's socket is bound in a container.
const ChannelMountPath = "/.rollbox/channel"

// DefaultChannelTimeout bounds how long a create waits for the guest to
// connect (as long as its Hello may take).
const DefaultChannelTimeout = 30 * time.Second

// channel is one sandbox's listening socket until its guest connected.
type channel struct {
	dir  string // 0700, root's: the socket's directory on the host
	path string // the socket
	l    *net.UnixListener

	closeOnce sync.Once
	refused   atomic.Int64 // connections closed for not being the guest's
}

// newChannel makes the directory and the listening socket of sandbox id.
func (b *Backend) newChannel(id string) (*channel, error) {
	inst, err := b.instance()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(inst.dir, "ch", id)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, fmt.Errorf("channel directory: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("channel directory: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	ch := &channel{dir: dir, path: filepath.Join(dir, "channel")}
	if len(ch.path) >= len(unix.RawSockaddrUnix{}.Path) {
		os.Remove(dir)
		return nil, fmt.Errorf("channel socket path %s is too long for a unix socket (StateDir is too deep): %w", ch.path, sandbox.ErrSandboxFailed)
	}
	ch.l, err = net.ListenUnix("unix", &net.UnixAddr{Name: ch.path, Net: "unix"})
	if err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("channel socket: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	// connect() needs write permission on the socket file: the guest's
	// uid only (and root). The directory keeps every other host user out.
	if err := os.Chown(ch.path, uid, gid); err != nil {
		ch.close()
		return nil, fmt.Errorf("channel socket: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	if err := os.Chmod(ch.path, 0o600); err != nil {
		ch.close()
		return nil, fmt.Errorf("channel socket: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	return ch, nil
}

// close closes the listener, which unlinks the socket, and removes the
// directory: nothing can connect afterwards. Idempotent.
func (ch *channel) close() {
	ch.closeOnce.Do(func() {
		ch.l.Close()
		os.Remove(ch.path)
		os.Remove(ch.dir)
	})
}

// accept waits for the guest's connection: the first whose peer (as the
// kernel records it, SO_PEERCRED) is the task's init, pid in the host's
// namespace, uid 65534. Others are closed and counted. It gives up when
// the task exits, ctx ends or timeout passes. The listener is closed
// either way.
func (ch *channel) accept(ctx context.Context, pid uint32, exit <-chan client.ExitStatus, timeout time.Duration) (*net.UnixConn, error) {
	defer ch.close()
	type result struct {
		conn *net.UnixConn
		err  error
	}
	got := make(chan result, 1)
	go func() {
		for {
			conn, err := ch.l.AcceptUnix()
			if err != nil {
				got <- result{err: err}
				return
			}
			if err := isGuest(conn, pid); err != nil {
				ch.refused.Add(1)
				conn.Close()
				continue
			}
			got <- result{conn: conn}
			return
		}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	var why string
	select {
	case r := <-got:
		if r.err == nil {
			return r.conn, nil
		}
		why = r.err.Error()
	case st := <-exit:
		why = fmt.Sprintf("the guest exited (status %d) before it connected", st.ExitCode())
	case <-t.C:
		why = fmt.Sprintf("the guest did not connect in %v", timeout)
	case <-ctx.Done():
		why = context.Cause(ctx).Error()
	}
	ch.l.Close()
	if r := <-got; r.conn != nil {
		// Accepted in the meantime: too late, it is closed.
		r.conn.Close()
	}
	return nil, fmt.Errorf("channel: %s: %w", why, sandbox.ErrSandboxFailed)
}

// isGuest checks that the peer of conn is process pid with the commands'
// uid.
func isGuest(conn *net.UnixConn, pid uint32) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if pid == 0 || cred.Pid != int32(pid) || cred.Uid != uid {
		return fmt.Errorf("peer pid %d uid %d is not the guest (pid %d uid %d)", cred.Pid, cred.Uid, pid, uid)
	}
	return nil
}
