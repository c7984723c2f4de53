package promptnet

import (
	"net"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The Listener's own loop makes its system calls raw: none of them blocks
// (the sockets are non-blocking, the poll has no timeout), and a goroutine
// that enters the runtime's system call state may lose its processor to
// the monitor thread while in it (a busy host deschedules it for a
// moment), and then waits in the global run queue, behind every goroutine
// the service has runnable, to come back: tens to hundreds of milliseconds
// in a trace of the 5,000-episode bench. A raw call keeps the processor.

func rawErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// rawAccept accepts a waiting connection of the listening socket lfd,
// non-blocking and close-on-exec.
func rawAccept(lfd int) (int, error) {
	for {
		fd, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(lfd), 0, 0, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
		if e == unix.EINTR || e == unix.ECONNABORTED {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(fd), nil
	}
}

// rawPoll polls fds without waiting.
func rawPoll(fds []unix.PollFd) error {
	var ts unix.Timespec
	for {
		_, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		if e != unix.EINTR {
			return rawErr(e)
		}
	}
}

// rawRecv reads what fd has into b without waiting; peek leaves it there.
func rawRecv(fd int, b []byte, peek bool) (int, error) {
	flags := unix.MSG_DONTWAIT
	if peek {
		flags |= unix.MSG_PEEK
	}
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(flags), 0, 0)
		if e != unix.EINTR {
			return int(n), rawErr(e)
		}
	}
}

// rawSend writes b to fd without waiting (MSG_NOSIGNAL: a peer gone is
// an error, not a SIGPIPE).
func rawSend(fd int, b []byte) (int, error) {
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
		if e != unix.EINTR {
			return int(n), rawErr(e)
		}
	}
}

// rawShutdownClose ends fd's writing side (the peer reads the answer, then
// EOF) and closes it.
func rawShutdownClose(fd int) {
	unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), unix.SHUT_WR, 0)
	unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
}

// rawDup duplicates c's socket (close-on-exec; non-blocking as c's is: the
// flag is the socket's), -1 when it cannot.
func rawDup(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	raw.Control(func(cfd uintptr) {
		if r, _, e := unix.RawSyscall(unix.SYS_FCNTL, cfd, unix.F_DUPFD_CLOEXEC, 0); e == 0 {
			fd = int(r)
		}
	})
	return fd
}

// rawClose closes fd.
func rawClose(fd int) { unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0) }

// dataAge is how long ago the last data reached fd's socket (TCP_INFO's
// last_data_recv, whole milliseconds), 0 when unknown.
func dataAge(fd int) time.Duration {
	var info unix.TCPInfo
	n := uint32(unsafe.Sizeof(info))
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO, uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return 0
	}
	return time.Duration(info.Last_data_recv) * time.Millisecond
}
