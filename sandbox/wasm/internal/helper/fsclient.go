package helper

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"time"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// errConnLost fails calls once the connection to the host is gone.
var errConnLost = errors.New("connection to the host lost")

// caller sends requests to the host and waits for their replies, which the
// connection's reader hands to it.
type caller struct {
	c *conn

	mu     sync.Mutex
	nextID uint64
	wait   map[uint64]chan []byte
	dead   error
}

func newCaller(c *conn) *caller {
	return &caller{c: c, wait: map[uint64]chan []byte{}}
}

// call sends a request and waits for its reply, returning a decoder over
// the reply's fields after the error, which it returns decoded.
func (cl *caller) call(exec uint64, op byte, args func(*encoder)) (*decoder, error) {
	cl.mu.Lock()
	if cl.dead != nil {
		cl.mu.Unlock()
		return nil, cl.dead
	}
	cl.nextID++
	id := cl.nextID
	ch := make(chan []byte, 1)
	cl.wait[id] = ch
	cl.mu.Unlock()
	if err := cl.c.send(mRequest, encodeRequest(id, exec, op, args)); err != nil {
		cl.fail(err)
	}
	body, ok := <-ch
	if !ok {
		return nil, cl.dead
	}
	d := &decoder{b: body}
	err := decodeErr(d)
	if d.err != nil {
		return nil, d.err
	}
	return d, err
}

// notify sends a request that wants no reply.
func (cl *caller) notify(exec uint64, op byte, args func(*encoder)) {
	cl.c.send(mRequest, encodeRequest(0, exec, op, args))
}

// deliver hands a reply to its caller.
func (cl *caller) deliver(body []byte) error {
	d := decoder{b: body}
	id := d.uint()
	if d.err != nil {
		return d.err
	}
	cl.mu.Lock()
	ch := cl.wait[id]
	delete(cl.wait, id)
	cl.mu.Unlock()
	if ch == nil {
		return fmt.Errorf("%w: reply to unknown request %d", errProto, id)
	}
	ch <- d.b
	return nil
}

// fail ends every waiting call.
func (cl *caller) fail(err error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.dead == nil {
		cl.dead = fmt.Errorf("%w: %v", errConnLost, err)
	}
	for id, ch := range cl.wait {
		close(ch)
		delete(cl.wait, id)
	}
}

// remoteFS is the episode filesystem of one exec, served by the host.
type remoteFS struct {
	cl   *caller
	exec uint64
}

var _ vfs.FileSystem = remoteFS{}

func (r remoteFS) pathOp(op byte, p string, args func(*encoder)) (*decoder, error) {
	return r.cl.call(r.exec, op, func(e *encoder) {
		e.str(p)
		if args != nil {
			args(e)
		}
	})
}

func (r remoteFS) Stat(p string) (fs.FileInfo, error) {
	d, err := r.pathOp(opStat, p, nil)
	if err != nil {
		return nil, err
	}
	return decodeInfo(d), d.done()
}

func (r remoteFS) Lstat(p string) (fs.FileInfo, error) {
	d, err := r.pathOp(opLstat, p, nil)
	if err != nil {
		return nil, err
	}
	return decodeInfo(d), d.done()
}

func (r remoteFS) OpenFile(p string, flag int, perm fs.FileMode) (vfs.File, error) {
	d, err := r.pathOp(opOpen, p, func(e *encoder) {
		e.int(int64(flag))
		e.uint(uint64(perm))
	})
	if err != nil {
		return nil, err
	}
	h := d.uint()
	info := decodeInfo(d)
	app := d.bool()
	pre := d.bytes(prefetch)
	eof := d.bool()
	if err := d.done(); err != nil {
		return nil, err
	}
	return &remoteFile{fs: r, h: h, info: info, append: app, pre: append([]byte(nil), pre...), preEOF: eof}, nil
}

func (r remoteFS) ReadDir(p string) ([]fs.DirEntry, error) {
	d, err := r.pathOp(opReadDir, p, nil)
	if err != nil {
		return nil, err
	}
	ents := decodeEntries(d)
	return ents, d.done()
}

