package agent_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// countingFactory makes real WASM sandboxes and counts those still open.
type countingFactory struct {
	make agent.SandboxFactory
	mu   sync.Mutex
	open map[*closeCounter]bool
	made int
}

type closeCounter struct {
	sandbox.Sandbox
	f *countingFactory
}

func (c *closeCounter) Close() error {
	c.f.mu.Lock()
	delete(c.f.open, c)
	c.f.mu.Unlock()
	return c.Sandbox.Close()
}

func (f *countingFactory) create(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := f.make(ctx, backend, spec)
	if err != nil {
		return nil, err
	}
	c := &closeCounter{Sandbox: sb, f: f}
	f.mu.Lock()
	f.open[c] = true
	f.made++
	f.mu.Unlock()
	return c, nil
}

func (f *countingFactory) stillOpen() (open, made int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.open), f.made
}

// brokenJournal makes the episode's journal a FIFO read by a reader that
// goes away when cut is called, so every later write of the record fails
// (EPIPE): a real write failure of the trajectory at a chosen point.
func brokenJournal(t *testing.T, dir, episodeID string) (cut func()) {
	t.Helper()
	path := filepath.Join(dir, episodeID+trajectory.PartialSuffix)
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	opened := make(chan *os.File, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.Open(path) // waits for the writer
		if err != nil {
			t.Error(err)
			opened <- nil
			return
		}
		opened <- f
		io.Copy(io.Discard, f) // until cut closes it
	}()
	var once sync.Once
	cut = func() {
		once.Do(func() {
			if f := <-opened; f != nil {
				f.Close()
			}
			<-done
		})
	}
	t.Cleanup(cut)
	return cut
}

func TestAnEpisodeWhoseRecordFailsWhileOpeningLeavesNoSandboxOpen(t *testing.T) {
	dir := t.TempDir()
	cut := brokenJournal(t, dir, "ep")
	inner := wasmFactory(t)
	// The header is written; the journal breaks while the sandbox is made.
	f := &countingFactory{open: map[*closeCounter]bool{}, make: func(ctx context.Context, be string, spec sandbox.Spec) (sandbox.Sandbox, error) {
		cut()
		return inner(ctx, be, spec)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := agent.Open(ctx, agent.Config{Task: loadTask(t, calcTask), EpisodeID: "ep", Dir: dir, Backend: "wasm",
		NewSandbox: f.create, PolicyInfo: trajectory.Policy{Kind: "test"}})
	var re *agent.RecordError
	if !errors.As(err, &re) {
		t.Fatalf("Open: %v (%T), want a *agent.RecordError", err, err)
	}
	if open, made := f.stillOpen(); made != 1 || open != 0 {
		t.Fatalf("%d sandbox(es) made, %d left open by a failed Open", made, open)
	}
	if s != nil {
		if tr := s.Trajectory(); tr.Termination == nil || tr.Termination.Reason != trajectory.EndRecordError {
			t.Errorf("termination %+v, want record_error", tr.Termination)
		}
	}
}

func TestAStepThatCannotBeRecordedEndsTheEpisodeRecordError(t *testing.T) {
	dir := t.TempDir()
	cut := brokenJournal(t, dir, "ep")
	f := &countingFactory{make: wasmFactory(t), open: map[*closeCounter]bool{}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, err := agent.Run(ctx, agent.Config{Task: loadTask(t, calcTask), EpisodeID: "ep", Dir: dir, Backend: "wasm",
		NewSandbox: f.create, PolicyInfo: trajectory.Policy{Kind: "test"},
		Policy: cutting{cut, &turnsPolicy{turns: []agent.Turn{calls("bash", `{"command": "ls"}`), calls("finish", `{"answer": "x"}`)}}}})
	var re *agent.RecordError
	if !errors.As(err, &re) || !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Run: %v, want a *agent.RecordError wrapping the write's EPIPE", err)
	}
	if tr == nil || tr.Termination == nil || tr.Termination.Reason != trajectory.EndRecordError || tr.Reward != nil {
		t.Fatalf("trajectory %+v, want an unscored record_error end", tr)
	}
	if trajectory.Scored(trajectory.EndRecordError) {
		t.Error("record_error must be unscored")
	}
	if open, made := f.stillOpen(); made != 1 || open != 0 {
		t.Fatalf("%d sandbox(es) made, %d left open", made, open)
	}
}

// cutting breaks the journal when the policy is first asked: the open is
// recorded, the first step is not.
type cutting struct {
	cut func()
	agent.Policy
}

func (c cutting) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	c.cut()
	return c.Policy.Next(ctx, req)
}
