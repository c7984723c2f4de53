package auditlog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// maxError bounds an error message kept in a record.
const maxError = 1 << 10

// Wrap returns a backend whose sandboxes append a record to l for every
// Create, Exec, WriteFile and Close. The log is the caller's: closing the
// backend does not close it.
//
// # Errors
//
// A record that cannot be written fails the call that made it with
// ErrSandboxFailed (an unaudited command must not pass silently); the
// sandbox a failed create record was for is closed.
func Wrap(b sandbox.Backend, l *Log) sandbox.Backend { return &backend{inner: b, log: l} }

type backend struct {
	inner sandbox.Backend
	log   *Log
}

func (b *backend) Name() string            { return b.inner.Name() }
func (b *backend) Close() error            { return b.inner.Close() }
func (b *backend) Unwrap() sandbox.Backend { return b.inner }
func (b *backend) Loosened() []string      { return loosened(b.inner) }
func loosened(b sandbox.Backend) []string {
	if l, ok := b.(interface{ Loosened() []string }); ok {
		return l.Loosened()
	}
	return nil
}

func (b *backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	start := time.Now()
	sb, err := b.inner.Create(ctx, spec)
	rec := Record{Op: OpCreate, Episode: spec.Labels[sandbox.LabelEpisode], Backend: b.inner.Name(),
		Loosened: append(spec.Loosened(), loosened(b.inner)...), DurationMS: ms(time.Since(start))}
	if err != nil {
		rec.Image, rec.Runtime, rec.Network, rec.Error = spec.Image, spec.Runtime, spec.Network, errText(err)
		if lerr := b.log.Append(rec); lerr != nil {
			return nil, errors.Join(err, logFailed(lerr))
		}
		return nil, err
	}
	info := sb.Info()
	rec.Sandbox, rec.Image, rec.ImageDigest, rec.Runtime, rec.Network, rec.Workdir =
		info.ID, info.Image, info.ImageDigest, info.Runtime, info.Network, info.Workdir
	if err := b.log.Append(rec); err != nil {
		sb.Close()
		return nil, logFailed(err)
	}
	return newBox(sb, b.log, rec.Episode, info), nil
}

// Fork forks the sandbox it wraps (sandbox.Forker) and logs a create
// record for each child, naming the parent; the children are logged like
// any sandbox. A record that cannot be written closes every child and
// fails the fork.
func (s *box) Fork(ctx context.Context, n int) ([]sandbox.Sandbox, error) {
	f, ok := sandbox.Find[sandbox.Forker](s.inner)
	if !ok {
		return nil, fmt.Errorf("the %s backend's sandboxes cannot be forked: %w", s.info.Backend, sandbox.ErrInvalidSpec)
	}
	start := time.Now()
	kids, err := f.Fork(ctx, n)
	if err != nil {
		rec := s.record(OpCreate)
		rec.Sandbox, rec.ForkedFrom, rec.Error, rec.DurationMS = "", s.info.ID, errText(err), ms(time.Since(start))
		if lerr := s.log.Append(rec); lerr != nil {
			return nil, errors.Join(err, logFailed(lerr))
		}
		return nil, err
	}
	out := make([]sandbox.Sandbox, len(kids))
	for i, k := range kids {
		info := k.Info()
		rec := s.record(OpCreate)
		rec.Sandbox, rec.ForkedFrom, rec.DurationMS = info.ID, s.info.ID, ms(time.Since(start))
		rec.Image, rec.ImageDigest, rec.Runtime, rec.Network, rec.Workdir = info.Image, info.ImageDigest, info.Runtime, info.Network, info.Workdir
		if err := s.log.Append(rec); err != nil {
			sandbox.CloseAll(kids)
			return nil, logFailed(err)
		}
		out[i] = newBox(k, s.log, *s.episode.Load(), info)
	}
	return out, nil
}

func logFailed(err error) error {
	return fmt.Errorf("%v: %w", err, sandbox.ErrSandboxFailed)
}

// box is a sandbox whose calls are logged.
type box struct {
	inner   sandbox.Sandbox
	log     *Log
	episode atomic.Pointer[string]
	info    sandbox.Info

	closeOnce sync.Once
	closeErr  error
}

