package cluster_test

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestAStalledJournalLosesNoLiveWorker: the coordinator's journal handling
// stalls for ten heartbeat windows (its serial consumer blocks opening the
// file of a group's prefix record, which it keeps as it comes: a FIFO
// nobody reads yet) while two workers run the rollout's episodes; the workers' heartbeats, on a connection of their
// own and handled apart from the journal, keep both listed and none is
// taken for lost; once the journal moves again every episode ends as on
// one host, none interrupted.
func TestAStalledJournalLosesNoLiveWorker(t *testing.T) {
	pol := prefixScript(100*time.Millisecond, nil)
	defer pol.Close()
	tasks, group := prefixTasks(4), 2
	single := startService(t, "", "")
	want := outcomes(t, single.episodes(single.submit(rolloutRequest(pol.URL(), tasks, group, nil)), 2*time.Minute))

	t.Logf("%s: one host done", time.Now().Format(time.StampMilli))
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url) // heartbeats every 200 ms: a worker unheard for 600 ms is suspect
	// Submitted before any worker is there, so nothing is dispatched yet
	// and the file each prefix's record is first written to (the temporary
	// file of trajectory.WriteDocument) is a FIFO when the record comes.
	id := coord.submit(rolloutRequest(pol.URL(), tasks, group, nil))
	var fifos []string
	if err := os.MkdirAll(filepath.Join(coord.data, "prefixes"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(tasks); i += 2 {
		fifo := filepath.Join(coord.data, "prefixes", fmt.Sprintf("%s.t%d.prefix.json.tmp", id, i))
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
		fifos = append(fifos, fifo)
	}
	startWorker(t, ns.url, "w1", "wasm", 4)
	startWorker(t, ns.url, "w2", "wasm", 4)
	coord.waitWorkers(2)

	// The journal stalls once the coordinator (this process) opens the
	// FIFO of the first prefix record that comes: no journal message is
	// handled after it.
	deadline := time.Now().Add(time.Minute)
	for !opened() {
		if time.Now().After(deadline) {
			t.Fatal("the coordinator did not open a prefix record's file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%s: stalled", time.Now().Format(time.StampMilli))
	stalledAt := coord.metric("rollbox_cluster_journal_messages_total")
	stall := 10 * 3 * 200 * time.Millisecond
	for end := time.Now().Add(stall); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if ws := coord.workers(); len(ws) != 2 {
			t.Fatalf("%d workers listed while the journal stalls, want 2: %+v", len(ws), ws)
		}
		if lost := coord.metric(`rollbox_cluster_lost_attempts_total{outcome="interrupted"}`) +
			coord.metric(`rollbox_cluster_lost_attempts_total{outcome="retried"}`); lost != 0 {
			t.Fatalf("%v attempts taken for lost while the journal stalls", lost)
		}
	}
	if n := coord.metric("rollbox_cluster_journal_messages_total"); n != stalledAt {
		t.Fatalf("the journal did not stall: %v messages handled, then %v", stalledAt, n)
	}

	// The journal moves again: each FIFO is read to its end (the prefix's
	// record it took is not kept: a FIFO takes no fsync).
	for _, fifo := range fifos {
		go func() {
			f, err := os.Open(fifo)
			if err == nil {
				io.Copy(io.Discard, f)
				f.Close()
			}
		}()
	}
	t.Logf("%s: released", time.Now().Format(time.StampMilli))
	got := coord.episodes(id, 2*time.Minute)
	t.Logf("%s: ended", time.Now().Format(time.StampMilli))
	compareOutcomes(t, outcomes(t, got), want)
	for _, tr := range got {
		if tr.Termination.Interrupted {
			t.Errorf("episode %s was interrupted", tr.EpisodeID)
		}
	}
	if lost := coord.metric(`rollbox_cluster_lost_attempts_total{outcome="interrupted"}`) +
		coord.metric(`rollbox_cluster_lost_attempts_total{outcome="retried"}`); lost != 0 {
		t.Errorf("%v attempts taken for lost", lost)
	}
	if ws := coord.workers(); len(ws) != 2 {
		t.Errorf("%d workers listed after the stall, want 2", len(ws))
	}
}

// opened says whether this process is opening a FIFO for its other end
// (the coordinator's consumer blocked on the journal): a thread of it
// sleeps in the kernel's wait_for_partner.
func opened() bool {
	wchans, _ := filepath.Glob("/proc/self/task/*/wchan")
	for _, path := range wchans {
		if b, err := os.ReadFile(path); err == nil && string(b) == "wait_for_partner" {
			return true
		}
	}
	return false
}
