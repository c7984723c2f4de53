//go:build linux

package guest

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/guestproto"
)

func TestGuardIntervalFollowsTheHeadroom(t *testing.T) {
	const mb = 1 << 20
	tests := []struct {
		name        string
		limit, used int64
		growth      float64
		want        time.Duration
	}{
		{"far below the limit it samples at the longest interval", 4096 * mb, 100 * mb, 0, guardMaxInterval},
		{"512 MB of headroom at 2 GiB/s is 250 ms", 612 * mb, 100 * mb, 0, 250 * time.Millisecond},
		{"100 MB of headroom at 2 GiB/s is about 49 ms", 612 * mb, 512 * mb, 0, 48828125 * time.Nanosecond},
		{"near the limit it samples at the shortest interval", 512 * mb, 510 * mb, 0, guardMinInterval},
		{"above the limit it samples at the shortest interval", 512 * mb, 600 * mb, 0, guardMinInterval},
		{"growth faster than assumed shortens the wait (twice the growth seen)", 612 * mb, 100 * mb, 4 << 30, 62500 * time.Microsecond},
		{"memory being freed does not lengthen it", 612 * mb, 512 * mb, -8 << 30, 48828125 * time.Nanosecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := guardInterval(tt.limit, tt.used, tt.growth); got != tt.want {
				t.Errorf("guardInterval(%d MB, %d MB, %.0f B/s) = %v, want %v", tt.limit/mb, tt.used/mb, tt.growth, got, tt.want)
			}
		})
	}
}

// TestGuardSamplesOnlyWhileCommandsRunAndRarelyFarFromTheLimit: under gVisor
// each sample and each wake-up costs a trip through the sentry (a 5 ms
// /proc/meminfo poll cost a Python workload 1.4-1.7x the CPU), so the guard
// must be quiet while the sandbox waits for the model and sample rarely
// while memory is far below the limit.
func TestGuardSamplesOnlyWhileCommandsRunAndRarelyFarFromTheLimit(t *testing.T) {
	var samples atomic.Int64
	h := newGuardedHarness(t, 1<<30, func() int64 { samples.Add(1); return 10 << 20 })
	time.Sleep(300 * time.Millisecond)
	if n := samples.Load(); n != 0 {
		t.Errorf("%d samples while no command ran", n)
	}
	start := time.Now()
	h.exec(t, &guestproto.Exec{Argv: []string{"sleep", "1"}})
	ran := time.Since(start)
	n := samples.Load()
	// One at the start, then one every guardMaxInterval at most.
	if max := int64(ran/guardMaxInterval) + 2; n < 1 || n > max {
		t.Errorf("%d samples while a command ran %v, want 1..%d", n, ran.Round(time.Millisecond), max)
	}
	time.Sleep(300 * time.Millisecond)
	if m := samples.Load(); m != n {
		t.Errorf("%d samples after the command ended", m-n)
	}
}

// TestGuardKillsTheLargestCommandAboveTheLimit: the guard's sample here is
// the resident memory of this process's children (what the sandbox's
// sysinfo(2) counts under gVisor); a command that grows past the limit is
// killed and reported OOM-killed, the small one beside it runs on.
func TestGuardKillsTheLargestCommandAboveTheLimit(t *testing.T) {
	self := os.Getpid()
	page := int64(os.Getpagesize())
	childrenRSS := func() int64 {
		var total int64
		for _, st := range listProcs() {
			if st.pid == self || st.sid == self {
				continue
			}
			// Only the commands' sessions: each leader's pid is its sid,
			// and its parent is us.
			if lead, ok := readStat(st.sid, make([]byte, 512)); !ok || lead.ppid != self {
				continue
			}
			b, err := os.ReadFile("/proc/" + strconv.Itoa(st.pid) + "/statm")
			if f := strings.Fields(string(b)); err == nil && len(f) > 1 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				total += n * page
			}
		}
		return total
	}
	h := newGuardedHarness(t, 64<<20, childrenRSS)
	var wg sync.WaitGroup
	var small *guestproto.ExecResult
	wg.Add(1)
	go func() {
		defer wg.Done()
		small = h.exec(t, &guestproto.Exec{Shell: "sleep 1.5; echo small done"})
	}()
	time.Sleep(100 * time.Millisecond)
	// tail keeps a line-less input whole: 400 MB of it unless stopped.
	big := h.exec(t, &guestproto.Exec{Shell: "head -c 400000000 /dev/zero | tail -c 400000000 | wc -c", Timeout: time.Minute})
	wg.Wait()
	if !big.OOMKilled || big.ExitCode == 0 || strings.TrimSpace(string(big.Stdout)) == "400000000" {
		t.Errorf("the balloon: OOM-killed %v, exit %d, signal %q, stdout %q", big.OOMKilled, big.ExitCode, big.Signal, big.Stdout)
	}
	if small.OOMKilled || small.ExitCode != 0 || string(small.Stdout) != "small done\n" {
		t.Errorf("the small command beside it: OOM-killed %v, exit %d, stdout %q", small.OOMKilled, small.ExitCode, small.Stdout)
	}
}
