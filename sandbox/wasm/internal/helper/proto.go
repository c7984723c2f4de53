package helper

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// Version is the protocol version; host and helper refuse each other when
// they differ.
const Version = 1

// Message types. Host to helper: init, exec, cancel, reply. Helper to
// host: hello, ready, request, done.
const (
	mInit    byte = 1
	mExec    byte = 2
	mCancel  byte = 3
	mReply   byte = 4
	mHello   byte = 10
	mReady   byte = 11
	mRequest byte = 12
	mDone    byte = 13
)

// Bounds on what either side accepts.
const (
	maxPath    = 4096
	maxArgs    = 1 << 16
	maxArg     = 8 << 20
	maxEnv     = 4096
	maxIO      = 1 << 20 // one read or write request
	maxEntries = 1 << 20
	maxHandles = 1 << 16 // gpython closes files when its GC runs, not at once
)

// Init configures a helper once it is in its cgroup.
type Init struct {
	// ReadOnly are host paths the helper may read (the compiled-module
	// cache, guest programs, a CPython prefix): everything else is closed
	// to it once it is confined.
	ReadOnly []string
	// CacheDir holds wazero's compiled modules (the host fills it).
	CacheDir string
	// Programs are the names of programs the host registered (besides
	// the guests python and js), which commands may call by name.
	Programs []string
	// MaxThreads bounds the helper's OS threads.
	MaxThreads int
	// Confine turns the confinement on (off only in tests of the
	// confinement itself, which check it is reported).
	Confine bool
}

func (m Init) encode() []byte {
	var e encoder
	e.strs(m.ReadOnly)
	e.str(m.CacheDir)
	e.strs(m.Programs)
	e.uint(uint64(m.MaxThreads))
	e.bool(m.Confine)
	return e.b
}

func decodeInit(b []byte) (Init, error) {
	d := decoder{b: b}
	m := Init{ReadOnly: d.strs(64, maxPath), CacheDir: d.str(maxPath), Programs: d.strs(1024, 256), MaxThreads: d.intn(1 << 16), Confine: d.bool()}
	return m, d.done()
}

// Confinement is what the helper could apply to itself, as it reports it.
type Confinement struct {
	NoNewPrivs bool
	// Landlock is the ABI version in force (0: unavailable, see Notes).
	Landlock int
	Seccomp  bool
	Rlimits  bool
	// CapsDropped: the helper holds no capability.
	CapsDropped bool
	// Notes explain what could not be applied.
	Notes []string
}

func (c Confinement) encode() []byte {
	var e encoder
	e.bool(c.NoNewPrivs)
	e.uint(uint64(c.Landlock))
	e.bool(c.Seccomp)
	e.bool(c.Rlimits)
	e.bool(c.CapsDropped)
	e.strs(c.Notes)
	return e.b
}

func decodeConfinement(b []byte) (Confinement, error) {
	d := decoder{b: b}
	c := Confinement{NoNewPrivs: d.bool(), Landlock: d.intn(1000), Seccomp: d.bool(), Rlimits: d.bool(), CapsDropped: d.bool(), Notes: d.strs(64, 1024)}
	return c, d.done()
}

// Exec is one command line to run.
type Exec struct {
	ID          uint64
	Shell       string
	Argv        []string
	Env         []string // KEY=VALUE
	Dir         string
	Stdin       []byte
	Timeout     time.Duration
	IdleTimeout time.Duration
	OutputCap   int
	MemoryBytes int64
	Jobs        int
	// HeapLimit is the helper's Go memory limit for this exec (below its
	// cgroup's, so the collector works harder instead of the kernel
	// killing the helper for garbage).
	HeapLimit int64
	// Threads is how many OS threads may run the exec's Go code at once
	// (GOMAXPROCS): the spec's CPUs, rounded up.
	Threads int
}

func (m Exec) encode() []byte {
	var e encoder
	e.uint(m.ID)
	e.str(m.Shell)
	e.strs(m.Argv)
	e.strs(m.Env)
	e.str(m.Dir)
	e.bytes(m.Stdin)
	e.int(int64(m.Timeout))
	e.int(int64(m.IdleTimeout))
	e.uint(uint64(m.OutputCap))
	e.int(m.MemoryBytes)
	e.uint(uint64(m.Jobs))
	e.int(m.HeapLimit)
	e.uint(uint64(m.Threads))
	return e.b
}

