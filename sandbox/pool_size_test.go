package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

func TestPoolSizedFromDemandGrowsAndShrinks(t *testing.T) {
	ctx := context.Background()
	be, err := wasm.New(ctx, wasm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	p := sandbox.NewPool(be, 0)
	defer p.Close()
	spec := sandbox.Spec{Limits: sandbox.Limits{MemoryMB: 64}}
	sb, err := p.Get(ctx, spec) // a miss: the pool keeps nothing yet, but learns the spec
	if err != nil {
		t.Fatal(err)
	}
	sb.Close()
	ready := func() int { return p.Stats().Ready[spec.Key()] }
	waitFor := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for ready() != want {
			if time.Now().After(deadline) {
				t.Fatalf("pool has %d ready, want %d", ready(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	p.SetSize(4)
	if p.Size() != 4 {
		t.Fatalf("Size() = %d after SetSize(4)", p.Size())
	}
	waitFor(4)
	p.SetSize(1)
	waitFor(1)
	p.SetSize(0)
	waitFor(0)
	if live := be.Live(); len(live) != 0 {
		t.Errorf("the surplus was not closed: %v live", live)
	}
}