func (r remoteFS) simple(op byte, p string, args func(*encoder)) error {
	d, err := r.pathOp(op, p, args)
	if err != nil {
		return err
	}
	return d.done()
}

func (r remoteFS) Mkdir(p string, perm fs.FileMode) error {
	return r.simple(opMkdir, p, func(e *encoder) { e.uint(uint64(perm)) })
}

func (r remoteFS) MkdirAll(p string, perm fs.FileMode) error {
	return r.simple(opMkdirAll, p, func(e *encoder) { e.uint(uint64(perm)) })
}

func (r remoteFS) Remove(p string) error    { return r.simple(opRemove, p, nil) }
func (r remoteFS) RemoveAll(p string) error { return r.simple(opRemoveAll, p, nil) }

func (r remoteFS) Rename(oldp, newp string) error {
	return r.simple(opRename, oldp, func(e *encoder) { e.str(newp) })
}

func (r remoteFS) Symlink(target, link string) error {
	return r.simple(opSymlink, link, func(e *encoder) { e.str(target) })
}

func (r remoteFS) Readlink(p string) (string, error) {
	d, err := r.pathOp(opReadlink, p, nil)
	if err != nil {
		return "", err
	}
	t := d.str(maxPath)
	return t, d.done()
}

func (r remoteFS) Chmod(p string, perm fs.FileMode) error {
	return r.simple(opChmod, p, func(e *encoder) { e.uint(uint64(perm)) })
}

func (r remoteFS) Chtimes(p string, mtime time.Time) error {
	return r.simple(opChtimes, p, func(e *encoder) { e.int(mtime.UnixNano()) })
}

func (r remoteFS) Truncate(p string, size int64) error {
	return r.simple(opTruncate, p, func(e *encoder) { e.int(size) })
}

func (r remoteFS) ReadFile(p string, max int64) ([]byte, error) {
	d, err := r.pathOp(opReadFile, p, func(e *encoder) { e.int(max) })
	if err != nil {
		return nil, err
	}
	data := d.bytes(MaxFrame)
	return append([]byte(nil), data...), d.done()
}

func (r remoteFS) WriteFile(p string, data []byte, perm fs.FileMode) error {
	if len(data) > MaxFrame-maxPath-64 {
		return &fs.PathError{Op: "write", Path: p, Err: errors.New("file too large to write in one request")}
	}
	return r.simple(opWriteFile, p, func(e *encoder) {
		e.uint(uint64(perm))
		e.bytes(data)
	})
}

func (r remoteFS) Usage() (used, limit int64) {
	d, err := r.cl.call(r.exec, opUsage, nil)
	if err != nil {
		return 0, 0
	}
	used, limit = d.int(), d.int()
	d.done()
	return used, limit
}

// remoteFile is an open file of the host's episode filesystem.
type remoteFile struct {
	fs   remoteFS
	h    uint64
	info *vfs.Info

	mu     sync.Mutex
	append bool
	closed bool
	// pre is what the open brought of the file, not yet read; preEOF says
	// it reached the end (the host's offset is past pre).
	pre    []byte
	preEOF bool
}

// takePre serves a Read from the prefetched bytes; ok is false when it
// must go to the host.
func (f *remoteFile) takePre(p []byte) (n int, eof, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.pre) > 0 {
		n = copy(p, f.pre)
		f.pre = f.pre[n:]
		return n, false, true
	}
	if f.preEOF {
		f.preEOF = false // once: a later read asks the host again
		return 0, true, true
	}
	return 0, false, false
}

// dropPre forgets the prefetched bytes (the offset moves): it returns how
// many there were, which the host's offset is ahead of this file's.
func (f *remoteFile) dropPre() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.pre)
	f.pre, f.preEOF = nil, false
	return n
}

var _ vfs.File = (*remoteFile)(nil)

func (f *remoteFile) handleOp(op byte, args func(*encoder)) (*decoder, error) {
	return f.fs.cl.call(f.fs.exec, op, func(e *encoder) {
		e.uint(f.h)
		if args != nil {
			args(e)
		}
	})
}

