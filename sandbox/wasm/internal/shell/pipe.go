package shell

import (
	"context"
	"io"
	"sync"
	"syscall"
)

// pipeSize is the buffer of one in-memory pipe, like Linux's default.
const pipeSize = 64 << 10

// pipe is an in-memory pipe between two goroutines of a command line: no
// file descriptor, no host thread blocks on it. A writer blocks while the
// buffer is full, a reader while it is empty; both give up when the command
// line's context ends. Writing after the reader closed is EPIPE, like a real
// pipe; reading after the writer closed drains the buffer then sees EOF.
type pipe struct {
	mu       sync.Mutex
	cond     sync.Cond
	buf      []byte
	rClosed  bool
	wClosed  bool
	canceled error
	stop     func() bool
	b        *budget
}

// newPipe makes a pipe whose buffer is charged to b; release with both
// ends' Close.
func newPipe(ctx context.Context, b *budget) (*pipeReader, *pipeWriter, error) {
	if err := b.charge(pipeSize, "a pipe"); err != nil {
		return nil, nil, err
	}
	p := &pipe{b: b}
	p.cond.L = &p.mu
	p.stop = context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.canceled = context.Cause(ctx)
		if p.canceled == nil {
			p.canceled = ctx.Err()
		}
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	return &pipeReader{p}, &pipeWriter{p}, nil
}

func (p *pipe) read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.buf) == 0 {
		switch {
		case p.rClosed:
			return 0, io.ErrClosedPipe
		case p.wClosed:
			return 0, io.EOF
		case p.canceled != nil:
			return 0, p.canceled
		}
		p.cond.Wait()
	}
	n := copy(b, p.buf)
	p.buf = p.buf[n:]
	if len(p.buf) == 0 {
		p.buf = p.buf[:0:0]
	}
	p.cond.Broadcast()
	return n, nil
}

func (p *pipe) write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for len(b) > 0 {
		switch {
		case p.rClosed:
			return n, syscall.EPIPE
		case p.wClosed:
			return n, io.ErrClosedPipe
		case p.canceled != nil:
			return n, p.canceled
		}
		room := pipeSize - len(p.buf)
		if room == 0 {
			p.cond.Wait()
			continue
		}
		k := min(room, len(b))
		if p.buf == nil {
			p.buf = make([]byte, 0, pipeSize)
		} else if cap(p.buf)-len(p.buf) < k {
			nb := make([]byte, len(p.buf), pipeSize)
			copy(nb, p.buf)
			p.buf = nb
		}
		p.buf = append(p.buf, b[:k]...)
		b = b[k:]
		n += k
		p.cond.Broadcast()
	}
	return n, nil
}

func (p *pipe) closeEnd(reader bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	already := p.rClosed && p.wClosed
	if reader {
		p.rClosed = true
		p.buf = nil
	} else {
		p.wClosed = true
	}
	p.cond.Broadcast()
	if !already && p.rClosed && p.wClosed {
		p.stop()
		p.b.release(pipeSize)
	}
}

type pipeReader struct{ p *pipe }

func (r *pipeReader) Read(b []byte) (int, error) { return r.p.read(b) }

// Close closes the read end: later writes fail with EPIPE.
func (r *pipeReader) Close() error { r.p.closeEnd(true); return nil }

type pipeWriter struct{ p *pipe }

func (w *pipeWriter) Write(b []byte) (int, error) { return w.p.write(b) }

// Close closes the write end: the reader sees EOF after the buffer.
func (w *pipeWriter) Close() error { w.p.closeEnd(false); return nil }
