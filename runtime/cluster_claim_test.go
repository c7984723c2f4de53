package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/internal/natstest"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// TestAGroupItemWhoseMemberMustWaitClaimsNone: a coordinator answers
// "wait" to the claim of one member of a prefix group (as it does for an
// episode it does not hold yet, or one ending now) while it would run the
// others. The worker (RunWorker, in this process, on a real NATS
// JetStream server) leaves the item for later with none of the members
// claimed: when it runs the group on the item's next delivery, no attempt
// was lost, none is kept as an infrastructure attempt, and every member
// runs as its first attempt.
func TestAGroupItemWhoseMemberMustWaitClaimsNone(t *testing.T) {
	ns := natstest.Start(t)
	pol, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(2)})
	if err != nil {
		t.Fatal(err)
	}
	defer pol.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	const group = 3
	var waited atomic.Int32
	co := &runtime.ClusterOptions{URL: ns.ClientURL(), Heartbeat: 200 * time.Millisecond}
	runtime.ClaimWaits(co, func(id string) bool { // the last member, once
		return strings.HasSuffix(id, fmt.Sprintf(".%d", group-1)) && waited.Add(1) == 1
	})
	data := t.TempDir()
	_, hsURL := natstest.Coordinator(t, data, co, log)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	be := wasmtest.Backend(t)
	wctx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() {
		workerDone <- runtime.RunWorker(wctx, runtime.WorkerOptions{URL: ns.ClientURL(), ID: "w1", Backend: "wasm", Slots: group,
			DataDir: t.TempDir(), Heartbeat: 200 * time.Millisecond, Logger: log, Registry: prometheus.NewRegistry(),
			Backends: runtime.BackendFunc(func(context.Context, string) (sandbox.Backend, error) { return be, nil })})
	}()
	defer func() {
		stopWorker()
		<-workerDone
	}()

	task := map[string]any{"id": "pre", "prompt": "Answer.", "sandbox": map[string]any{"backend": "wasm"}, "tools": []string{"bash", "finish"},
		"reward": map[string]any{"type": "exact", "answer": "done"},
		"prefix": map[string]any{"turns": []any{map[string]any{"tool_calls": []any{
			map[string]any{"name": "bash", "arguments": map[string]any{"command": "echo prefix >> /work/n"}}}}}}}
	id := postRollout(t, hsURL, map[string]any{"tasks": []any{task}, "group_size": group,
		"policy": map[string]any{"base_url": pol.URL(), "model": "fake-model"}})
	var st struct {
		State        string         `json:"state"`
		EpisodesDone int            `json:"episodes_done"`
		InfraRetries int            `json:"infra_retries"`
		Ends         map[string]int `json:"ends"`
	}
	for st.State != "done" {
		if ctx.Err() != nil {
			t.Fatalf("rollout %s did not end: %+v", id, st)
		}
		time.Sleep(50 * time.Millisecond)
		r, err := http.Get(hsURL + "/v1/rollouts/" + id)
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(r.Body).Decode(&st)
		r.Body.Close()
	}
	if waited.Load() < 1 {
		t.Fatal("no member's claim was answered wait: the test did not test anything")
	}
	kept, _ := filepath.Glob(filepath.Join(data, "attempts", "*"))
	if st.InfraRetries != 0 || len(kept) != 0 || st.Ends["finished"] != group {
		t.Errorf("rollout: %+v, attempts kept %v; want %d finished, no infra retry, no attempt kept (no member ran before the item was left)",
			st, kept, group)
	}
}

// postRollout submits a rollout request to the service at url and returns
// its id, failing the test unless it was created.
func postRollout(t *testing.T, url string, req map[string]any) string {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := http.Post(url+"/v1/rollouts", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		ID string `json:"id"`
	}
	json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 || created.ID == "" {
		t.Fatalf("POST /v1/rollouts: %s", resp.Status)
	}
	return created.ID
}