func newBox(sb sandbox.Sandbox, l *Log, episode string, info sandbox.Info) *box {
	b := &box{inner: sb, log: l, info: info}
	b.episode.Store(&episode)
	return b
}

// NameEpisode records the box's calls for episode id from now on
// (sandbox.EpisodeNamer): a fork serves an episode of its own.
func (s *box) NameEpisode(id string) { s.episode.Store(&id) }

func (s *box) Info() sandbox.Info      { return s.inner.Info() }
func (s *box) Unwrap() sandbox.Sandbox { return s.inner }
func (s *box) record(op string) Record {
	return Record{Op: op, Episode: *s.episode.Load(), Sandbox: s.info.ID, Backend: s.info.Backend, ImageDigest: s.info.ImageDigest}
}

func (s *box) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Result, error) {
	res, err := s.inner.Exec(ctx, req)
	return s.logExec(&req, res, err)
}

// logExec appends an exec's record (Exec): apart, so that the Record (~1.3
// KB of frame) is not on the caller's stack while the command runs, where
// thousands of episodes wait at once.
//
//go:noinline
func (s *box) logExec(req *sandbox.ExecRequest, res sandbox.Result, err error) (sandbox.Result, error) {
	rec := s.record(OpExec)
	describeCommand(&rec, *req)
	if err != nil {
		rec.Error = errText(err)
	} else {
		code := res.ExitCode
		rec.ExitCode, rec.Signal, rec.TimedOut, rec.OOMKilled = &code, res.Signal, res.TimedOut, res.OOMKilled
		rec.StdoutBytes = int64(len(res.Stdout)) + res.StdoutDropped
		rec.StderrBytes = int64(len(res.Stderr)) + res.StderrDropped
		rec.DurationMS = ms(res.Duration)
	}
	if lerr := s.log.Append(rec); lerr != nil {
		return res, errors.Join(err, logFailed(lerr))
	}
	return res, err
}

// describeCommand puts the command in rec, verbatim when small.
func describeCommand(rec *Record, req sandbox.ExecRequest) {
	rec.Workdir = req.Workdir
	if len(req.Argv) > 0 {
		n := 0
		for _, a := range req.Argv {
			n += len(a) + 1
		}
		if n <= InlineBytes {
			rec.Argv = req.Argv
		} else {
			b, _ := json.Marshal(req.Argv)
			rec.InputSHA256, rec.InputBytes = sum(b), len(b)
		}
	} else if len(req.Shell) <= InlineBytes {
		rec.Shell = req.Shell
	} else {
		rec.InputSHA256, rec.InputBytes = sum([]byte(req.Shell)), len(req.Shell)
	}
	if len(req.Stdin) > 0 {
		rec.StdinSHA256, rec.StdinBytes = sum(req.Stdin), len(req.Stdin)
	}
}

func (s *box) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	start := time.Now()
	err := s.inner.WriteFile(ctx, path, data, mode)
	rec := s.record(OpWrite)
	size := int64(len(data))
	rec.Path, rec.Size, rec.SHA256, rec.Mode, rec.DurationMS = path, &size, sum(data), fmt.Sprintf("%04o", mode.Perm()), ms(time.Since(start))
	if err != nil {
		rec.Error = errText(err)
	}
	if lerr := s.log.Append(rec); lerr != nil {
		return errors.Join(err, logFailed(lerr))
	}
	return err
}

func (s *box) ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error) {
	return s.inner.ReadFile(ctx, path, maxBytes)
}

func (s *box) ListFiles(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	return s.inner.ListFiles(ctx, dir)
}

// Close closes the sandbox and records it once.
func (s *box) Close() error {
	s.closeOnce.Do(func() {
		err := s.inner.Close()
		rec := s.record(OpClose)
		if err != nil {
			rec.Error = errText(err)
		}
		s.closeErr = errors.Join(err, s.log.Append(rec))
	})
	return s.closeErr
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func errText(err error) string {
	s := err.Error()
	if len(s) > maxError {
		s = s[:maxError] + "…"
	}
	return s
}
