// Package promptnet accepts a busy service's connections promptly.
//
// A Go listener's Accept waits in the network poller. While every
// processor has goroutines to run, the poller is only looked at by the
// runtime's monitor thread, every 10 ms at best, and what it wakes joins the
// global run queue behind every other goroutine the poller woke: Go's
// scheduler has no priorities, so a service running thousands of episodes
// on two cores answers a new connection (a liveness probe's) after all of
// them had their turn.
//
// A Listener also looks for new connections from a goroutine woken by a
// timer, every Every while the service says it is busy. A goroutine a timer
// wakes runs next on its processor (runnext), ahead of the run queue, and so
// do the goroutines it wakes in turn (the server's Accept, then the
// connection's own): the connection is accepted within about Every. A
// connection whose request has not arrived yet is held (and looked at again
// at the next tick) rather than handed over, since its first read would
// wait in the poller again. While the service is idle the timer is slow and
// the ordinary Accept takes every connection.
//
// A probe's request (a liveness probe's GET /healthz) may be answered by
// that goroutine itself (Answer): it reads the request, writes the answer
// and closes the connection with raw system calls, none of which waits or
// gives its processor up, so the answer does not wait for the HTTP
// server's goroutines to be scheduled (each a chance to fall into the
// global run queue behind the whole service) and takes a few tens of
// microseconds of the tick. Whatever Answer does not take is handed over.
package promptnet

