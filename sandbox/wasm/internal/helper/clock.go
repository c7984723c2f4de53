package helper

import (
	"sync"
	"time"
)

// execClock is an exec's timeout that does not run while the exec only
// waits for capacity the backend shares across episodes (a shell slot, a
// WASM instance slot): under load that wait is the runtime's, and counting
// it would score the machine's contention as the model's timeout. The clock
// stops only while none of the exec's programs is running, so an exec
// whose own pipeline holds the slots it waits for still times out.
type execClock struct {
	mu        sync.Mutex
	timer     *time.Timer
	remaining time.Duration
	since     time.Time // when the clock last started running
	waiting   int       // programs of this exec waiting for a slot
	running   int       // programs of this exec holding a slot
	paused    bool
	fired     bool
}

func newExecClock(timeout time.Duration, fire func()) *execClock {
	c := &execClock{remaining: timeout, since: time.Now()}
	c.timer = time.AfterFunc(timeout, func() {
		c.mu.Lock()
		c.fired = true
		c.mu.Unlock()
		fire()
	})
	return c
}

// waitStart marks a program (or the shell) waiting for a shared slot.
func (c *execClock) waitStart() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting++
	c.update()
}

// waitEnd marks the wait over; acquired says whether the slot was taken
// (the program then runs until runEnd).
func (c *execClock) waitEnd(acquired bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting--
	if acquired {
		c.running++
	}
	c.update()
}

// runEnd marks a program's slot released.
func (c *execClock) runEnd() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running--
	c.update()
}

// update pauses the clock while the exec only waits, and resumes it with
// what was left otherwise.
func (c *execClock) update() {
	if c.fired {
		return
	}
	pause := c.waiting > 0 && c.running == 0
	switch {
	case pause && !c.paused:
		if c.timer.Stop() {
			c.remaining -= time.Since(c.since)
			c.paused = true
		}
	case !pause && c.paused:
		c.paused = false
		c.since = time.Now()
		c.timer.Reset(max(c.remaining, 0))
	}
}

func (c *execClock) stop() { c.timer.Stop() }
