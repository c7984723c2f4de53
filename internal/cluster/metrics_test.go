package cluster_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/internal/cluster"
	"github.com/rollbox/rollbox/runtime"
)

// scrape reads a /metrics page: its text, and its samples by name with
// labels as the text format writes them (name{a="b",c="d"}).
func scrape(t *testing.T, url string) (string, map[string]float64) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("GET %s: not a sample: %q", url, line)
		}
		out[line[:i]] = v
	}
	return string(b), out
}

// TestAWorkerServesItsMetrics: `rollbox worker --metrics-addr` serves
// Prometheus text that promtool's linter passes, with the worker's slots,
// what it runs, the episodes that ended on it by termination, its
// infrastructure failures, the rollouts' clients it holds and its NATS
// reconnections (after NATS restarts).
func TestAWorkerServesItsMetrics(t *testing.T) {
	t.Parallel() // its own NATS server, data directories and worker processes: it mostly waits on them
	tasks, ix := searchSetup(t)
	in := ix.Info()
	pol := scripted(0)
	defer pol.Close()
	ns := startNATS(t, "", 0)
	coord := startService(t, "", ns.url, func(o *runtime.Options) {
		o.Catalog = tasks
		o.SearchIndex = func(*agent.Task) (string, error) { // not the workers' index: an infrastructure failure there
			return cluster.IndexIdentity(strings.Repeat("0", 64), in.Units, in.ChunkTokens, in.Scoring), nil
		}
	})
	port := freePort(t)
	startWorker(t, ns.url, "wm", "wasm", 3, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port))
	coord.waitWorkers(1)
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)

	id := coord.submit(rolloutRequest(pol.URL(), exactTasks(2), 2, nil)) // 2 finished (reward 1), 2 finished (reward 0)
	coord.episodes(id, time.Minute)
	other := coord.submit(map[string]any{"tasks": []any{map[string]any{"id": "elsewhere"}}, "group_size": 1,
		"policy": map[string]any{"base_url": pol.URL(), "model": "fake-model"}})
	coord.episodes(other, time.Minute) // 3 attempts, each an infrastructure failure here

	// A worker acks an item once the coordinator has stored its episode:
	// the stream can end a moment before the worker is idle.
	text, m := scrape(t, url)
	for deadline := time.Now().Add(10 * time.Second); m[`rollbox_worker_running`] != 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		text, m = scrape(t, url)
	}
	problems, err := promlint.New(strings.NewReader(text)).Lint() // promtool check metrics
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	for sample, want := range map[string]float64{
		`rollbox_worker_slots`:                                       3,
		`rollbox_worker_running`:                                     0,
		`rollbox_worker_episodes_total{reason="finished"}`:           4,
		`rollbox_worker_infra_failures_total`:                        3,
		`rollbox_worker_rollout_clients`:                             2, // held for a minute after their last episode
		`rollbox_worker_nats_reconnects_total{connection="work"}`:    0,
		`rollbox_worker_nats_reconnects_total{connection="control"}`: 0,
	} {
		if got, ok := m[sample]; !ok || got != want {
			t.Errorf("%s = %v (present: %v), want %v", sample, got, ok, want)
		}
	}
	if m[`rollbox_tool_calls_total{backend="wasm",tool="bash"}`] != 4 || m[`rollbox_turns_total`] != 8 {
		t.Errorf("the worker's metrics lack its tools' series:\n%s", text)
	}

	// NATS restarts: both connections reconnect, and say so.
	ns.restart(t, 300*time.Millisecond)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, m = scrape(t, url)
		if m[`rollbox_worker_nats_reconnects_total{connection="work"}`] == 1 && m[`rollbox_worker_nats_reconnects_total{connection="control"}`] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reconnections after a NATS restart: work %v, control %v, want 1 each", m[`rollbox_worker_nats_reconnects_total{connection="work"}`],
				m[`rollbox_worker_nats_reconnects_total{connection="control"}`])
		}
		time.Sleep(100 * time.Millisecond)
	}
}