func decodeExec(b []byte) (Exec, error) {
	d := decoder{b: b}
	m := Exec{ID: d.uint(), Shell: d.str(maxArg), Argv: d.strs(maxArgs, maxArg), Env: d.strs(maxEnv, maxArg),
		Dir: d.str(maxPath), Stdin: d.bytes(MaxFrame), Timeout: time.Duration(d.int()), IdleTimeout: time.Duration(d.int()),
		OutputCap: d.intn(1 << 30), MemoryBytes: d.int(), Jobs: d.intn(1 << 20), HeapLimit: d.int(), Threads: d.intn(1024)}
	return m, d.done()
}

// Cancel reasons.
const (
	CancelCaller  = 1 // the caller's context ended
	CancelClosing = 2 // the sandbox is closing
)

// Cancel stops an exec.
type Cancel struct {
	ID     uint64
	Reason byte
}

func (m Cancel) encode() []byte {
	var e encoder
	e.uint(m.ID)
	e.uint(uint64(m.Reason))
	return e.b
}

func decodeCancel(b []byte) (Cancel, error) {
	d := decoder{b: b}
	m := Cancel{ID: d.uint(), Reason: byte(d.intn(255))}
	return m, d.done()
}

// Done is an exec's result.
type Done struct {
	ID            uint64
	ExitCode      int
	OOMKilled     bool
	Trap          string
	TimedOut      bool
	IdleTimedOut  bool
	Stdout        []byte
	Stderr        []byte
	StdoutDropped int64
	StderrDropped int64
	// Cancelled is the Cancel reason that stopped it, or 0.
	Cancelled byte
	// Internal is set when the helper itself failed (not the command):
	// an infrastructure error.
	Internal string
	// CPU is the helper's CPU time during the exec.
	CPU time.Duration
}

func (m Done) encode() []byte {
	var e encoder
	e.uint(m.ID)
	e.int(int64(m.ExitCode))
	e.bool(m.OOMKilled)
	e.str(m.Trap)
	e.bool(m.TimedOut)
	e.bool(m.IdleTimedOut)
	e.bytes(m.Stdout)
	e.bytes(m.Stderr)
	e.int(m.StdoutDropped)
	e.int(m.StderrDropped)
	e.uint(uint64(m.Cancelled))
	e.str(m.Internal)
	e.int(int64(m.CPU))
	return e.b
}

func decodeDone(b []byte) (Done, error) {
	d := decoder{b: b}
	m := Done{ID: d.uint(), ExitCode: int(d.int()), OOMKilled: d.bool(), Trap: d.str(64 << 10), TimedOut: d.bool(),
		IdleTimedOut: d.bool(), Stdout: d.bytes(MaxFrame / 2), Stderr: d.bytes(MaxFrame / 2), StdoutDropped: d.int(),
		StderrDropped: d.int(), Cancelled: byte(d.intn(255)), Internal: d.str(64 << 10), CPU: time.Duration(d.int())}
	return m, d.done()
}

// Request operations: the helper asks the host for a file system call on
// the current exec's episode, a guest program, or an instance slot.
const (
	opStat byte = 1 + iota
	opLstat
	opOpen
	opRead
	opPread
	opWrite
	opPwrite
	opSeek
	opFstat
	opReadDirH
	opFtruncate
	opClose
	opSetAppend
	opSetModTime
	opReadDir
	opMkdir
	opMkdirAll
	opRemove
	opRemoveAll
	opRename
	opSymlink
	opReadlink
	opChmod
	opChtimes
	opTruncate
	opReadFile
	opWriteFile
	opUsage
	opProgram
	opSlot
	opSlotRelease
	opLast
)

// request header: id (0: no reply wanted), exec id, op; then the op's
// arguments.
func encodeRequest(id, exec uint64, op byte, args func(*encoder)) []byte {
	var e encoder
	e.uint(id)
	e.uint(exec)
	e.uint(uint64(op))
	if args != nil {
		args(&e)
	}
	return e.b
}

