package guestproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Protocol constants.
const (
	// Magic opens every frame.
	Magic byte = 0xB7
	// Version is the protocol version this package speaks. A frame of any
	// other version is refused.
	Version byte = 1
	// HeaderSize is the size of a frame header.
	HeaderSize = 12
	// MaxFrame caps one frame's payload.
	MaxFrame = 16 << 20
	// ChunkSize is the payload size writers split large messages into, so
	// one big file does not hold the stream for long.
	ChunkSize = 1 << 20
	// MaxMessage caps a reassembled message: a file of MaxFileBytes (64 MiB)
	// or an exec result holding two capped streams, with room to spare.
	MaxMessage = 160 << 20
)

// FlagMore marks a frame whose message continues in the next frame of the
// same id.
const FlagMore byte = 1

// Type is a frame's message type.
type Type byte

// Message types. Requests go host to guest, replies guest to host with the
// request's id.
const (
	TypeHello      Type = 1  // Hello -> HelloReply
	TypeHelloReply Type = 2  //
	TypePing       Type = 3  // empty -> TypePong (empty)
	TypePong       Type = 4  //
	TypeExec       Type = 5  // Exec -> ExecResult or Error
	TypeExecResult Type = 6  //
	TypeCancel     Type = 7  // empty, id of the Exec to cancel; no reply of its own
	TypeReadFile   Type = 8  // ReadFile -> FileData or Error
	TypeFileData   Type = 9  //
	TypeWriteFile  Type = 10 // WriteFile -> TypeOK (empty) or Error
	TypeOK         Type = 11 //
	TypeListDir    Type = 12 // ListDir -> DirList or Error
	TypeDirList    Type = 13 //
	TypeError      Type = 14 // Error, the reply to any request that failed
)

var typeNames = map[Type]string{
	TypeHello: "hello", TypeHelloReply: "hello-reply", TypePing: "ping", TypePong: "pong",
	TypeExec: "exec", TypeExecResult: "exec-result", TypeCancel: "cancel",
	TypeReadFile: "read-file", TypeFileData: "file-data", TypeWriteFile: "write-file",
	TypeOK: "ok", TypeListDir: "list-dir", TypeDirList: "dir-list", TypeError: "error",
}

func (t Type) String() string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type(%d)", byte(t))
}

// Valid reports whether t is a known type.
func (t Type) Valid() bool { _, ok := typeNames[t]; return ok }

// ErrBadFrame is wrapped by every decoding failure: the stream is corrupt or
// speaks another protocol, and cannot be trusted past this point.
var ErrBadFrame = errors.New("guestproto: bad frame")

// Frame is one decoded frame.
type Frame struct {
	Type    Type
	Flags   byte
	ID      uint32
	Payload []byte
}

// AppendHeader appends a frame header to b.
func AppendHeader(b []byte, t Type, flags byte, id uint32, n int) []byte {
	b = append(b, Magic, Version, byte(t), flags)
	b = binary.BigEndian.AppendUint32(b, id)
	return binary.BigEndian.AppendUint32(b, uint32(n))
}

// parseHeader checks a header and returns the payload length.
func parseHeader(h []byte) (Frame, int, error) {
	if h[0] != Magic {
		return Frame{}, 0, fmt.Errorf("%w: magic 0x%02x, want 0x%02x", ErrBadFrame, h[0], Magic)
	}
	if h[1] != Version {
		return Frame{}, 0, fmt.Errorf("%w: protocol version %d, want %d", ErrBadFrame, h[1], Version)
	}
	f := Frame{Type: Type(h[2]), Flags: h[3], ID: binary.BigEndian.Uint32(h[4:8])}
	if !f.Type.Valid() {
		return Frame{}, 0, fmt.Errorf("%w: unknown type %d", ErrBadFrame, h[2])
	}
	if f.Flags&^FlagMore != 0 {
		return Frame{}, 0, fmt.Errorf("%w: unknown flags 0x%02x", ErrBadFrame, f.Flags)
	}
	n := binary.BigEndian.Uint32(h[8:12])
	if n > MaxFrame {
		return Frame{}, 0, fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrBadFrame, n, MaxFrame)
	}
	return f, int(n), nil
}

// DecodeFrame decodes the first frame of b, returning it and the number of
// bytes it used. The payload aliases b. A b too short for a whole frame is
// io.ErrUnexpectedEOF.
func DecodeFrame(b []byte) (Frame, int, error) {
	if len(b) < HeaderSize {
		return Frame{}, 0, io.ErrUnexpectedEOF
	}
	f, n, err := parseHeader(b[:HeaderSize])
	if err != nil {
		return Frame{}, 0, err
	}
	if len(b)-HeaderSize < n {
		return Frame{}, 0, io.ErrUnexpectedEOF
	}
	f.Payload = b[HeaderSize : HeaderSize+n : HeaderSize+n]
	return f, HeaderSize + n, nil
}

