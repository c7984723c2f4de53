package sandbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

func TestPoolHandsOutReadySandboxesAndRefills(t *testing.T) {
	ctx := context.Background()
	be, err := wasm.New(ctx, wasm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	p := sandbox.NewPool(be, 3)
	spec := sandbox.Spec{Limits: sandbox.Limits{MemoryMB: 64}}
	if err := p.Warm(spec); err != nil {
		t.Fatal(err)
	}
	waitReady := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for p.Stats().Ready[spec.Key()] < n {
			if time.Now().After(deadline) {
				t.Fatalf("pool has %d ready, want %d", p.Stats().Ready[spec.Key()], n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitReady(3)
	var got []sandbox.Sandbox
	for range 3 {
		sb, err := p.Get(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, sb)
	}
	if st := p.Stats(); st.Hits != 3 || st.Misses != 0 {
		t.Errorf("stats %+v, want 3 hits", st)
	}
	ids := map[string]bool{}
	for _, sb := range got {
		ids[sb.Info().ID] = true
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "echo ok"})
		if err != nil || string(res.Stdout) != "ok\n" {
			t.Errorf("a pooled sandbox does not work: %q %v", res.Stdout, err)
		}
		sb.Close()
	}
	if len(ids) != 3 {
		t.Errorf("the pool handed out the same sandbox twice: %v", ids)
	}
	waitReady(3) // refilled in the background

	// A different spec is a different queue.
	other := sandbox.Spec{Limits: sandbox.Limits{MemoryMB: 128}}
	sb, err := p.Get(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	sb.Close()
	if st := p.Stats(); st.Misses != 1 {
		t.Errorf("stats %+v, want a miss for a new spec", st)
	}

	// Concurrent Gets and Close.
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := p.Get(ctx, spec)
			if err == nil {
				sb.Close()
			} else if !errors.Is(err, sandbox.ErrClosed) {
				t.Errorf("Get: %v", err)
			}
		}()
	}
	p.Close()
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := p.Get(ctx, spec); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
	if live := be.Live(); len(live) != 0 {
		t.Errorf("sandboxes left alive after the pool closed: %v", live)
	}
}

func TestPoolRefusesAnInvalidSpec(t *testing.T) {
	p := sandbox.NewPool(nil, 1)
	defer p.Close()
	var fe *sandbox.FieldError
	if _, err := p.Get(context.Background(), sandbox.Spec{Runtime: "kata"}); !errors.As(err, &fe) || fe.Field != "runtime" {
		t.Fatalf("err = %v", err)
	}
}
