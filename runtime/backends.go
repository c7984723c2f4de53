package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// BackendSource opens sandbox backends by name ("wasm", "docker"). The
// service asks it only when a backend is not open yet (see backendOpener):
// it need not cache what it opens, and must not cache what it failed to open.
type BackendSource interface {
	Backend(ctx context.Context, name string) (sandbox.Backend, error)
}

// BackendFunc adapts a function to BackendSource.
type BackendFunc func(ctx context.Context, name string) (sandbox.Backend, error)

// Backend implements BackendSource.
func (f BackendFunc) Backend(ctx context.Context, name string) (sandbox.Backend, error) {
	return f(ctx, name)
}

// Backend states, as /healthz reports them.
const (
	BackendUnused  = "unused"  // nothing asked for it yet
	BackendOpening = "opening" // the first open is in flight
	BackendUp      = "up"
	// BackendDown: its open failed (re-tried with back-off), or its last
	// createFailuresDown sandboxes failed for the infrastructure's sake.
	BackendDown = "down"
)

// createFailuresDown consecutive infrastructure failures of Create mark an
// open backend down (an engine that went away after it opened).
const createFailuresDown = 3

// Back-off between attempts to open a backend that failed: 500 ms, doubled
// each failure, at most 30 s.
const (
	openBackoffMin = 500 * time.Millisecond
	openBackoffMax = 30 * time.Second
	// openTimeout bounds one open (the first WASM open builds and compiles
	// the guests: minutes on a cold cache).
	openTimeout = 15 * time.Minute
)

// BackendHealth is one backend in /healthz.
type BackendHealth struct {
	State string `json:"state"`
	// Error is the last failure while the backend is down.
	Error string `json:"error,omitempty"`
	// Since is when the backend entered its state.
	Since time.Time `json:"since"`
	// Failures counts consecutive failed opens, or failed creates of an
	// open backend, while it is down.
	Failures int `json:"failures,omitempty"`
	// RetryInS is when the next attempt to open it is due.
	RetryInS float64 `json:"retry_in_s,omitempty"`
	retryAt  time.Time
}

// backendOpener opens sandbox backends on first use, for the whole service.
//
// One open at a time per backend: callers wait for the attempt in flight, or
// give up on their own context without stopping it, because the attempt
// runs under the service's lifecycle context — an episode cancelled while
// its backend opens (a rollout deleted right after it was submitted) cannot
// fail the open for everyone else. Nothing that failed is kept: after a
// back-off (500 ms doubling to 30 s) the next caller tries again, and a
// backend that stays down is re-tried in the background with the same
// back-off, so /healthz sees it come back without an episode having to fail
// on it. A caller during the back-off fails at once, as the infrastructure
// (sandbox.ErrEngineUnavailable): its episode's open is retried, or ends
// sandbox_error, unscored.
type backendOpener struct {
	src    BackendSource
	life   context.Context
	log    *slog.Logger
	states map[string]*backendState // every known backend, fixed at construction
}

type backendState struct {
	name string
	// health is what /healthz reads, without a lock.
	health atomic.Pointer[BackendHealth]
	// createFailures counts consecutive infrastructure failures of Create.
	createFailures atomic.Int64
	openFailures   atomic.Int64 // total, for metrics

	mu       sync.Mutex
	be       sandbox.Backend
	opening  chan struct{} // closed when the attempt in flight ends
	lastErr  error
	failures int // consecutive failed opens
	retryAt  time.Time
	probe    *time.Timer
}

func newBackendOpener(life context.Context, src BackendSource, log *slog.Logger) *backendOpener {
	o := &backendOpener{src: src, life: life, log: log, states: map[string]*backendState{}}
	now := time.Now()
	for _, name := range sandbox.Backends() {
		st := &backendState{name: name}
		st.health.Store(&BackendHealth{State: BackendUnused, Since: now})
		o.states[name] = st
	}
	return o
}

