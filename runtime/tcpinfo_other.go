//go:build !linux

package runtime

import (
	"net"
	"time"
)

// sinceDataArrived is 0 (unknown) where TCP_INFO is not read.
func sinceDataArrived(net.Conn) time.Duration { return 0 }