// ReadFrame reads one frame from r. The payload is allocated as it arrives,
// so a header announcing a large payload that never comes costs little.
func ReadFrame(r io.Reader) (Frame, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err // io.EOF between frames is a clean end
	}
	f, n, err := parseHeader(h[:])
	if err != nil {
		return Frame{}, err
	}
	const direct = 64 << 10
	if n <= direct {
		f.Payload = make([]byte, n)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			return Frame{}, unexpected(err)
		}
		return f, nil
	}
	var buf bytes.Buffer
	buf.Grow(direct)
	if m, err := io.CopyN(&buf, r, int64(n)); err != nil || m != int64(n) {
		return Frame{}, unexpected(err)
	}
	f.Payload = buf.Bytes()
	return f, nil
}

func unexpected(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Writer writes whole messages as frames. Safe for concurrent use: frames of
// concurrent messages interleave, each frame is written whole.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
	err error
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// WriteMessage writes payload as one message of type t with id, split into
// frames of at most ChunkSize bytes. An empty payload is one empty frame.
func (w *Writer) WriteMessage(t Type, id uint32, payload []byte) error {
	if len(payload) > MaxMessage {
		return fmt.Errorf("guestproto: %s message of %d bytes exceeds %d", t, len(payload), MaxMessage)
	}
	for {
		chunk := payload
		flags := byte(0)
		if len(chunk) > ChunkSize {
			chunk, flags = chunk[:ChunkSize], FlagMore
		}
		if err := w.writeFrame(t, flags, id, chunk); err != nil {
			return err
		}
		payload = payload[len(chunk):]
		if flags == 0 {
			return nil
		}
	}
}

func (w *Writer) writeFrame(t Type, flags byte, id uint32, p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	// Small frames go out in one write (one attach packet); large ones as
	// header then payload, without copying.
	if len(p) <= 32<<10 {
		w.buf = AppendHeader(w.buf[:0], t, flags, id, len(p))
		w.buf = append(w.buf, p...)
		_, w.err = w.w.Write(w.buf)
	} else {
		w.buf = AppendHeader(w.buf[:0], t, flags, id, len(p))
		if _, w.err = w.w.Write(w.buf); w.err == nil {
			_, w.err = w.w.Write(p)
		}
	}
	return w.err
}

// Message is a reassembled message.
type Message struct {
	Type    Type
	ID      uint32
	Payload []byte
}

// Reader reads frames and reassembles messages. Not safe for concurrent use:
// one goroutine owns a stream's reading side.
type Reader struct {
	r       io.Reader
	partial map[uint32]*Message
	pending int // bytes held in partial messages
}

// NewReader returns a Reader on r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r, partial: map[uint32]*Message{}} }

// ReadMessage returns the next whole message. A corrupt stream is an error
// wrapping ErrBadFrame; the end of the stream between messages is io.EOF.
func (r *Reader) ReadMessage() (Message, error) {
	for {
		f, err := ReadFrame(r.r)
		if err != nil {
			if errors.Is(err, io.EOF) && len(r.partial) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return Message{}, err
		}
		m, done, err := r.add(f)
		if err != nil || done {
			return m, err
		}
	}
}

// add folds f into the message of its id.
func (r *Reader) add(f Frame) (Message, bool, error) {
	p := r.partial[f.ID]
	if p == nil {
		if f.Flags&FlagMore == 0 {
			return Message{Type: f.Type, ID: f.ID, Payload: f.Payload}, true, nil
		}
		p = &Message{Type: f.Type, ID: f.ID}
		r.partial[f.ID] = p
	} else if p.Type != f.Type {
		return Message{}, false, fmt.Errorf("%w: id %d continues a %s message with a %s frame", ErrBadFrame, f.ID, p.Type, f.Type)
	}
	if r.pending+len(f.Payload) > MaxMessage {
		return Message{}, false, fmt.Errorf("%w: more than %d bytes of unfinished messages", ErrBadFrame, MaxMessage)
	}
	p.Payload = append(p.Payload, f.Payload...)
	r.pending += len(f.Payload)
	if f.Flags&FlagMore != 0 {
		return Message{}, false, nil
	}
	delete(r.partial, f.ID)
	r.pending -= len(p.Payload)
	return *p, true, nil
}
