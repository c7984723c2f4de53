package guestproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
)

// ErrClientClosed is returned by calls on a client whose stream ended; Err
// says why.
var ErrClientClosed = errors.New("guestproto: stream closed")

// Client is the host's end: it sends requests with fresh ids and routes each
// reply to its caller. One goroutine, started by NewClient and ended by the
// end of the stream, reads replies.
type Client struct {
	w *Writer

	done chan struct{} // closed when the reading side ends

	mu       sync.Mutex
	next     uint32
	pending  map[uint32]chan Message
	err      error  // why the stream ended
	key      []byte // replies must be sealed with it, once set
	rejected int64  // replies dropped for a bad or missing seal
}

// Authenticate makes the client accept only replies sealed with key (see
// Seal) from now on: a reply that fails is dropped, as if never sent, and
// counted by Rejected. Call it before sending the Hello that carries key.
func (c *Client) Authenticate(key []byte) {
	c.mu.Lock()
	c.key = append([]byte(nil), key...)
	c.mu.Unlock()
}

// Rejected counts the replies dropped because their seal did not match:
// something other than the guest wrote into the stream.
func (c *Client) Rejected() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rejected
}

// NewClient starts reading replies from r and writes requests to w. The
// client ends when r does (close the underlying stream to end it).
func NewClient(r io.Reader, w io.Writer) *Client {
	c := &Client{w: NewWriter(w), done: make(chan struct{}), pending: map[uint32]chan Message{}}
	go c.read(NewReader(r))
	return c
}

func (c *Client) read(r *Reader) {
	var err error
	for {
		var m Message
		m, err = r.ReadMessage()
		if err != nil {
			break
		}
		c.mu.Lock()
		if c.key != nil {
			var ok bool
			if m, ok = Open(c.key, m); !ok {
				c.rejected++
				c.mu.Unlock()
				continue
			}
		}
		ch := c.pending[m.ID]
		delete(c.pending, m.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- m // buffered: never blocks
		}
		// A reply nobody waits for (its caller gave up) is dropped.
	}
	if errors.Is(err, io.EOF) {
		err = io.EOF
	}
	c.mu.Lock()
	c.err = err
	c.pending = nil
	c.mu.Unlock()
	close(c.done)
}

// Done is closed when the stream has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the stream ended (io.EOF for a clean end), nil while it runs.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Call sends a request and waits for its reply. A reply of TypeError is
// returned as an *Error. When ctx ends first, the guest is told to cancel
// the request and ctx's error is returned. When the stream ends first, the
// error wraps ErrClientClosed.
func (c *Client) Call(ctx context.Context, t Type, body Payload) (Message, error) {
	var payload []byte
	if body != nil {
		payload = body.Encode(nil)
	}
	ch := make(chan Message, 1)
	c.mu.Lock()
	if c.pending == nil {
		err := c.err
		c.mu.Unlock()
		return Message{}, fmt.Errorf("%w: %v", ErrClientClosed, err)
	}
	c.next++
	if c.next == 0 {
		c.next = 1
	}
	id := c.next
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.w.WriteMessage(t, id, payload); err != nil {
		c.forget(id)
		return Message{}, fmt.Errorf("%w: writing %s: %v", ErrClientClosed, t, err)
	}
	select {
	case m := <-ch:
		if m.Type == TypeError {
			var e Error
			if err := e.Decode(m.Payload); err != nil {
				return Message{}, err
			}
			return Message{}, &e
		}
		return m, nil
	case <-ctx.Done():
		c.forget(id)
		c.w.WriteMessage(TypeCancel, id, nil) // best effort: the stream may be gone
		return Message{}, ctx.Err()
	case <-c.done:
		select {
		case m := <-ch: // the reply raced the end of the stream
			if m.Type != TypeError {
				return m, nil
			}
		default:
		}
		return Message{}, fmt.Errorf("%w: %v", ErrClientClosed, c.Err())
	}
}

func (c *Client) forget(id uint32) {
	c.mu.Lock()
	if c.pending != nil {
		delete(c.pending, id)
	}
	c.mu.Unlock()
}

// Expect checks a reply's type and decodes its body into into.
func Expect(m Message, t Type, into Payload) error {
	if m.Type != t {
		return fmt.Errorf("%w: got %s, want %s", ErrBadFrame, m.Type, t)
	}
	if into == nil {
		if len(m.Payload) != 0 {
			return fmt.Errorf("%w: %s carries %d bytes, want none", ErrBadFrame, t, len(m.Payload))
		}
		return nil
	}
	return into.Decode(m.Payload)
}
