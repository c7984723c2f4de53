package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func TestABackendThatFailedToOpenIsOpenedAgainOnTheNextUse(t *testing.T) {
	cfg := readConfig(os.Getenv)
	real := cfg.cacheDir
	blocked := filepath.Join(t.TempDir(), "cache")
	os.WriteFile(blocked, []byte("a file where the cache directory should be"), 0o644)
	cfg.cacheDir = blocked
	b := newBackendSet(io.Discard, cfg)
	defer b.Close()
	if _, err := b.get(context.Background(), "wasm"); err == nil {
		t.Fatal("the wasm backend opened over a cache directory that is a file")
	}
	b.opts.cfg.cacheDir = real // the operator fixed it
	if _, err := b.get(context.Background(), "wasm"); err != nil {
		t.Fatalf("the second open: %v", err)
	}
}

// A backend whose opening hangs (an engine that accepts and never answers,
// a clean-up that waits on it) holds up only the episodes that need it:
// another backend opens meanwhile, and a caller that gives up is not kept
// waiting, nor does it skip what must run before the backend opens.
func TestABackendThatHangsWhileOpeningHoldsUpNoOtherBackend(t *testing.T) {
	b := newBackendSet(io.Discard, readConfig(os.Getenv))
	defer b.Close()
	release := make(chan struct{})
	var ran atomic.Int32
	b.beforeOpen = map[string]func(context.Context) error{"docker": func(ctx context.Context) error {
		select {
		case <-release:
			ran.Add(1)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	hung := make(chan error, 1)
	go func() {
		_, err := b.get(context.Background(), "docker")
		hung <- err
	}()
	time.Sleep(50 * time.Millisecond) // the docker open is under way
	opened := make(chan error, 1)
	go func() {
		_, err := b.get(context.Background(), "wasm")
		opened <- err
	}()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatalf("wasm: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the wasm backend waited for the docker one to open")
	}
	// A second docker caller that gives up returns with its context's error.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := b.get(ctx, "docker"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a docker caller whose context ended: %v", err)
	}
	select {
	case err := <-hung:
		t.Fatalf("the docker open ended before its clean-up was released: %v", err)
	default:
	}
	close(release)
	<-hung // opens (or fails: no engine needed for this test)
	if ran.Load() != 1 {
		t.Errorf("the clean-up before docker opened ran %d times", ran.Load())
	}
}

// What must run before a backend opens is not skipped because the first
// caller gave up while it ran: the next caller runs it again.
func TestACancelledCallerLeavesTheBeforeOpenStepToTheNext(t *testing.T) {
	b := newBackendSet(io.Discard, readConfig(os.Getenv))
	defer b.Close()
	var calls atomic.Int32
	b.beforeOpen = map[string]func(context.Context) error{"wasm": func(ctx context.Context) error {
		if calls.Add(1) == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.get(ctx, "wasm"); err == nil {
		t.Fatal("the first caller's open succeeded although its clean-up did not finish")
	}
	if _, err := b.get(context.Background(), "wasm"); err != nil {
		t.Fatalf("the second caller: %v", err)
	}
	if calls.Load() != 2 {
		t.Errorf("the step before opening ran %d times; want 2", calls.Load())
	}
}