// Error codes of a reply.
const (
	errNone = iota
	errPath
	errTooLarge
	errEscape
	errEOF
	errClosed
	errOther
)

// encodeErr writes err so decodeErr rebuilds the same kind on the other
// side (*fs.PathError of a syscall.Errno, *vfs.TooLargeError, vfs.ErrEscape,
// io.EOF, fs.ErrClosed).
func encodeErr(e *encoder, err error) {
	var pe *fs.PathError
	var tl *vfs.TooLargeError
	var errno syscall.Errno
	switch {
	case err == nil:
		e.uint(errNone)
	case errors.As(err, &tl):
		e.uint(errTooLarge)
		e.str(tl.Path)
		e.int(tl.Size)
		e.int(tl.Max)
	case errors.Is(err, vfs.ErrEscape):
		e.uint(errEscape)
		e.str(err.Error())
	case errors.Is(err, io.EOF):
		e.uint(errEOF)
	case errors.Is(err, fs.ErrClosed):
		e.uint(errClosed)
	case errors.As(err, &pe) && errors.As(pe.Err, &errno):
		e.uint(errPath)
		e.str(pe.Op)
		e.str(pe.Path)
		e.uint(uint64(errno))
	case errors.As(err, &errno):
		e.uint(errPath)
		e.str("")
		e.str("")
		e.uint(uint64(errno))
	default:
		e.uint(errOther)
		e.str(err.Error())
	}
}

func decodeErr(d *decoder) error {
	switch d.uint() {
	case errNone:
		return nil
	case errTooLarge:
		return &vfs.TooLargeError{Path: d.str(maxPath), Size: d.int(), Max: d.int()}
	case errEscape:
		msg := d.str(maxPath + 256)
		return fmt.Errorf("%s: %w", msg, vfs.ErrEscape)
	case errEOF:
		return io.EOF
	case errClosed:
		return fs.ErrClosed
	case errPath:
		op, p, errno := d.str(64), d.str(maxPath), syscall.Errno(d.uint())
		if op == "" && p == "" {
			return errno
		}
		return &fs.PathError{Op: op, Path: p, Err: errno}
	default:
		return errors.New(d.str(64 << 10))
	}
}

// encodeInfo writes a file's description.
func encodeInfo(e *encoder, fi fs.FileInfo) {
	e.str(fi.Name())
	e.int(fi.Size())
	e.uint(uint64(fi.Mode()))
	e.int(fi.ModTime().UnixNano())
	var ino, nlink uint64 = 0, 1
	if i, ok := fi.(interface {
		Ino() uint64
		Nlink() uint64
	}); ok {
		ino, nlink = i.Ino(), i.Nlink()
	}
	e.uint(ino)
	e.uint(nlink)
}

func decodeInfo(d *decoder) *vfs.Info {
	name, size, mode, mtime, ino, nlink := d.str(maxPath), d.int(), fs.FileMode(d.uint()), d.int(), d.uint(), d.uint()
	return vfs.NewInfo(name, size, mode, time.Unix(0, mtime), ino, nlink)
}

// dirEntry is a decoded directory entry.
type dirEntry struct{ info *vfs.Info }

func (e dirEntry) Name() string               { return e.info.Name() }
func (e dirEntry) IsDir() bool                { return e.info.IsDir() }
func (e dirEntry) Type() fs.FileMode          { return e.info.Mode().Type() }
func (e dirEntry) Info() (fs.FileInfo, error) { return e.info, nil }

func encodeEntries(e *encoder, ents []fs.DirEntry) {
	e.uint(uint64(len(ents)))
	for _, de := range ents {
		fi, err := de.Info()
		if err != nil {
			fi = vfs.NewInfo(de.Name(), 0, de.Type(), time.Time{}, 0, 1)
		}
		encodeInfo(e, fi)
	}
}

func decodeEntries(d *decoder) []fs.DirEntry {
	n := d.intn(maxEntries)
	out := make([]fs.DirEntry, 0, min(n, 1024))
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, dirEntry{decodeInfo(d)})
	}
	return out
}
