package wasm

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

func oneInstanceBackend(t *testing.T) *Backend {
	t.Helper()
	b, err := New(context.Background(), Options{MaxInstances: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.Warm(context.Background(), "python"); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestWaitingForAnInstanceSlotDoesNotCountAgainstTheTimeout(t *testing.T) {
	b := oneInstanceBackend(t)
	ctx := context.Background()
	holder, _ := b.Create(ctx, sandbox.Spec{})
	waiter, _ := b.Create(ctx, sandbox.Spec{})
	defer holder.Close()
	defer waiter.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, err := holder.Exec(ctx, sandbox.ExecRequest{Shell: "python -c 'import time\ntime.sleep(1.5)\nprint(\"held\")'", Timeout: 20 * time.Second})
		if err != nil || string(res.Stdout) != "held\n" {
			t.Errorf("holder: %q %v", res.Stdout, err)
		}
	}()
	time.Sleep(300 * time.Millisecond) // the holder has the only slot
	res, err := waiter.Exec(ctx, sandbox.ExecRequest{Shell: "python -c 'print(42)'", Timeout: 800 * time.Millisecond})
	wg.Wait()
	if err != nil || res.TimedOut || string(res.Stdout) != "42\n" {
		t.Fatalf("an exec that waited ~1.2 s for another episode's instance slot: timed out %v stdout %q err %v; the wait is the runtime's, not the command's", res.TimedOut, res.Stdout, err)
	}
}

func TestAPipelineThatHoldsTheSlotItWaitsForStillTimesOut(t *testing.T) {
	b := oneInstanceBackend(t)
	sb, _ := b.Create(context.Background(), sandbox.Spec{})
	defer sb.Close()
	start := time.Now()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{
		Shell:   `python -c 'print("x" * 5000000)' | python -c 'import sys; print(len(sys.stdin.read()))'`,
		Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Fatalf("took %v", el)
	}
	// Either the pipeline fit (the first stage finished and freed the slot)
	// or it was stopped by its timeout; it must not hang.
	if !res.TimedOut && string(res.Stdout) != "5000001\n" {
		t.Errorf("stdout %q stderr %q exit %d", res.Stdout, res.Stderr, res.ExitCode)
	}
	t.Logf("timed out %v after %v", res.TimedOut, res.Duration)
}
