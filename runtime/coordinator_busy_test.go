package runtime_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/natstest"
	"github.com/rollbox/rollbox/runtime"
)

// TestACoordinatorIsNotBusyWithItsWorkersEpisodes: a coordinator's episodes
// run on its workers, so a rollout it holds does not make it Busy (which
// has its listener look for connections every 2 ms, internal/promptnet):
// here two episodes wait for a worker, none having joined.
func TestACoordinatorIsNotBusyWithItsWorkersEpisodes(t *testing.T) {
	ns := natstest.Start(t)
	co := &runtime.ClusterOptions{URL: ns.ClientURL(), Heartbeat: 200 * time.Millisecond}
	srv, hsURL := natstest.Coordinator(t, t.TempDir(), co, slog.New(slog.NewTextHandler(io.Discard, nil)))
	task := map[string]any{"id": "t", "prompt": "Answer.", "sandbox": map[string]any{"backend": "wasm"}, "tools": []string{"finish"},
		"reward": map[string]any{"type": "exact", "answer": "a"}}
	id := postRollout(t, hsURL, map[string]any{"tasks": []any{task}, "group_size": 2,
		"policy": map[string]any{"base_url": "http://127.0.0.1:9/v1", "model": "fake-model"}})
	var st runtime.RolloutStatus
	r, err := http.Get(hsURL + "/v1/rollouts/" + id)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(r.Body).Decode(&st)
	r.Body.Close()
	if st.EpisodesQueued+st.EpisodesRunning != 2 {
		t.Fatalf("rollout %s: queued %d running %d, want its 2 episodes in hand", id, st.EpisodesQueued, st.EpisodesRunning)
	}
	if srv.Busy() {
		t.Error("the coordinator is Busy with episodes its workers are to run")
	}
}
