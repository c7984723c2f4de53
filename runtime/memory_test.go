package runtime_test

import (
	"io"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// An idle service drops its ended rollouts from memory (what thousands of
// episodes' states hold would pin the heap's spans for KeepEnded) and every
// one of them still reads back whole from the store.
func TestIdleReclaimForgetsEndedRolloutsAndLosesNothing(t *testing.T) {
	s := startService(t, "")
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	id := s.submit(rolloutBody(p, 2, task("a"), task("b")))
	before := s.waitState(id, 2*time.Minute, func(st status) bool { return st.State == "done" })
	beforeEps := s.episodes(id, "")

	held := s.srv.RolloutHeld(id)
	s.srv.Reclaim()
	if n := s.srv.RolloutsInMemory(); n != 0 {
		t.Errorf("after an idle reclaim %d rollout(s) are still in memory, want the ended one forgotten", n)
	}
	// A goroutine that served it (a response still being written, a
	// timer firing) may hold it a moment longer: it must let go soon.
	for deadline := time.Now().Add(5 * time.Second); held(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("5 s after an idle reclaim the ended rollout is still reachable (its memory is not given back)")
			break
		}
	}
	after := s.status(id)
	if after.State != before.State || after.EpisodesDone != before.EpisodesDone || after.EpisodesTotal != 4 ||
		after.Ends["finished"] != before.Ends["finished"] || *after.RewardMean != *before.RewardMean {
		t.Errorf("the rollout read back from the store is %+v, before the reclaim %+v", after, before)
	}
	afterEps := s.episodes(id, "")
	if len(afterEps) != len(beforeEps) || len(afterEps) != 4 {
		t.Fatalf("%d episodes read back after the reclaim, %d before, want 4", len(afterEps), len(beforeEps))
	}
	for i, e := range afterEps {
		if e.EpisodeID != beforeEps[i].EpisodeID || e.Group == nil || beforeEps[i].Group == nil || e.Group.Advantage != beforeEps[i].Group.Advantage {
			t.Errorf("episode %d read back after the reclaim differs from before: %s vs %s", i, e.EpisodeID, beforeEps[i].EpisodeID)
		}
	}
}

// A cancelled rollout is not over until its queued episodes' ends are
// recorded (in the background, in bulk: thousands of records take seconds
// on a loaded machine, and -race made it tens). The service is idle
// meanwhile (nothing queued or running), and an idle reclaim forgot the
// rollout then: the next read loaded it from an index that had not yet
// taken those ends, and kept answering that stale copy (EpisodesDone 8 of
// 4,096 a minute later) while the ends went to the forgotten one.
func TestAnIdleReclaimDuringABulkCancelKeepsTheRolloutCurrent(t *testing.T) {
	p, _ := blockingPolicy(t)
	s := startService(t, "", func(o *runtime.Options) { o.Limits.MaxRunning = 4 })
	id := s.submit(rolloutBody(p, 1024, task("big")))
	s.waitRunning(4, 30*time.Second)
	if code, _ := s.do("DELETE", "/v1/rollouts/"+id, nil, nil); code != 200 {
		t.Fatalf("DELETE: %d", code)
	}
	s.srv.Reclaim() // idle: nothing queued or running, the ends still being written
	st := s.waitState(id, 30*time.Second, func(st status) bool { return st.EpisodesDone == 1024 })
	if st.Ends["cancelled"] != 1024 || st.State != runtime.RolloutCancelled {
		t.Errorf("after the DELETE and a reclaim: %+v", st)
	}
}

// With a recycle policy, the service asks to be executed again (RecycleDue)
// only once it has worked, is idle, answers no request and holds more
// anonymous memory than it started with: not fresh, not while an import is
// still being sent; soon once it ends.
func TestAServiceAsksToBeRecycledOnlyWhenItHasWorkedAndHasNothingInHand(t *testing.T) {
	s := startService(t, "", func(o *runtime.Options) {
		// Any memory is over the bound (this process runs other tests'
		// services too): what is tested here is when it asks.
		o.Recycle = &runtime.RecyclePolicy{Bytes: -1 << 40, After: 200 * time.Millisecond}
	})
	notAsked := func(what string, d time.Duration) {
		t.Helper()
		select {
		case <-s.srv.RecycleDue():
			t.Fatalf("%s, the service asked to be recycled", what)
		case <-time.After(d):
		}
	}
	notAsked("fresh, having done nothing", 1500*time.Millisecond)

	pr, pw := io.Pipe()
	imported := make(chan int, 1)
	go func() {
		code, _, _ := s.importNDJSON("", pr)
		imported <- code
	}()
	pw.Write([]byte(ndjson(chatEpisode("held-open", "q", "v1", false))))
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	id := s.submit(rolloutBody(p, 2, task("a")))
	s.waitState(id, 2*time.Minute, func(st status) bool { return st.State == "done" })
	if s.srv.Quiescent() {
		t.Error("quiescent while an import is being sent")
	}
	notAsked("idle after a rollout with an import still being sent", 1500*time.Millisecond)
	pw.Close()
	if code := <-imported; code != 200 {
		t.Fatalf("the import: %d", code)
	}
	select {
	case <-s.srv.RecycleDue():
	case <-time.After(10 * time.Second):
		now, atStart := s.srv.AnonymousMemory()
		t.Fatalf("idle with nothing in hand for 10 s (anonymous memory %d B, %d B at start), the service did not ask to be recycled", now, atStart)
	}
	if !s.srv.Quiescent() {
		t.Error("asked to be recycled, but not quiescent")
	}
}

func TestARecyclePolicyBoundsTheMemoryAboveTheStart(t *testing.T) {
	for _, tt := range []struct {
		p          runtime.RecyclePolicy
		anon, from int64
		want       bool
	}{
		{runtime.RecyclePolicy{Fraction: 0.2}, 120, 100, false},
		{runtime.RecyclePolicy{Fraction: 0.2}, 121, 100, true},
		{runtime.RecyclePolicy{Bytes: 64 << 20}, 100 + 64<<20, 100, false},
		{runtime.RecyclePolicy{Bytes: 64 << 20}, 101 + 64<<20, 100, true},
	} {
		if got := tt.p.Over(tt.anon, tt.from); got != tt.want {
			t.Errorf("%+v: %d over %d: %v, want %v", tt.p, tt.anon, tt.from, got, tt.want)
		}
	}
}
