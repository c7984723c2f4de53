package helper

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
)

// A frame is a 4-byte big-endian length, then a 1-byte message type and
// the message. Fields are encoded in order: unsigned varints, signed
// varints, and length-prefixed byte strings. Both ends bound what they
// accept: a frame over MaxFrame, a string over its field's bound or a
// list over its count bound is a protocol error, which ends the
// connection.

// MaxFrame bounds one frame (stdin of an exec, a write, a file read).
const MaxFrame = 80 << 20

// errProto is a malformed or oversized frame.
var errProto = errors.New("helper protocol error")

type encoder struct{ b []byte }

func (e *encoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) int(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) bool(v bool) {
	if v {
		e.uint(1)
	} else {
		e.uint(0)
	}
}
func (e *encoder) bytes(v []byte) {
	e.uint(uint64(len(v)))
	e.b = append(e.b, v...)
}
func (e *encoder) str(v string) {
	e.uint(uint64(len(v)))
	e.b = append(e.b, v...)
}
func (e *encoder) strs(v []string) {
	e.uint(uint64(len(v)))
	for _, s := range v {
		e.str(s)
	}
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or malformed message", errProto)
	}
}

func (d *decoder) uint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) int() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bool() bool { return d.uint() != 0 }

// intn decodes an int that must fit 0..max.
func (d *decoder) intn(max int) int {
	v := d.uint()
	if v > uint64(max) {
		d.fail()
		return 0
	}
	return int(v)
}

func (d *decoder) bytes(max int) []byte {
	n := d.uint()
	if d.err != nil {
		return nil
	}
	if n > uint64(max) || n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(max int) string { return string(d.bytes(max)) }

func (d *decoder) strs(maxCount, maxEach int) []string {
	n := d.uint()
	if d.err != nil {
		return nil
	}
	if n > uint64(maxCount) {
		d.fail()
		return nil
	}
	out := make([]string, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		out = append(out, d.str(maxEach))
	}
	return out
}

// done reports a decoding error, or leftover bytes.
func (d *decoder) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", errProto, len(d.b))
	}
	return d.err
}

// conn is one end of the host-helper connection: frames read by one
// goroutine, written by many (a mutex serialises them).
type conn struct {
	r io.Reader

	mu sync.Mutex
	w  io.Writer
}

func newConn(rw io.ReadWriter) *conn {
	return &conn{r: bufio.NewReaderSize(rw, 64<<10), w: rw}
}

// send writes one frame of type t.
func (c *conn) send(t byte, body []byte) error {
	if len(body)+1 > MaxFrame {
		return fmt.Errorf("%w: frame of %d bytes over %d", errProto, len(body)+1, MaxFrame)
	}
	hdr := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(hdr, uint32(len(body)+1))
	hdr[4] = t
	buf := append(hdr, body...)
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.w.Write(buf)
	return err
}

// recv reads one frame.
func (c *conn) recv() (byte, []byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > MaxFrame || n > math.MaxInt32 {
		return 0, nil, fmt.Errorf("%w: frame length %d", errProto, n)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(c.r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return buf[0], buf[1:], nil
}
