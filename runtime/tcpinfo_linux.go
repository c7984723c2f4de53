package runtime

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// sinceDataArrived is how long ago the last data reached c's socket
// (TCP_INFO's last_data_recv, whole milliseconds), 0 when unknown.
func sinceDataArrived(c net.Conn) time.Duration {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	var d time.Duration
	raw.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			d = time.Duration(info.Last_data_recv) * time.Millisecond
		}
	})
	return d
}
