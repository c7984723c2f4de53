package loadgen_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/loadgen"
	"github.com/rollbox/rollbox/internal/natstest"
	"github.com/rollbox/rollbox/runtime"
)

// The fake fleet must keep speaking the protocol the coordinator speaks:
// against a real coordinator (runtime.Server with Cluster) and a real NATS
// JetStream server, both in this process, it takes a rollout's every
// episode, journals it and has it stored exactly once, with no error, and
// the coordinator lists its workers. When the protocol changes and the
// fleet does not, the sizing benchmark would measure nothing: this fails
// first.
func TestFakeWorkersHaveEveryEpisodeOfARolloutStoredOnce(t *testing.T) {
	ns := natstest.Start(t)

	heartbeat := 200 * time.Millisecond
	_, hsURL := natstest.Coordinator(t, t.TempDir(), &runtime.ClusterOptions{URL: ns.ClientURL(), Heartbeat: heartbeat},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const workers, slots, episodes, turns = 3, 4, 40, 3
	fleet, err := loadgen.StartFakeWorkers(ctx, loadgen.FakeWorkersConfig{URL: ns.ClientURL(), Workers: workers, Slots: slots,
		Turns: turns, OutputBytes: 64, Heartbeat: heartbeat, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Stop()
	for listed := 0; listed < workers; time.Sleep(50 * time.Millisecond) {
		if ctx.Err() != nil {
			t.Fatalf("the coordinator lists %d workers, not %d", listed, workers)
		}
		listed = countWorkers(t, hsURL)
	}

	res, err := loadgen.Rollout(ctx, hsURL, loadgen.RolloutConfig{Backend: "wasm", Episodes: episodes, Group: 10, Turns: turns,
		PolicyURL: "http://127.0.0.1:9/v1"})
	if err != nil {
		t.Fatalf("%v (fleet: %d stored, %d errors, last %v)", err, fleet.Completed.Load(), fleet.Errors.Load(), fleet.Err())
	}
	if res.Completed != episodes || res.Ends["finished"] != episodes {
		t.Errorf("the stream gave %d episodes ending %v, want %d finished", res.Completed, res.Ends, episodes)
	}
	// The coordinator answers stored after the episode is indexed (and
	// streamed): the last answers may reach the fleet after the stream.
	for deadline := time.Now().Add(10 * time.Second); fleet.Completed.Load() < episodes && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := fleet.Completed.Load(); got != episodes {
		t.Errorf("the fleet was told %d episodes were stored, want %d", got, episodes)
	}
	if n := fleet.Errors.Load(); n != 0 {
		t.Errorf("the fleet met %d errors, the last: %v", n, fleet.Err())
	}
	if got, want := fleet.Lines.Load(), int64(episodes*(2*turns+3)); got != want {
		t.Errorf("the fleet published %d journal lines, want %d (a header, the sandbox, %d steps and the end an episode)", got, want, 2*turns)
	}
	claim, stored := fleet.Latencies()
	if claim.N != episodes || stored.N != episodes {
		t.Errorf("latencies of %d claims and %d stores, want %d of each", claim.N, stored.N, episodes)
	}
}

func countWorkers(t *testing.T, base string) int {
	resp, err := http.Get(base + "/v1/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Workers []json.RawMessage `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	return len(list.Workers)
}
