package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

// emptyPool is a pool of size 0 over a WASM backend of the test's own.
func emptyPool(t *testing.T) (*wasm.Backend, *sandbox.Pool) {
	be, err := wasm.New(context.Background(), wasm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := sandbox.NewPool(be, 0)
	t.Cleanup(func() {
		p.Close()
		be.Close()
	})
	return be, p
}

func TestPoolSizedFromDemandGrowsAndShrinks(t *testing.T) {
	ctx := context.Background()
	be, p := emptyPool(t)
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

func TestOnePoolKeepsEachSpecsOwnDemandAndDropsLabels(t *testing.T) {
	ctx := context.Background()
	_, p := emptyPool(t)
	small := sandbox.Spec{Limits: sandbox.Limits{MemoryMB: 64}}
	large := sandbox.Spec{Limits: sandbox.Limits{MemoryMB: 128}}
	waitFor := func(spec sandbox.Spec, want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for p.Stats().Ready[spec.Key()] != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d ready of %+v, want %d", p.Stats().Ready[spec.Key()], spec.Limits, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := p.SetDemand(small, 3); err != nil {
		t.Fatal(err)
	}
	if err := p.SetDemand(large, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(small, 3)
	waitFor(large, 1)
	if st := p.Stats(); st.Target[small.Key()] != 3 || st.Target[large.Key()] != 1 {
		t.Errorf("targets %v", st.Target)
	}
	// An episode's spec carries its labels; a ready sandbox of the same spec
	// serves it, and a sandbox the pool makes carries none.
	labelled := small
	labelled.Labels = sandbox.EpisodeLabels("ep-1", "r-1")
	sb, err := p.Get(ctx, labelled)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if st := p.Stats(); st.Hits != 1 {
		t.Errorf("a labelled spec missed the ready sandboxes of its spec: %+v", st)
	}
	waitFor(small, 3) // refilled
	p.SetDemand(small, 0)
	waitFor(small, 0)
	waitFor(large, 1)
}
