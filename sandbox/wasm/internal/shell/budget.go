package shell

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ErrOOM is returned (wrapped) when a command line exceeded its memory cap.
var ErrOOM = errors.New("out of memory")

// ErrTooManyJobs is returned when a command line ran too many concurrent jobs.
var ErrTooManyJobs = errors.New("too many concurrent jobs")

// budget is the memory one command line may make the process hold: its
// variables, the arguments of the command running, command-substitution
// output, pipe buffers, here-documents, lines being read, and what builtins
// accumulate (sort, tac, tail). Every such allocation is charged where it
// is made, before it is made; going over the limit stops the whole command
// line (exit 137, OOMKilled). Shared by every subshell, job and nested
// shell of the command line.
type budget struct {
	limit  int64
	used   atomic.Int64
	cancel context.CancelCauseFunc

	mu  sync.Mutex
	why string
	oom atomic.Bool
}

func newBudget(limit int64, cancel context.CancelCauseFunc) *budget {
	if limit <= 0 {
		limit = 64 << 20
	}
	return &budget{limit: limit, cancel: cancel}
}

// charge adds n bytes, refusing (and stopping the command line) past the
// limit. what names the allocation for the message.
func (b *budget) charge(n int64, what string) error {
	if n <= 0 {
		if n < 0 {
			b.used.Add(n)
		}
		return nil
	}
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return b.fail("%s would exceed the %d MB memory limit", what, b.limit>>20)
	}
	return nil
}

// fits reports, without charging, whether n more bytes would fit: the
// bound of an expansion about to run.
func (b *budget) fits(n int64, what string) error {
	if n < 0 || b.used.Load()+n > b.limit {
		return b.fail("%s would exceed the %d MB memory limit", what, b.limit>>20)
	}
	return nil
}

func (b *budget) release(n int64) {
	if n > 0 {
		b.used.Add(-n)
	}
}

func (b *budget) fail(format string, args ...any) error {
	b.mu.Lock()
	if b.why == "" {
		b.why = fmt.Sprintf(format, args...)
	}
	b.mu.Unlock()
	b.oom.Store(true)
	if b.cancel != nil {
		b.cancel(ErrOOM)
	}
	return fmt.Errorf("%w: %s", ErrOOM, b.reason())
}

func (b *budget) reason() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.why
}

// jobLimiter bounds the goroutines a command line runs at once (pipeline
// stages, background jobs, process substitutions): its pids limit.
type jobLimiter struct {
	limit  int64
	n      atomic.Int64
	cancel context.CancelCauseFunc
	over   atomic.Bool
}

func (j *jobLimiter) begin() error {
	if j.n.Add(1) > j.limit {
		j.n.Add(-1)
		j.over.Store(true)
		if j.cancel != nil {
			j.cancel(ErrTooManyJobs)
		}
		return fmt.Errorf("%w: more than %d concurrent jobs (pipeline stages and background commands)", ErrTooManyJobs, j.limit)
	}
	return nil
}

func (j *jobLimiter) end() { j.n.Add(-1) }
