package runtime_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// health is the body of GET /healthz as a client reads it.
type health struct {
	Status          string
	Problems        []string
	EpisodesQueued  int `json:"episodes_queued"`
	EpisodesRunning int `json:"episodes_running"`
	Backends        map[string]struct {
		State    string
		Error    string
		Failures int
	}
	Storage struct {
		State        string
		FreeBytes    int64 `json:"free_bytes"`
		ReserveBytes int64 `json:"reserve_bytes"`
	}
}

func (s *service) health() (health, int) {
	s.t.Helper()
	var h health
	code, _ := s.do("GET", "/healthz", nil, &h)
	return h, code
}

func (s *service) waitHealth(within time.Duration, ok func(health, int) bool) health {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		h, code := s.health()
		if ok(h, code) {
			return h
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("healthz still %d %+v after %s", code, h, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// switchedBackends opens the real WASM backend while up is set, and fails
// like an unreachable engine otherwise; every open is counted.
type switchedBackends struct {
	be    sandbox.Backend
	up    atomic.Bool
	opens atomic.Int64
}

func (b *switchedBackends) Backend(ctx context.Context, name string) (sandbox.Backend, error) {
	b.opens.Add(1)
	if !b.up.Load() || name != sandbox.BackendWASM {
		return nil, errors.New("dial unix /var/run/docker.sock: connect: connection refused")
	}
	return b.be, nil
}

func TestABackendThatFailsToOpenIsRetriedAndTheServiceSaysSoMeanwhile(t *testing.T) {
	src := &switchedBackends{be: wasmtest.Backend(t)}
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	s := startService(t, "", func(o *runtime.Options) { o.Backends = src })
	if h, code := s.health(); code != 200 || h.Status != runtime.HealthOK || h.Backends["wasm"].State != runtime.BackendUnused {
		t.Fatalf("before any episode: %d %+v", code, h)
	}

	// Down: the episodes end sandbox_error (infrastructure, unscored) after
	// their retries, and the service says it cannot run anything.
	id := s.submit(rolloutBody(p, 2, task("down")))
	st := s.waitState(id, 30*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	if st.Ends["sandbox_error"] != 2 || st.RewardMean != nil || st.InfraRetries == 0 {
		t.Errorf("while the backend is down: %+v", st)
	}
	h, code := s.health()
	if code != http.StatusServiceUnavailable || h.Status != runtime.HealthUnavailable || h.Backends["wasm"].State != runtime.BackendDown ||
		h.Backends["wasm"].Error == "" || len(h.Problems) == 0 {
		t.Errorf("healthz while the default backend is down: %d %+v", code, h)
	}
	if m := s.metrics(); !containsLine(m, `rollbox_backend_up{backend="wasm"} 0`) || !containsLine(m, `rollbox_health{status="unavailable"} 1`) {
		t.Errorf("metrics do not say the backend is down")
	}

	// Back: a background retry (no episode needed) finds it, and the next
	// rollout runs.
	src.up.Store(true)
	s.waitHealth(30*time.Second, func(h health, code int) bool { return code == 200 && h.Backends["wasm"].State == runtime.BackendUp })
	id = s.submit(rolloutBody(p, 2, task("up")))
	st = s.waitState(id, 30*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	if st.Ends["finished"] != 2 {
		t.Errorf("after the backend came back: %+v", st)
	}
	if h, code := s.health(); code != 200 || h.Status != runtime.HealthOK {
		t.Errorf("healthz after the backend came back: %d %+v", code, h)
	}
}

// slowBackends opens the WASM backend after a pause, failing if the
// context it was given ends first (a build killed midway).
type slowBackends struct {
	be        sandbox.Backend
	pause     time.Duration
	opens     atomic.Int64
	cancelled atomic.Int64
}

func (b *slowBackends) Backend(ctx context.Context, name string) (sandbox.Backend, error) {
	b.opens.Add(1)
	select {
	case <-time.After(b.pause):
		return b.be, nil
	case <-ctx.Done():
		b.cancelled.Add(1)
		return nil, errors.New("build images/wasm/python: go list: signal: killed")
	}
}

func TestAnEpisodeCancelledWhileItsBackendOpensDoesNotFailTheOpen(t *testing.T) {
	src := &slowBackends{be: wasmtest.Backend(t), pause: 500 * time.Millisecond}
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	s := startService(t, "", func(o *runtime.Options) { o.Backends = src })
	id := s.submit(rolloutBody(p, 1, task("deleted")))
	time.Sleep(100 * time.Millisecond) // the episode waits for its backend
	if code, _ := s.do("DELETE", "/v1/rollouts/"+id, nil, nil); code != 200 {
		t.Fatalf("DELETE: %d", code)
	}
	s.waitHealth(10*time.Second, func(h health, _ int) bool { return h.Backends["wasm"].State == runtime.BackendUp })
	id = s.submit(rolloutBody(p, 2, task("after")))
	st := s.waitState(id, 30*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	if st.Ends["finished"] != 2 {
		t.Errorf("the rollout after the cancelled one: %+v", st)
	}
	if src.opens.Load() != 1 || src.cancelled.Load() != 0 {
		t.Errorf("%d opens, %d cancelled: want one open, run to its end", src.opens.Load(), src.cancelled.Load())
	}
}

func containsLine(text, line string) bool {
	for _, l := range splitLines(text) {
		if l == line {
			return true
		}
	}
	return false
}

func splitLines(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\n' {
			i++
		}
		out = append(out, s[:i])
		if i < len(s) {
			i++
		}
		s = s[i:]
	}
	return out
}

// episodeFiles counts the records in a data directory.
func episodeFiles(t *testing.T, data string) (records, journals int) {
	t.Helper()
	r, _ := filepath.Glob(filepath.Join(data, "episodes", "*.json"))
	j, _ := filepath.Glob(filepath.Join(data, "episodes", "*"+trajectory.PartialSuffix))
	return len(r), len(j)
}

var _ = os.Getenv

// waitRunning waits until n episodes of the service are running.
func (s *service) waitRunning(n int, within time.Duration) {
	s.t.Helper()
	s.waitHealth(within, func(h health, _ int) bool { return h.EpisodesRunning >= n })
}

func TestDeletingA4096EpisodeRolloutAnswersAtOnce(t *testing.T) {
	p, _ := blockingPolicy(t)
	s := startService(t, "", func(o *runtime.Options) { o.Limits.MaxRunning = 8 })
	id := s.submit(rolloutBody(p, 4096, task("big")))
	s.waitRunning(8, 30*time.Second)
	start := time.Now()
	var st status
	if code, _ := s.do("DELETE", "/v1/rollouts/"+id, nil, &st); code != 200 || st.State != runtime.RolloutCancelled {
		t.Fatalf("DELETE: %d %+v", code, st)
	}
	took := time.Since(start)
	t.Logf("DELETE of 4,096 episodes (8 running) answered in %s", took)
	if took > time.Second {
		t.Errorf("DELETE took %s", took)
	}
	st = s.waitState(id, time.Minute, func(st status) bool { return st.EpisodesDone == 4096 })
	t.Logf("every episode recorded %s after the DELETE", time.Since(start))
	if st.Ends["cancelled"] != 4096 || st.State != runtime.RolloutCancelled {
		t.Errorf("after the DELETE: %+v", st)
	}
	if records, journals := episodeFiles(t, s.data); records != 4096 || journals != 0 {
		t.Errorf("%d records and %d journals on disk", records, journals)
	}
}

func TestShutdownWith2000QueuedEndsInBoundedTimeAndRecordsEveryEpisodeInterrupted(t *testing.T) {
	p, _ := blockingPolicy(t)
	data := t.TempDir()
	s := startService(t, data, func(o *runtime.Options) { o.Limits.MaxRunning = 16 })
	id := s.submit(rolloutBody(p, 1000, task("a"), task("b")))
	s.waitRunning(16, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("Shutdown with 2,000 episodes (16 running) took %s", took)
	if took > 10*time.Second {
		t.Errorf("Shutdown took %s", took)
	}
	if records, journals := episodeFiles(t, data); records != 2000 || journals != 0 {
		t.Errorf("%d records and %d journals on disk", records, journals)
	}
	s.http.Close()
	b := startService(t, data)
	if len(b.rec.Interrupted) != 0 {
		t.Errorf("the next start had to recover %d episodes", len(b.rec.Interrupted))
	}
	st := b.status(id)
	if st.State != runtime.RolloutCancelled || !st.Interrupted || st.EpisodesDone != 2000 || st.Ends["interrupted"] != 2000 {
		t.Errorf("after the shutdown: %+v", st)
	}
}

func TestTheServiceAnswersWhileItRecovers(t *testing.T) {
	p, release := blockingPolicy(t)
	a := startService(t, "", func(o *runtime.Options) { o.Limits.MaxRunning = 1 })
	id := a.submit(rolloutBody(p, 3, task("a")))
	a.waitRunning(1, 10*time.Second)
	crashed := t.TempDir()
	copyDir(t, a.data, crashed)
	release()

	gate := make(chan struct{})
	b := openHeld(t, crashed, gate)
	srv := b.srv
	if h, code := b.health(); code != 503 || h.Status != runtime.HealthRecovering {
		t.Errorf("healthz while recovering: %d %+v", code, h)
	}
	// What is being recovered waits for it...
	for _, req := range []struct{ method, path string }{
		{"GET", "/v1/rollouts/" + id}, {"GET", "/v1/rollouts/" + id + "/episodes"}, {"DELETE", "/v1/rollouts/" + id},
		{"GET", "/v1/rollouts/" + id + "/summary"}, {"GET", "/v1/rollouts"}, {"GET", "/v1/episodes/" + id + ".a.0"},
	} {
		var e apiErr
		code, hdr := b.do(req.method, req.path, nil, &e)
		if code != 503 || e.Error.Code != "recovering" || hdr.Get("Retry-After") == "" {
			t.Errorf("%s %s while recovering: %d %+v", req.method, req.path, code, e)
		}
	}
	// ... new work does not, and the recovery leaves its journals alone:
	// a rollout's episode and an environment episode, both in flight (a
	// step recorded) when the recovery runs, end as they would have.
	p2, release2 := blockingPolicy(t)
	var fresh struct{ ID string }
	if code, _ := b.do("POST", "/v1/rollouts", rolloutBody(p2, 1, task("new")), &fresh); code != 201 {
		t.Errorf("POST /v1/rollouts while recovering: %d", code)
	}
	var opened struct{ ID string }
	if code, _ := b.do("POST", "/v1/episodes", map[string]any{"task": task("new-env")}, &opened); code != 201 {
		t.Errorf("POST /v1/episodes while recovering: %d", code)
	}
	if code, r := bash(b, opened.ID, "echo before > /work/x; echo ok"); code != 200 || r.Results[0].Output != "ok\n" {
		t.Fatalf("step while recovering: %d %+v", code, r)
	}
	for deadline := time.Now().Add(10 * time.Second); p2.Calls() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the new rollout's episode never asked for its second turn (%d calls)", p2.Calls())
		}
	}
	close(gate)
	if _, err := srv.Recovered(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := b.status(id); st.EpisodesDone != 3 || st.Ends["interrupted"] != 3 {
		t.Errorf("after the recovery: %+v", st)
	}
	release2()
	if st := b.waitState(fresh.ID, 20*time.Second, func(st status) bool { return st.State == "done" }); st.Ends["finished"] != 1 {
		t.Errorf("the rollout submitted while recovering: %+v", st)
	}
	if code, r := bash(b, opened.ID, "cat /work/x"); code != 200 || r.Results[0].Output != "before\n" {
		t.Errorf("step after the recovery: %d %+v", code, r)
	}
	var fin struct{ Reward *trajectory.Reward }
	if code, _ := b.do("POST", "/v1/episodes/"+opened.ID+"/finish", map[string]any{"answer": "done"}, &fin); code != 200 || fin.Reward == nil {
		t.Errorf("finish after the recovery: %d %+v", code, fin.Reward)
	}
	var tr trajectory.Trajectory
	if code, _ := b.do("GET", "/v1/episodes/"+opened.ID, nil, &tr); code != 200 || tr.Termination == nil ||
		tr.Termination.Reason != trajectory.EndFinished || len(tr.Steps) != 4 { // two bash calls, each a model and a tool step
		t.Errorf("the environment episode's record: %d %+v, %d steps", code, tr.Termination, len(tr.Steps))
	}
	if h, code := b.health(); code != 200 || h.Status != runtime.HealthOK {
		t.Errorf("healthz after the recovery: %d %+v", code, h)
	}
}

// The recovery finalizes only what a previous process left: an
// asynchronous orchestrator this process runs while it recovers, whose
// sub-agents have ended but are not collected (so its journal does not
// list them yet), keeps its journal as it is and names each sub-agent
// once, when collected.
func TestTheRecoveryLeavesTheSubagentsOfThisProcessAlone(t *testing.T) {
	sub := startPolicy(t, fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	data := t.TempDir()
	gate := make(chan struct{})
	b := openHeld(t, data, gate)
	srv := b.srv
	tk := orchestratorTask("o", sub)
	tk["orchestrator"].(map[string]any)["async"] = true
	var opened struct{ ID string }
	if code, _ := b.do("POST", "/v1/episodes", map[string]any{"task": tk}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	spawn := map[string]any{"tool_calls": []any{map[string]any{"id": "c1", "name": "spawn_subagents", "arguments": map[string]any{"tasks": []any{
		map[string]any{"prompt": "look at a"}, map[string]any{"prompt": "look at b"}, map[string]any{"prompt": "look at c"}}}}}}
	if code, _ := b.do("POST", "/v1/episodes/"+opened.ID+"/step", spawn, nil); code != 200 {
		t.Fatalf("spawn: %d", code)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if done, _ := filepath.Glob(filepath.Join(data, "episodes", agent.SubagentsDir, "*.json")); len(done) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sub-agents never ended")
		}
	}
	close(gate)
	if _, err := srv.Recovered(context.Background()); err != nil {
		t.Fatal(err)
	}
	collect := map[string]any{"tool_calls": []any{map[string]any{"id": "c2", "name": "wait", "arguments": map[string]any{}}}}
	if code, _ := b.do("POST", "/v1/episodes/"+opened.ID+"/step", collect, nil); code != 200 {
		t.Fatalf("wait: %d", code)
	}
	if code, _ := b.do("POST", "/v1/episodes/"+opened.ID+"/finish", map[string]any{"answer": "done"}, nil); code != 200 {
		t.Fatalf("finish: %d", code)
	}
	var tr trajectory.Trajectory
	if code, _ := b.do("GET", "/v1/episodes/"+opened.ID, nil, &tr); code != 200 || tr.Termination == nil || tr.Termination.Reason != trajectory.EndFinished {
		t.Fatalf("record: %d %+v", code, tr.Termination)
	}
	seen := map[string]int{}
	for _, sa := range tr.Subagents {
		seen[sa.EpisodeID]++
		if sa.CollectedStep == nil {
			t.Errorf("sub-agent %s named as never collected: %+v", sa.EpisodeID, sa)
		}
	}
	if len(seen) != 3 || len(tr.Subagents) != 3 {
		t.Errorf("the record names %d sub-agents (%d distinct), want each of 3 once", len(tr.Subagents), len(seen))
	}
}

// openHeld opens a service on data whose recovery waits for gate to close.
func openHeld(t *testing.T, data string, gate chan struct{}) *service {
	t.Helper()
	opts := runtime.Options{DataDir: data, Backends: wasmBackends(t)}
	runtime.HoldRecovery(&opts, gate)
	srv, err := runtime.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); srv.Close() })
	return &service{t: t, srv: srv, http: hs, url: hs.URL, data: data}
}
