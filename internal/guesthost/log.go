package guesthost

import (
	"fmt"

	"github.com/rollbox/rollbox/sandbox"
)

// LogBytes bounds what a sandbox keeps of its guest's stderr: half from the
// start, half from the end.
const LogBytes = 16 << 10

// Log keeps the head and the tail of the guest's stderr. A Go crash names
// its cause on its first lines ("fatal error: ...", "panic: ...") and then
// dumps every goroutine, often far more than the cap: a tail alone would
// keep the stacks and lose the cause.
type Log struct {
	limit int
	c     *sandbox.Capture
}

// NewLog keeps at most limit bytes.
func NewLog(limit int) *Log {
	return &Log{limit: limit, c: sandbox.NewCapture(limit)}
}

func (l *Log) Write(p []byte) (int, error) { return l.c.Write(p) }

// String is the kept log, with what was left out of its middle marked.
func (l *Log) String() string {
	b := l.c.Bytes()
	dropped := l.c.Dropped()
	if dropped == 0 {
		return string(b)
	}
	head := l.limit - l.limit/2 // sandbox.NewCapture's split
	return fmt.Sprintf("%s\n[... %d bytes of the guest's log left out ...]\n%s", b[:head], dropped, b[head:])
}
