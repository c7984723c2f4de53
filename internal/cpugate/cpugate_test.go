package cpugate

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A holder waiting for a turn whose context ends leaves at once, without
// a turn, and the turns stay as many as before.
func TestACancelledHolderLeavesTheGateAtOnce(t *testing.T) {
	g := New(1)
	busy := g.Hold()
	busy.Enter(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	h := g.Hold()
	got := make(chan bool)
	go func() { got <- h.Enter(ctx) }()
	time.Sleep(20 * time.Millisecond)
	t0 := time.Now()
	cancel()
	select {
	case ok := <-got:
		if ok || h.Held() {
			t.Fatalf("Enter after its context ended: %v, held %v; want false, not held", ok, h.Held())
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("left %v after the cancellation", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled holder still waits for a turn after 10 s")
	}
	if s := g.Stats(); s.Waiting != 0 {
		t.Errorf("%d waiting after the cancellation, want 0", s.Waiting)
	}
	busy.Leave()
	other := g.Hold()
	if !other.Enter(context.Background()) || !other.Held() {
		t.Fatal("the turn given back is not there for the next holder")
	}
}

// Outside gives the turn back for the wait's length and takes one again
// after: a holder in a long wait (a tool, the policy) holds nothing.
func TestOutsideGivesTheTurnBackForTheWait(t *testing.T) {
	g := New(1)
	h := g.Hold()
	h.Enter(context.Background())
	var otherRan atomic.Bool
	h.Outside(context.Background(), func() {
		o := g.Hold()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if o.Enter(ctx) {
			otherRan.Store(true)
			o.Leave()
		}
	})
	if !otherRan.Load() {
		t.Error("another holder got no turn while the first waited Outside")
	}
	if !h.Held() {
		t.Error("the holder has no turn after its wait")
	}
	h.Leave()
	// A nil gate gates nothing.
	var none *Gate
	n := none.Hold()
	if !n.Enter(context.Background()) {
		t.Error("Enter on no gate: false")
	}
	n.Outside(context.Background(), func() {})
	n.Leave()
}

// Turns are given in arrival order: a holder that needs a turn again and
// again (an episode's turns) gets each after the holders already waiting,
// however many more keep coming, never starved.
func TestNoHolderIsStarved(t *testing.T) {
	g := New(2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 64 { // a churn of others, each holding its turn 200 µs at a time
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := g.Hold()
			for ctx.Err() == nil {
				if h.Enter(ctx) {
					spin(200 * time.Microsecond)
					h.Leave()
				}
			}
		}()
	}
	h := g.Hold()
	t0 := time.Now()
	for range 20 {
		h.Enter(context.Background())
		h.Leave()
	}
	d := time.Since(t0)
	cancel()
	wg.Wait()
	// 20 turns, each after at most the 64 others' (13 ms with 2 turns at
	// once): well under a second even on a busy host.
	if d > 5*time.Second {
		t.Errorf("20 turns among 64 busy holders took %v, want them in arrival order (about 20 × 6.4 ms)", d)
	}
	t.Logf("20 turns among 64 busy holders: %v (waited %v)", d, h.Waited())
}

func spin(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}
