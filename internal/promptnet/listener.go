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
package promptnet

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Listener is a TCP listener whose connections are accepted promptly while
// busy says so.
type Listener struct {
	ln    *net.TCPListener
	raw   syscall.RawConn
	every time.Duration
	busy  func() bool

	conns chan accepted
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
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
)

// Listen wraps ln: while busy() (called every every, so it must be cheap and
// lock-free) new connections are also looked for every every.
func Listen(ln *net.TCPListener, every time.Duration, busy func() bool) (*Listener, error) {
	return listen(ln, every, busy, true)
}

// listen is Listen; without ordinary, only the timer's loop accepts (for
// the tests).
func listen(ln *net.TCPListener, every time.Duration, busy func() bool, ordinary bool) (*Listener, error) {
	raw, err := ln.SyscallConn()
	if err != nil {
		return nil, err
	}
	l := &Listener{ln: ln, raw: raw, every: every, busy: busy, conns: make(chan accepted), done: make(chan struct{})}
	l.wg.Add(1)
	go l.pollLoop()
	if ordinary {
		l.wg.Add(1)
		go l.acceptLoop()
	}
	return l, nil
}

// acceptLoop is the ordinary Accept, through the network poller.
func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
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

// held is a connection accepted before its request arrived.
type held struct {
	fd    int
	since time.Time
}

// pollLoop accepts what is waiting, every l.every while the service is
// busy, and hands each connection over once its request can be read.
func (l *Listener) pollLoop() {
	defer l.wg.Done()
	var waiting []held
	defer func() {
		for _, h := range waiting {
			unix.Close(h.fd)
		}
	}()
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
		case <-tick.C:
		}
		if d == idleCheck && !l.busy() {
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
			c, err := fileConn(h.fd)
			if err != nil {
				continue
			}
			select {
			case l.conns <- accepted{c: c}:
			case <-l.done:
				c.Close()
				for _, h := range waiting[i+1:] {
					unix.Close(h.fd)
				}
				waiting = kept
				return
			}
		}
		waiting = kept
	}
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
	for {
		if _, err := unix.Poll(fds, 0); err != unix.EINTR {
			break
		}
	}
	for i, f := range fds {
		ready[i] = f.Revents != 0
	}
	return ready
}

// acceptNow accepts a waiting connection without waiting: -1 when none.
func (l *Listener) acceptNow() (int, error) {
	fd, aerr := -1, error(nil)
	err := l.raw.Control(func(lfd uintptr) {
		for {
			fd, _, aerr = unix.Accept4(int(lfd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			if aerr != unix.EINTR && aerr != unix.ECONNABORTED {
				return
			}
		}
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
	}
}

// Close stops accepting and closes the listener. Connections accepted and
// not yet handed over are closed.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.ln.Close()
		l.wg.Wait()
	})
	return err
}

// Addr is the listener's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }
