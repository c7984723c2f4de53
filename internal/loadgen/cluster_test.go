package loadgen_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollbox/rollbox/internal/loadgen"
	"github.com/rollbox/rollbox/internal/natstest"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
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
	srv, err := runtime.Open(runtime.Options{DataDir: t.TempDir(), Registry: prometheus.NewRegistry(),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Cluster: &runtime.ClusterOptions{URL: ns.ClientURL(), Heartbeat: heartbeat},
		Backends: runtime.BackendFunc(func(_ context.Context, name string) (sandbox.Backend, error) {
			return nil, fmt.Errorf("a coordinator opens no backend (%s): %w", name, sandbox.ErrEngineUnavailable)
		})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := srv.Recovered(ctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer scancel()
		srv.Shutdown(sctx)
	})

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
		listed = countWorkers(t, hs.URL)
	}

	res, err := loadgen.Rollout(ctx, hs.URL, loadgen.RolloutConfig{Backend: "wasm", Episodes: episodes, Group: 10, Turns: turns,
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
