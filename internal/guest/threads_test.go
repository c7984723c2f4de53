//go:build linux

package guest

import (
	"os"
	"testing"
)

func threadCount(t *testing.T) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skipf("no /proc/self/task: %v", err)
	}
	return len(tasks)
}

// The runtime creates a thread whenever it has none idle for a goroutine
// that blocked in a system call; under a full pids table that creation
// fails and the runtime dies ("fatal error: newosproc"). So PID 1 makes
// them up front, and they must really exist when it returns.
func TestReserveThreadsLeavesThatManyThreads(t *testing.T) {
	n := threadCount(t) + 24
	reserveThreads(n)
	if got := threadCount(t); got < n {
		t.Errorf("%d threads after reserving %d", got, n)
	}
}
