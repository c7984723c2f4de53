package sandbox

import "sync"

// Capture is an io.Writer that keeps the head and the tail of what is
// written to it, up to a cap, and counts the bytes it dropped in between. It
// holds at most cap bytes however much is written, so a command that floods
// its output costs bounded memory. Safe for concurrent use.
type Capture struct {
	mu      sync.Mutex
	headCap int
	tailCap int
	head    []byte
	tail    []byte // ring buffer of tailCap bytes once full
	tailPos int    // next write position in tail when full
	full    bool   // tail has wrapped at least once
	dropped int64
	total   int64
}

// NewCapture returns a Capture keeping at most limit bytes: the first
// limit-limit/2 and the last limit/2. A limit <= 0 keeps nothing.
func NewCapture(limit int) *Capture {
	if limit < 0 {
		limit = 0
	}
	return &Capture{headCap: limit - limit/2, tailCap: limit / 2}
}

// Write never fails and always reports len(p).
func (c *Capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	c.total += int64(n)
	if room := c.headCap - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	if len(p) == 0 {
		return n, nil
	}
	if c.tailCap == 0 {
		c.dropped += int64(len(p))
		return n, nil
	}
	if c.tail == nil {
		c.tail = make([]byte, 0, c.tailCap)
	}
	// Only the last tailCap bytes of p can survive.
	if len(p) > c.tailCap {
		c.dropped += int64(len(p) - c.tailCap)
		p = p[len(p)-c.tailCap:]
	}
	if !c.full {
		room := c.tailCap - len(c.tail)
		k := min(room, len(p))
		c.tail = append(c.tail, p[:k]...)
		p = p[k:]
		if len(c.tail) == c.tailCap {
			c.full = true
			c.tailPos = 0
		}
	}
	for len(p) > 0 {
		k := copy(c.tail[c.tailPos:], p)
		c.dropped += int64(k) // overwritten bytes leave the buffer
		c.tailPos = (c.tailPos + k) % c.tailCap
		p = p[k:]
	}
	return n, nil
}

// Bytes returns the kept head followed by the kept tail.
func (c *Capture) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]byte, 0, len(c.head)+len(c.tail))
	out = append(out, c.head...)
	if c.full {
		out = append(out, c.tail[c.tailPos:]...)
		out = append(out, c.tail[:c.tailPos]...)
	} else {
		out = append(out, c.tail...)
	}
	return out
}

// Dropped is the number of bytes written but not kept.
func (c *Capture) Dropped() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped
}

// Total is the number of bytes written.
func (c *Capture) Total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}
