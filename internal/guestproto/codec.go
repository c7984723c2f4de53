package guestproto

import (
	"encoding/binary"
	"fmt"
)

// encoder appends fields to a payload.
type encoder struct{ b []byte }

func (e *encoder) uint(v uint64)  { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) int(v int64)    { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) bytes(p []byte) { e.uint(uint64(len(p))); e.b = append(e.b, p...) }
func (e *encoder) str(s string)   { e.uint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *encoder) strs(ss []string) {
	e.uint(uint64(len(ss)))
	for _, s := range ss {
		e.str(s)
	}
}

// decoder reads fields from a payload. The first error sticks; every length
// is checked against what is left before anything is allocated.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or malformed %s", ErrBadFrame, what)
	}
}

func (d *decoder) uint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("uvarint")
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
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bool() bool {
	if d.err != nil {
		return false
	}
	if len(d.b) == 0 || d.b[0] > 1 {
		d.fail("bool")
		return false
	}
	v := d.b[0] == 1
	d.b = d.b[1:]
	return v
}

// raw returns the next length-prefixed field, aliasing the payload.
func (d *decoder) raw() []byte {
	n := d.uint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("length-prefixed field")
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) bytes() []byte {
	p := d.raw()
	if p == nil {
		return nil
	}
	return append([]byte{}, p...)
}

func (d *decoder) str() string { return string(d.raw()) }

func (d *decoder) strs() []string {
	n := d.uint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) { // every string takes at least its length byte
		d.fail("string list")
		return nil
	}
	if n == 0 {
		return nil
	}
	out := make([]string, 0, n)
	for range n {
		out = append(out, d.str())
		if d.err != nil {
			return nil
		}
	}
	return out
}

// end reports trailing bytes as an error: a payload is exactly its fields.
func (d *decoder) end(what string) error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes after %s", ErrBadFrame, len(d.b), what)
	}
	return d.err
}