import (
	"bytes"
	"errors"
	"net"
	"os"
	goruntime "runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Listener is a TCP listener whose connections are accepted promptly while
// busy says so.
type Listener struct {
	ln     *net.TCPListener
	raw    syscall.RawConn
	every  time.Duration
	busy   func() bool
	answer Answer

	conns chan accepted
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup

	// detached is closed by Detach, acceptDone when the ordinary accept
	// has returned, drained when both loops have (all handed over).
	detached   chan struct{}
	detachOnce sync.Once
	acceptDone chan struct{}
	drained    chan struct{}

	// adopted are connections the ordinary accept took while busy, for
	// the timer's loop to answer or hand over; wake tells it.
	mu      sync.Mutex
	adopted []held
	wake    chan struct{}
}

type accepted struct {
	c   net.Conn
	err error
}

const (
	// idleCheck is how often an idle Listener asks whether the service
	// became busy.
	idleCheck = 100 * time.Millisecond
	// holdAtMost is how long a connection accepted without its request is
	// held before it is handed over anyway.
	holdAtMost = time.Second
	// maxProbe is the most of a request Answer is shown: a longer one is
	// handed over.
	maxProbe = 4 << 10
)

// Probe is a request the Listener's goroutine read whole, for Answer.
type Probe struct {
	// Request is the request's head as it arrived (through the blank line
	// that ends its header; a body, if any, is not read).
	Request []byte
	// Accepted is when the connection was accepted; DataAge how long ago
	// its bytes reached the socket (TCP_INFO, whole milliseconds; 0 when
	// unknown).
	Accepted time.Time
	DataAge  time.Duration
}

// Answer answers a probe from the Listener's own goroutine: the bytes to
// write back before the connection is closed, or ok false to hand the
// connection over to Accept (its request unread). It is called with the
// service busy and holding up new connections while it runs: it must be
// quick, do no I/O and take no lock held for long.
type Answer func(Probe) (answer []byte, ok bool)

// Listen wraps ln: while busy() (called every every, so it must be cheap and
// lock-free) new connections are also looked for every every, and those
// whose request answer takes (nil: none) are answered there.
func Listen(ln *net.TCPListener, every time.Duration, busy func() bool, answer Answer) (*Listener, error) {
	return listen(ln, every, busy, answer, true)
}

// listen is Listen; without ordinary, only the timer's loop accepts (for
// the tests).
func listen(ln *net.TCPListener, every time.Duration, busy func() bool, answer Answer, ordinary bool) (*Listener, error) {
	raw, err := ln.SyscallConn()
	if err != nil {
		return nil, err
	}
	l := &Listener{ln: ln, raw: raw, every: every, busy: busy, answer: answer,
		conns: make(chan accepted), done: make(chan struct{}), wake: make(chan struct{}, 1),
		detached: make(chan struct{}), acceptDone: make(chan struct{}), drained: make(chan struct{})}
	l.wg.Add(1)
	go l.pollLoop()
	if ordinary {
		l.wg.Add(1)
		go l.acceptLoop()
	} else {
		close(l.acceptDone)
	}
	return l, nil
}

// acceptLoop is the ordinary Accept, through the network poller. While
// the service is busy and probes are answered, what it accepts goes to the
// timer's loop (adopt), which answers a probe or hands the connection over
// within a tick: a probe is answered the same way whichever loop took it.
func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	defer close(l.acceptDone)
	for {
		c, err := l.ln.Accept()
		if err != nil && l.isDetached() {
			return // the socket closed by Detach: not an error to report
		}
		if err == nil && l.answer != nil && l.busy() && !l.isDetached() {
			if fd := rawDup(c); fd >= 0 {
				c.Close() // the duplicate, not in the poller, stays open
				l.adopt(held{fd, time.Now()})
				continue
			}
		}
		select {
		case l.conns <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				c.Close()
			}
			return
		}
		if err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// adopt gives a connection the ordinary accept took to the timer's loop.
func (l *Listener) adopt(h held) {
	l.mu.Lock()
	l.adopted = append(l.adopted, h)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// takeAdopted appends the adopted connections to waiting.
func (l *Listener) takeAdopted(waiting []held) []held {
	l.mu.Lock()
	defer l.mu.Unlock()
	waiting = append(waiting, l.adopted...)
	l.adopted = l.adopted[:0]
	return waiting
}

// held is a connection accepted before its request arrived.
type held struct {
	fd    int
	since time.Time
}

// pollLoop accepts what is waiting, every l.every while the service is
// busy, and hands each connection over once its request can be read.
func (l *Listener) pollLoop() {
	defer l.wg.Done()
	// On a thread of its own the loop starts every run with a time slice
	// of its own: woken by its timer it runs next, but a goroutine run next
	// shares what is left of its processor's slice, often nothing on a
	// busy service, and the monitor thread then preempted it (10 times in
	// 5 s of the 5,000-episode bench's trace) into the global run queue,
	// where it waited p50 23 / p90 99 ms. Its thread sleeps between ticks,
	// so the kernel also runs it soon when woken.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	var waiting []held
	defer func() {
		for _, h := range waiting {
			rawClose(h.fd)
		}
	}()
	var buf []byte
	if l.answer != nil {
		buf = make([]byte, maxProbe)
	}
	tick := time.NewTimer(idleCheck)
	defer tick.Stop()
	for {
		d := idleCheck
		if len(waiting) > 0 || l.busy() {
			d = l.every
		}
		tick.Reset(d)
		select { // a goroutine a timer wakes runs next on its processor
		case <-l.done:
			return
		case <-l.detached:
			// Hand over what was taken, read or not: the ordinary accept
			// first, so that nothing it adopts is left behind.
			<-l.acceptDone
			waiting = l.takeAdopted(waiting)
			for i, h := range waiting {
				c, err := fileConn(h.fd)
				if err != nil {
					continue
				}
				if !l.give(c) {
					waiting = waiting[i+1:]
					return
				}
			}
			waiting = nil
			return
		case <-tick.C:
		case <-l.wake:
		}
		waiting = l.takeAdopted(waiting)
		if len(waiting) == 0 && d == idleCheck && !l.busy() {
			continue
		}
		for {
			fd, err := l.acceptNow()
			if fd < 0 || err != nil {
				break // nothing waiting; errors are the ordinary Accept's to report
			}
			waiting = append(waiting, held{fd, time.Now()})
		}
		ready := readable(waiting)
		kept := waiting[:0]
		for i, h := range waiting {
			if !ready[i] && time.Since(h.since) < holdAtMost {
				kept = append(kept, h)
				continue
			}
			if ready[i] && l.answered(h, buf) {
				continue
			}
			c, err := fileConn(h.fd)
			if err != nil {
				continue
			}
			if !l.give(c) {
				for _, h := range waiting[i+1:] {
					rawClose(h.fd)
				}
				waiting = kept
				return
			}
		}
		waiting = kept
	}
}

// give hands c to Accept; false when the listener was closed first (c is
// closed then).
func (l *Listener) give(c net.Conn) bool {
	select {
	case l.conns <- accepted{c: c}:
		return true
	case <-l.done:
		c.Close()
		return false
	}
}

// answered offers h's request to l.answer and, if it takes it, writes the
// answer and closes the connection.
func (l *Listener) answered(h held, buf []byte) bool {
	if l.answer == nil {
		return false
	}
	n, err := rawRecv(h.fd, buf, true)
	if err != nil || n <= 0 {
		return false // closed, failed or nothing yet: the ordinary reader finds out
	}
	end := bytes.Index(buf[:n], []byte("\r\n\r\n"))
	if end < 0 {
		return false // not all there (or too long): the HTTP server reads it
	}
	answer, ok := l.answer(Probe{Request: buf[:end+4], Accepted: h.since, DataAge: dataAge(h.fd)})
	if !ok {
		return false
	}
	// The request is read, not left in the socket: a socket closed with
	// unread bytes resets the connection, and the peer may lose the answer.
	rawRecv(h.fd, buf[:n], false)
	for len(answer) > 0 {
		// A fresh connection's send buffer takes a short answer whole; if
		// it does not, the peer sees the connection end early.
		w, err := rawSend(h.fd, answer)
		if err != nil || w <= 0 {
			break
		}
		answer = answer[w:]
	}
	rawShutdownClose(h.fd)
	return true
}

// readable says which of the held connections have something to read (or
// were closed or failed: their reader finds out at once).
func readable(hs []held) []bool {
	ready := make([]bool, len(hs))
	if len(hs) == 0 {
		return ready
	}
	fds := make([]unix.PollFd, len(hs))
	for i, h := range hs {
		fds[i] = unix.PollFd{Fd: int32(h.fd), Events: unix.POLLIN}
	}
	rawPoll(fds)
	for i, f := range fds {
		ready[i] = f.Revents != 0
	}
	return ready
}

// acceptNow accepts a waiting connection without waiting: -1 when none.
func (l *Listener) acceptNow() (int, error) {
	fd, aerr := -1, error(nil)
	err := l.raw.Control(func(lfd uintptr) {
		fd, aerr = rawAccept(int(lfd))
	})
	switch {
	case err != nil:
		return -1, err
	case aerr == unix.EAGAIN:
		return -1, nil
	case aerr != nil:
		return -1, aerr
	}
	return fd, nil
}

// fileConn makes a net.Conn of an accepted socket, taking it over.
func fileConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "tcp")
	defer f.Close() // FileConn keeps a duplicate
	return net.FileConn(f)
}

// Accept returns the next connection, from whichever way found it first.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case a := <-l.conns:
		return a.c, a.err
	case <-l.done:
		return nil, net.ErrClosed
	case <-l.drained:
		return nil, net.ErrClosed
	}
}

// Detach stops taking connections from the listening socket, whose
// descriptor it closes (a copy of it kept elsewhere, os.File of the
// TCPListener, keeps the socket and its backlog: a new process may take
// over from there), and hands the connections already taken to Accept,
// which then returns net.ErrClosed. None is closed unanswered.
func (l *Listener) Detach() error {
	var err error
	l.detachOnce.Do(func() {
		close(l.detached)
		err = l.ln.Close()
		go func() { l.wg.Wait(); close(l.drained) }()
	})
	return err
}

func (l *Listener) isDetached() bool {
	select {
	case <-l.detached:
		return true
	default:
		return false
	}
}

// Close stops accepting and closes the listener. Connections accepted and
// not yet handed over are closed.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		if !l.isDetached() { // else its socket is closed
			err = l.ln.Close()
		}
		l.wg.Wait()
		for _, h := range l.takeAdopted(nil) {
			rawClose(h.fd)
		}
	})
	return err
}

// Addr is the listener's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }
