package guestproto

import (
	"fmt"
	"time"
)

// Hello opens a session: the host names the protocol version it speaks and
// the guest's settings for this sandbox.
type Hello struct {
	Version int
	// WritableRoots are the directories WriteFile may write under (the
	// workdir, /tmp). Reads and listings of a path under one of them never
	// follow a symlink out of it.
	WritableRoots []string
	// MemoryGuardBytes, when set, makes the guest stop the largest command
	// once the sandbox uses more memory than this: for runtimes (gVisor)
	// where the kernel's OOM killer would take the whole sandbox instead.
	MemoryGuardBytes int64
	// ProcessLimit, when set, is applied as RLIMIT_NPROC to the guest and
	// every command: for runtimes (gVisor) where the host's pids limit would
	// take the whole sandbox down instead of failing a fork.
	ProcessLimit int64
	// Key, when set (KeySize bytes), makes the guest seal every reply from
	// this one on (Seal), so the host can drop replies a command forged.
	// Optional on the wire: a Hello without it decodes as before.
	Key []byte
	// SharedRoots are the writable roots the guest makes sticky and
	// world-writable (1777, like /tmp); the other writable roots get read,
	// write and search for their owner. A root the guest does not own is
	// left as it is. Optional on the wire, after Key.
	SharedRoots []string
}

// HelloReply answers Hello.
type HelloReply struct {
	Version int
	// Agent names the guest build, for logs.
	Agent string
	PID   int
	// OOMSource says how the guest detects OOM kills: "cgroup1", "cgroup2",
	// "guard" or "none".
	OOMSource string
	// Sealed is set when the guest seals its replies with Hello.Key.
	Sealed bool
}

// Exec starts one command. Exactly one of Argv and Shell is set.
type Exec struct {
	Argv  []string
	Shell string
	// Env is the command's whole environment, KEY=VALUE.
	Env         []string
	Workdir     string
	Timeout     time.Duration
	IdleTimeout time.Duration
	// OutputCap caps each of stdout and stderr (head and tail kept).
	OutputCap int64
	Stdin     []byte
}

// ExecResult is what one command did.
type ExecResult struct {
	ExitCode      int
	Signal        string
	Stdout        []byte
	Stderr        []byte
	StdoutDropped int64
	StderrDropped int64
	TimedOut      bool
	IdleTimedOut  bool
	OOMKilled     bool
	Duration      time.Duration
}

// ReadFile asks for a file's contents.
type ReadFile struct {
	Path     string
	MaxBytes int64
}

// FileData is a file's contents.
type FileData struct{ Data []byte }

// WriteFile creates or replaces a file, making parent directories.
type WriteFile struct {
	Path string
	Mode uint32 // permission bits
	Data []byte
}

// ListDir asks for a directory's entries.
type ListDir struct{ Path string }

// DirEntry is one entry of a DirList.
type DirEntry struct {
	Name    string
	Size    int64
	Mode    uint32 // io/fs.FileMode bits
	IsDir   bool
	ModTime time.Time
	Link    string
}

// DirList is a directory's entries, sorted by name.
type DirList struct{ Entries []DirEntry }

// Error codes carried by Error.
const (
	CodeNotFound   = "not_found"
	CodePathEscape = "path_escape"
	CodeTooLarge   = "too_large"
	CodeInvalid    = "invalid"
	// CodeDenied: the file exists but the command user may not do that to
	// it (EACCES, EPERM, EROFS): the caller's to handle, like a shell's
	// "permission denied".
	CodeDenied = "denied"
	// CodeInternal: the guest failed at something of its own (a pipe, a
	// sweep, an I/O error): the sandbox's failure, not the request's.
	CodeInternal = "internal"
)

// Error is the reply to a request that failed.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Encode methods append the message's payload to b.

func (m *Hello) Encode(b []byte) []byte {
	e := encoder{b}
	e.uint(uint64(m.Version))
	e.strs(m.WritableRoots)
	e.int(m.MemoryGuardBytes)
	e.int(m.ProcessLimit)
	if len(m.Key) > 0 || len(m.SharedRoots) > 0 {
		e.bytes(m.Key)
	}
	if len(m.SharedRoots) > 0 {
		e.strs(m.SharedRoots)
	}
	return e.b
}

func (m *HelloReply) Encode(b []byte) []byte {
	e := encoder{b}
	e.uint(uint64(m.Version))
	e.str(m.Agent)
	e.int(int64(m.PID))
	e.str(m.OOMSource)
	if m.Sealed {
		e.bool(true)
	}
	return e.b
}

func (m *Exec) Encode(b []byte) []byte {
	e := encoder{b}
	e.strs(m.Argv)
	e.str(m.Shell)
	e.strs(m.Env)
	e.str(m.Workdir)
	e.int(int64(m.Timeout))
	e.int(int64(m.IdleTimeout))
	e.int(m.OutputCap)
	e.bytes(m.Stdin)
	return e.b
}

func (m *ExecResult) Encode(b []byte) []byte {
	e := encoder{b}
	e.int(int64(m.ExitCode))
	e.str(m.Signal)
	e.bytes(m.Stdout)
	e.bytes(m.Stderr)
	e.int(m.StdoutDropped)
	e.int(m.StderrDropped)
	e.bool(m.TimedOut)
	e.bool(m.IdleTimedOut)
	e.bool(m.OOMKilled)
	e.int(int64(m.Duration))
	return e.b
}

func (m *ReadFile) Encode(b []byte) []byte {
	e := encoder{b}
	e.str(m.Path)
	e.int(m.MaxBytes)
	return e.b
}

func (m *FileData) Encode(b []byte) []byte {
	e := encoder{b}
	e.bytes(m.Data)
	return e.b
}

func (m *WriteFile) Encode(b []byte) []byte {
	e := encoder{b}
	e.str(m.Path)
	e.uint(uint64(m.Mode))
	e.bytes(m.Data)
	return e.b
}

func (m *ListDir) Encode(b []byte) []byte {
	e := encoder{b}
	e.str(m.Path)
	return e.b
}

func (m *DirList) Encode(b []byte) []byte {
	e := encoder{b}
	e.uint(uint64(len(m.Entries)))
	for _, en := range m.Entries {
		e.str(en.Name)
		e.int(en.Size)
		e.uint(uint64(en.Mode))
		e.bool(en.IsDir)
		e.int(en.ModTime.UnixNano())
		e.str(en.Link)
	}
	return e.b
}

func (m *Error) Encode(b []byte) []byte {
	e := encoder{b}
	e.str(m.Code)
	e.str(m.Message)
	return e.b
}

// Decode methods parse a payload; any malformation wraps ErrBadFrame.

func (m *Hello) Decode(p []byte) error {
	d := decoder{b: p}
	m.Version = int(min(d.uint(), 1<<31))
	m.WritableRoots = d.strs()
	m.MemoryGuardBytes = d.int()
	m.ProcessLimit = d.int()
	if len(d.b) > 0 && d.err == nil {
		m.Key = d.bytes()
		if len(m.Key) == 0 {
			m.Key = nil
		}
	}
	if len(d.b) > 0 && d.err == nil {
		m.SharedRoots = d.strs()
	}
	return d.end("hello")
}

func (m *HelloReply) Decode(p []byte) error {
	d := decoder{b: p}
	m.Version = int(min(d.uint(), 1<<31))
	m.Agent = d.str()
	m.PID = int(d.int())
	m.OOMSource = d.str()
	if len(d.b) > 0 && d.err == nil {
		m.Sealed = d.bool()
	}
	return d.end("hello reply")
}

func (m *Exec) Decode(p []byte) error {
	d := decoder{b: p}
	m.Argv = d.strs()
	m.Shell = d.str()
	m.Env = d.strs()
	m.Workdir = d.str()
	m.Timeout = time.Duration(d.int())
	m.IdleTimeout = time.Duration(d.int())
	m.OutputCap = d.int()
	m.Stdin = d.bytes()
	return d.end("exec")
}

func (m *ExecResult) Decode(p []byte) error {
	d := decoder{b: p}
	m.ExitCode = int(d.int())
	m.Signal = d.str()
	m.Stdout = d.bytes()
	m.Stderr = d.bytes()
	m.StdoutDropped = d.int()
	m.StderrDropped = d.int()
	m.TimedOut = d.bool()
	m.IdleTimedOut = d.bool()
	m.OOMKilled = d.bool()
	m.Duration = time.Duration(d.int())
	return d.end("exec result")
}

func (m *ReadFile) Decode(p []byte) error {
	d := decoder{b: p}
	m.Path = d.str()
	m.MaxBytes = d.int()
	return d.end("read file")
}

func (m *FileData) Decode(p []byte) error {
	d := decoder{b: p}
	m.Data = d.bytes()
	return d.end("file data")
}

func (m *WriteFile) Decode(p []byte) error {
	d := decoder{b: p}
	m.Path = d.str()
	m.Mode = uint32(d.uint())
	m.Data = d.bytes()
	return d.end("write file")
}

func (m *ListDir) Decode(p []byte) error {
	d := decoder{b: p}
	m.Path = d.str()
	return d.end("list dir")
}

func (m *DirList) Decode(p []byte) error {
	d := decoder{b: p}
	n := d.uint()
	if n > uint64(len(d.b)) {
		d.fail("dir list")
		return d.err
	}
	m.Entries = make([]DirEntry, 0, n)
	for range n {
		var en DirEntry
		en.Name = d.str()
		en.Size = d.int()
		en.Mode = uint32(d.uint())
		en.IsDir = d.bool()
		en.ModTime = time.Unix(0, d.int())
		en.Link = d.str()
		if d.err != nil {
			return d.err
		}
		m.Entries = append(m.Entries, en)
	}
	return d.end("dir list")
}

func (m *Error) Decode(p []byte) error {
	d := decoder{b: p}
	m.Code = d.str()
	m.Message = d.str()
	return d.end("error")
}

// Payload is implemented by every message body.
type Payload interface {
	Encode(b []byte) []byte
	Decode(p []byte) error
}

// New returns an empty body for t, or nil for types without one (ping, pong,
// cancel, ok).
func New(t Type) Payload {
	switch t {
	case TypeHello:
		return &Hello{}
	case TypeHelloReply:
		return &HelloReply{}
	case TypeExec:
		return &Exec{}
	case TypeExecResult:
		return &ExecResult{}
	case TypeReadFile:
		return &ReadFile{}
	case TypeFileData:
		return &FileData{}
	case TypeWriteFile:
		return &WriteFile{}
	case TypeListDir:
		return &ListDir{}
	case TypeDirList:
		return &DirList{}
	case TypeError:
		return &Error{}
	}
	return nil
}

// DecodeMessage decodes m's body. Types without a body must have an empty
// payload.
func DecodeMessage(m Message) (Payload, error) {
	p := New(m.Type)
	if p == nil {
		if len(m.Payload) != 0 {
			return nil, fmt.Errorf("%w: %s carries %d bytes, want none", ErrBadFrame, m.Type, len(m.Payload))
		}
		return nil, nil
	}
	if err := p.Decode(m.Payload); err != nil {
		return nil, err
	}
	return p, nil
}
