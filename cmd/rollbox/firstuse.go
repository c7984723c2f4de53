package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// firstUse shows, on w, that a slow preparation (the first use of a
// backend: building the WASM guests and helper and compiling them, or the
// Docker guest agent) is under way, with the time it has taken: nothing
// when it ends within quiet (a warm cache), then a line redrawn every
// second on a terminal, or a line every interval otherwise, and how long it
// took. The lines the preparation prints itself (Writer) come out whole
// between them.
type firstUse struct {
	w        io.Writer
	what     string
	tty      bool
	quiet    time.Duration
	interval time.Duration
	now      func() time.Time // time.Now

	mu    sync.Mutex
	start time.Time
	shown bool // the progress line was printed at least once
	drawn bool // a terminal line is drawn and not ended
	done  chan struct{}
	ended chan struct{}
}

// startFirstUse begins showing what on w; end stops it.
func startFirstUse(w io.Writer, what string) *firstUse {
	f := &firstUse{w: w, what: what, quiet: time.Second, interval: 10 * time.Second, now: time.Now}
	if file, ok := w.(*os.File); ok && isTerminal(file) {
		f.tty, f.interval = true, time.Second
	}
	f.run()
	return f
}

func (f *firstUse) run() {
	f.start = f.now()
	f.done, f.ended = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(f.ended)
		wait := f.quiet
		for {
			select {
			case <-f.done:
				return
			case <-time.After(wait):
				f.tick()
				wait = f.interval
			}
		}
	}()
}

func (f *firstUse) tick() {
	f.mu.Lock()
	defer f.mu.Unlock()
	el := f.now().Sub(f.start).Round(time.Second)
	if f.tty {
		fmt.Fprintf(f.w, "\r\x1b[Krollbox: %s %v", f.what, el)
		f.drawn = true
	} else {
		fmt.Fprintf(f.w, "rollbox: %s %v so far\n", f.what, el)
	}
	f.shown = true
}

// Write passes the preparation's own lines through, whole, above the
// progress line.
func (f *firstUse) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.drawn {
		fmt.Fprint(f.w, "\r\x1b[K")
		f.drawn = false
	}
	return f.w.Write(p)
}

// end stops the progress and, when it was shown, says how long the
// preparation took (or that it failed).
func (f *firstUse) end(err error) {
	close(f.done)
	<-f.ended
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.drawn {
		fmt.Fprint(f.w, "\r\x1b[K")
	}
	if !f.shown {
		return
	}
	el := f.now().Sub(f.start).Round(100 * time.Millisecond)
	if err != nil {
		fmt.Fprintf(f.w, "rollbox: %s failed after %v\n", f.what, el)
		return
	}
	fmt.Fprintf(f.w, "rollbox: %s: done in %v\n", strings.TrimSuffix(f.what, "…"), el)
}