// get returns the backend, opening it if needed.
func (o *backendOpener) get(ctx context.Context, name string) (sandbox.Backend, error) {
	st := o.states[name]
	if st == nil {
		return nil, fmt.Errorf("backend %v: %w", sandbox.CheckBackend(name), sandbox.ErrInvalidSpec)
	}
	for {
		st.mu.Lock()
		if st.be != nil {
			be := st.be
			st.mu.Unlock()
			return be, nil
		}
		if st.opening == nil {
			if wait := time.Until(st.retryAt); st.failures > 0 && wait > 0 {
				err := fmt.Errorf("backend %s is unavailable: %d attempt(s) to open it failed, the last with: %v (the next attempt in %.1fs): %w",
					name, st.failures, st.lastErr, wait.Seconds(), sandbox.ErrEngineUnavailable)
				st.mu.Unlock()
				return nil, err
			}
			o.startLocked(st)
		}
		opening := st.opening
		st.mu.Unlock()
		select {
		case <-opening:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for backend %s to open: %w", name, context.Cause(ctx))
		}
	}
}

// startLocked starts an attempt to open st's backend.
func (o *backendOpener) startLocked(st *backendState) {
	if o.life.Err() != nil {
		return
	}
	st.opening = make(chan struct{})
	if st.failures == 0 {
		st.setHealth(&BackendHealth{State: BackendOpening, Since: time.Now()})
	}
	go func() {
		ctx, cancel := context.WithTimeout(o.life, openTimeout)
		be, err := o.src.Backend(ctx, st.name)
		cancel()
		st.mu.Lock()
		defer st.mu.Unlock()
		close(st.opening)
		st.opening = nil
		if err == nil && be == nil {
			err = errors.New("the backend source returned no backend")
		}
		if err != nil {
			st.failures++
			st.openFailures.Add(1)
			st.lastErr = err
			backoff := min(openBackoffMax, openBackoffMin<<min(st.failures-1, 10))
			st.retryAt = time.Now().Add(backoff)
			since := time.Now()
			if h := st.health.Load(); h.State == BackendDown {
				since = h.Since
			}
			st.setHealth(&BackendHealth{State: BackendDown, Error: err.Error(), Since: since, Failures: st.failures, retryAt: st.retryAt})
			o.log.Warn("a sandbox backend could not be opened; retrying with back-off", "backend", st.name,
				"attempt", st.failures, "retry_in", backoff, "err", err)
			if st.probe != nil {
				st.probe.Stop()
			}
			st.probe = time.AfterFunc(backoff, func() {
				st.mu.Lock()
				defer st.mu.Unlock()
				if st.be == nil && st.opening == nil {
					o.startLocked(st)
				}
			})
			return
		}
		if st.failures > 0 {
			o.log.Info("a sandbox backend opened after failing", "backend", st.name, "failed_attempts", st.failures)
		}
		st.be, st.failures, st.lastErr = be, 0, nil
		st.createFailures.Store(0)
		st.setHealth(&BackendHealth{State: BackendUp, Since: time.Now()})
	}()
}

func (st *backendState) setHealth(h *BackendHealth) { st.health.Store(h) }

// noteCreate records the outcome of a Create on an open backend: a run of
// infrastructure failures marks it down, a success up again.
func (o *backendOpener) noteCreate(name string, err error) {
	st := o.states[name]
	if st == nil {
		return
	}
	switch {
	case err == nil:
		if st.createFailures.Load() != 0 {
			st.createFailures.Store(0)
			if h := st.health.Load(); h.State == BackendDown {
				st.setHealth(&BackendHealth{State: BackendUp, Since: time.Now()})
			}
		}
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
	case errors.Is(err, sandbox.ErrEngineUnavailable) || errors.Is(err, sandbox.ErrSandboxFailed):
		n := st.createFailures.Add(1)
		if n >= createFailuresDown {
			since := time.Now()
			if h := st.health.Load(); h.State == BackendDown {
				since = h.Since
			}
			st.setHealth(&BackendHealth{State: BackendDown, Error: err.Error(), Since: since, Failures: int(n)})
		}
	}
}

// health is every backend's state, read without a lock.
func (o *backendOpener) health() map[string]BackendHealth {
	out := make(map[string]BackendHealth, len(o.states))
	now := time.Now()
	for name, st := range o.states {
		h := *st.health.Load()
		if !h.retryAt.IsZero() && h.retryAt.After(now) {
			h.RetryInS = h.retryAt.Sub(now).Seconds()
		}
		out[name] = h
	}
	return out
}

// Close stops the background retries.
func (o *backendOpener) Close() {
	for _, st := range o.states {
		st.mu.Lock()
		if st.probe != nil {
			st.probe.Stop()
		}
		st.mu.Unlock()
	}
}