func (f *remoteFile) readOp(op byte, p []byte, off int64) (int, error) {
	total := 0
	for len(p) > 0 {
		n := min(len(p), maxIO)
		d, err := f.handleOp(op, func(e *encoder) {
			if op == opPread {
				e.int(off + int64(total))
			}
			e.uint(uint64(n))
		})
		if d != nil && len(d.b) > 0 {
			data := d.bytes(maxIO)
			if derr := d.done(); derr != nil {
				return total, derr
			}
			k := copy(p, data)
			total += k
			p = p[k:]
			if k < n && err == nil {
				return total, nil // a short read: what there is
			}
		}
		if err != nil {
			return total, err
		}
		if op == opRead {
			break // one request per Read, like a read(2)
		}
	}
	return total, nil
}

func (f *remoteFile) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if n, eof, ok := f.takePre(p); ok {
		if eof {
			return 0, io.EOF
		}
		return n, nil
	}
	return f.readOp(opRead, p, 0)
}

func (f *remoteFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.readOp(opPread, p, off)
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

func (f *remoteFile) writeOp(op byte, p []byte, off int64) (int, error) {
	total := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), maxIO)]
		d, err := f.handleOp(op, func(e *encoder) {
			if op == opPwrite {
				e.int(off + int64(total))
			}
			e.bytes(chunk)
		})
		var n int
		if d != nil && len(d.b) > 0 {
			n = d.intn(maxIO)
			if derr := d.done(); derr != nil && err == nil {
				err = derr
			}
		}
		total += n
		if err != nil {
			return total, err
		}
		p = p[n:]
		if n < len(chunk) {
			return total, io.ErrShortWrite
		}
	}
	return total, nil
}

func (f *remoteFile) Write(p []byte) (int, error) {
	if n := f.dropPre(); n > 0 {
		if _, err := f.Seek(-int64(n), io.SeekCurrent); err != nil {
			return 0, err
		}
	}
	return f.writeOp(opWrite, p, 0)
}

func (f *remoteFile) WriteAt(p []byte, off int64) (int, error) { return f.writeOp(opPwrite, p, off) }

func (f *remoteFile) Seek(offset int64, whence int) (int64, error) {
	if n := f.dropPre(); n > 0 && whence == io.SeekCurrent {
		offset -= int64(n) // the host is ahead by what was prefetched
	}
	d, err := f.handleOp(opSeek, func(e *encoder) {
		e.int(offset)
		e.uint(uint64(whence))
	})
	if err != nil {
		return 0, err
	}
	pos := d.int()
	return pos, d.done()
}

func (f *remoteFile) Stat() (fs.FileInfo, error) {
	d, err := f.handleOp(opFstat, nil)
	if err != nil {
		return nil, err
	}
	return decodeInfo(d), d.done()
}

func (f *remoteFile) ReadDir(n int) ([]fs.DirEntry, error) {
	d, err := f.handleOp(opReadDirH, func(e *encoder) { e.int(int64(n)) })
	if d == nil {
		return nil, err
	}
	ents := decodeEntries(d)
	if derr := d.done(); derr != nil {
		return nil, derr
	}
	return ents, err
}

func (f *remoteFile) Truncate(size int64) error {
	d, err := f.handleOp(opFtruncate, func(e *encoder) { e.int(size) })
	if err != nil {
		return err
	}
	return d.done()
}

func (f *remoteFile) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	// Closing an episode file cannot fail: no round trip for it.
	f.fs.cl.notify(f.fs.exec, opClose, func(e *encoder) { e.uint(f.h) })
	return nil
}

func (f *remoteFile) Append() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.append
}

func (f *remoteFile) SetAppend(on bool) error {
	d, err := f.handleOp(opSetAppend, func(e *encoder) { e.bool(on) })
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.append = on
	f.mu.Unlock()
	return d.done()
}

func (f *remoteFile) SetModTime(t time.Time) error {
	d, err := f.handleOp(opSetModTime, func(e *encoder) { e.int(t.UnixNano()) })
	if err != nil {
		return err
	}
	return d.done()
}
