package runtime

import (
	"testing"
	"time"
	"unsafe"
)

// The service's record of recent completions (for Retry-After) is a fixed
// size: it held a time.Time for each of up to 100,000 episodes a
// long-running service ended (2.4 MB, kept after every rollout), and now
// counts the last minute by the second. Its rate is the last minute's.
func TestRecentCompletionsAreAFixedSizeAndCountTheLastMinute(t *testing.T) {
	var c completions
	start := time.Unix(1_000_000, 0)
	for i := range 200_000 { // 100 a second for 2,000 s
		c.add(start.Add(time.Duration(i) * 10 * time.Millisecond))
	}
	now := start.Add(2000 * time.Second)
	if got := c.rate(now); got < 90 || got > 110 {
		t.Errorf("rate after 100 completions a second: %.1f/s", got)
	}
	if got := c.rate(now.Add(61 * time.Second)); got != 0 {
		t.Errorf("rate a minute after the last completion: %.1f/s, want 0", got)
	}
	if got := c.rate(now.Add(30 * time.Second)); got < 45 || got > 55 {
		t.Errorf("rate half a minute after 100 a second stopped: %.1f/s, want about 50", got)
	}
	if size := unsafe.Sizeof(c); size > 1024 {
		t.Errorf("completions take %d bytes", size)
	}
}
