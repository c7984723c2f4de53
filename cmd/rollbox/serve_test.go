package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/internal/lease"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

func TestServeExportAndBenchRefuseBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--backend", "vm"},
		{"serve", "--max-running", "0"},
		{"serve", "--max-limits", "memory_mb=lots"},
		{"serve", "--auth-tokens", "/no/such/tokens"},
		{"serve", "--max-limits", "gpus=8"},
		{"serve", "--disk-reserve", "plenty"},
		{"serve", "--shutdown-timeout", "0s"},
		{"serve", "--recycle-above", "lots"},
		{"serve", "--recycle-above", "0%"},
		{"serve", "--recycle-above", "20"},
		{"serve", "--recycle-above", "0MiB"},
		{"serve", "--recycle-idle", "0s"},
		{"serve", "--log-level", "loud"},
		{"serve", "--fork-spares", "-1"},
		{"serve", "--fork-spares", "257"},
		{"serve", "--tasks", "/no/such/file.jsonl"},
		{"serve", "extra"},
		{"serve", "--addr", "127.0.0.1:99999"},
		{"serve", "--addr", "127.0.0.1"},
		{"serve", "--health-addr", "127.0.0.1:-1"},
		{"serve", "--debug-addr", ":nope"},
		{"worker", "--cluster", "nats://127.0.0.1:1", "--backend", "wasm", "--slots", "1", "--metrics-addr", ":70000"},
		{"export"},
		{"export", "--from", t.TempDir(), "--format", "csv"},
		{"export", "--from", t.TempDir(), "--format", "parquet"},
		{"bench", "--mode", "fast"},
		{"bench", "--episodes", "15", "--group", "10"},
		{"bench", "--mode", "env-step", "--backend", "wasm"},
	} {
		if code, _, stderr := rollbox(t, args...); code != exitBadInput {
			t.Errorf("rollbox %v: exit %d, want 2 (%s)", args, code, stderr)
		}
	}
}

// lineWriter hands written lines to a reader (dropping them when it lags),
// and keeps them all.
type lineWriter struct {
	lines chan string
	mu    sync.Mutex
	all   strings.Builder
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.all.Write(p)
	w.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		select {
		case w.lines <- l:
		default:
		}
	}
	return len(p), nil
}

var listenRe = regexp.MustCompile(`listening on (http://\S+)`)

// serve runs `rollbox serve` until the returned stop is called.
func serve(t *testing.T, args ...string) (url string, stop func() int) {
	t.Helper()
	url, stop, _ = serveLogged(t, args...)
	return url, stop
}

// serveLogged is serve, and everything the service wrote on stderr.
func serveLogged(t *testing.T, args ...string) (url string, stop func() int, stderr func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lw := &lineWriter{lines: make(chan string, 1000)}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, &cliEnv{stdin: strings.NewReader(""), stdout: io.Discard, stderr: lw, self: testSelf}, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...))
	}()
	deadline := time.After(60 * time.Second)
	for url == "" {
		select {
		case l := <-lw.lines:
			if m := listenRe.FindStringSubmatch(l); m != nil {
				url = m[1]
			}
		case code := <-done:
			t.Fatalf("rollbox serve exited %d before listening", code)
		case <-deadline:
			t.Fatal("rollbox serve did not listen in 60s")
		}
	}
	return url, func() int {
			cancel()
			select {
			case code := <-done:
				return code
			case <-time.After(30 * time.Second):
				t.Fatal("rollbox serve did not stop")
				return -1
			}
		}, func() string {
			lw.mu.Lock()
			defer lw.mu.Unlock()
			return lw.all.String()
		}
}

// waitLogged waits for a service to log msg (the start-up clean-up runs
// beside the listener, so it may end after "listening on").
func waitLogged(t *testing.T, logs func() string, msg string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(logs(), msg); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the service did not log %q in 2 minutes:\n%s", msg, logs())
		}
	}
}

func TestServeRunsARolloutAndKeepsItAcrossARestart(t *testing.T) {
	t.Setenv("ROLLBOX_OWNER", "rollbox-serve-test") // the owner label of this test's containers
	dir := t.TempDir()
	tasks := filepath.Join(dir, "tasks.jsonl")
	os.WriteFile(tasks, []byte(`{"id": "say-done", "prompt": "Say done.", "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "done"}}`+"\n"), 0o644)
	data := filepath.Join(dir, "data")
	p, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	url, stop := serve(t, "--data", data, "--tasks", tasks)
	body, _ := json.Marshal(map[string]any{"tasks": []any{map[string]any{"id": "say-done"}}, "group_size": 3,
		"policy": map[string]any{"base_url": p.URL(), "model": "fake-model"}})
	resp, err := http.Post(url+"/v1/rollouts", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var created struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if resp.StatusCode != 201 || created.ID == "" {
		t.Fatalf("POST /v1/rollouts: %s", resp.Status)
	}
	resp, err = http.Get(url + "/v1/rollouts/" + created.ID + "/episodes?stream=1")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); n++ {
		var e struct {
			Reward *struct{ Total float64 }
			Group  *struct {
				ZeroVariance bool `json:"zero_variance"`
			} `json:"group"`
		}
		json.Unmarshal(sc.Bytes(), &e)
		if e.Reward == nil || e.Reward.Total != 1 || e.Group == nil || !e.Group.ZeroVariance {
			t.Errorf("episode line %.200s", sc.Text()[strings.Index(sc.Text(), `"termination"`):])
		}
	}
	resp.Body.Close()
	if n != 3 {
		t.Fatalf("streamed %d episodes", n)
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d after the signal", code)
	}
	// The audit log is on by default, in the data directory, and has
	// every episode's sandboxes.
	if code, out, stderr := rollbox(t, "audit", "verify-log", "--json", filepath.Join(data, "audit.jsonl")); code != 0 ||
		!strings.Contains(out, `"episodes": 3`) {
		t.Errorf("the default audit log: exit %d %s %s", code, out, stderr)
	}

	// A new process on the same data directory has it all; --audit-log
	// moves the log.
	moved := filepath.Join(dir, "elsewhere.jsonl")
	url, stop = serve(t, "--data", data, "--audit-log", moved)
	defer stop()
	if _, err := os.Stat(moved); err != nil {
		t.Errorf("--audit-log: %v", err)
	}
	var st runtime.RolloutStatus
	resp, err = http.Get(url + "/v1/rollouts/" + created.ID)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st.State != runtime.RolloutDone || st.EpisodesDone != 3 || st.Ends["finished"] != 3 {
		t.Errorf("after the restart: %+v", st)
	}

	// rollbox export reads the same files.
	out := filepath.Join(dir, "out.parquet")
	if code, _, stderr := rollbox(t, "export", "--from", data, "--rollout", created.ID, "--format", "parquet", "--out", out); code != 0 {
		t.Fatalf("export: %d %s", code, stderr)
	}
	b, _ := os.ReadFile(out)
	rows, err := runtime.ReadParquet(bytes.NewReader(b), int64(len(b)))
	if err != nil || len(rows) != 3 || rows[0].TaskID != "say-done" || rows[0].ZeroVariance == nil || !*rows[0].ZeroVariance {
		t.Errorf("exported rows: %d %v", len(rows), err)
	}
}

func TestBenchAgainstARunningService(t *testing.T) {
	be, err := wasm.New(context.Background(), wasm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	srv, err := runtime.Open(runtime.Options{DataDir: t.TempDir(),
		Backends: runtime.BackendFunc(func(context.Context, string) (sandbox.Backend, error) { return be, nil })})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	defer hs.CloseClientConnections()
	code, out, stderr := rollbox(t, "bench", "--url", hs.URL, "--episodes", "20", "--group", "10", "--turns", "3", "--latency", "5ms")
	if code != 0 || !strings.Contains(out, "completed           20/20") || !strings.Contains(out, "turn overhead") {
		t.Fatalf("bench: exit %d\n%s\n%s", code, out, stderr)
	}
	code, out, stderr = rollbox(t, "bench", "--url", hs.URL, "--episodes", "10", "--group", "10", "--turns", "2", "--latency", "5ms", "--json")
	var res struct {
		Completed int `json:"completed"`
	}
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || res.Completed != 10 {
		t.Fatalf("bench --json: exit %d, %v\n%s\n%s", code, err, out, stderr)
	}
}

func TestServeRemovesTheContainersACrashedServiceLeft(t *testing.T) {
	ctx := context.Background()
	guest, err := images.NewBuilder(io.Discard).Build(ctx, guestTarget)
	var be *docker.Backend
	if err == nil {
		be, err = docker.New(ctx, docker.Options{GuestPath: guest, Owner: "rollbox-serve-orphans-test"})
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("docker engine required under CI=true: %v", err)
		}
		t.Skipf("no docker engine: %v", err)
	}
	defer be.Close()
	// What a killed service leaves: running containers with its owner label.
	for range 2 {
		if _, err := be.Create(ctx, sandbox.Spec{Image: "base"}); err != nil {
			t.Fatal(err)
		}
	}
	owned := func() int {
		list, err := be.Client().ContainerList(ctx, container.ListOptions{All: true,
			Filters: filters.NewArgs(filters.Arg("label", docker.LabelOwner+"=rollbox-serve-orphans-test"))})
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	if n := owned(); n != 2 {
		t.Fatalf("%d containers before the restart", n)
	}
	t.Setenv("ROLLBOX_OWNER", "rollbox-serve-orphans-test")
	// A service on the WASM backend does not contact the engine: they wait
	// for the first docker episode (or a service that runs docker).
	data := t.TempDir()
	_, stop := serve(t, "--data", data)
	stop()
	if n := owned(); n != 2 {
		t.Fatalf("a service on the wasm backend touched the containers: %d left", n)
	}
	_, stop, logs := serveLogged(t, "--data", data, "--backend", "docker")
	defer stop()
	waitLogged(t, logs, "start-up clean-up done")
	if n := owned(); n != 0 {
		t.Errorf("%d orphaned containers left after serve started", n)
	}
}

func TestServeStopsWithinItsShutdownTimeoutAndRecordsEveryEpisodeInterrupted(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	release := make(chan struct{})
	defer close(release)
	p, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(5),
		Fault: func(_ int64, req *fakepolicy.Request) fakepolicy.Fault {
			if req.AssistantTurns() > 0 {
				<-release
			}
			return fakepolicy.Fault{}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	url, stop := serve(t, "--data", data, "--max-running", "8", "--shutdown-timeout", "10s")
	tasks := []any{}
	for i := range 4 {
		tasks = append(tasks, map[string]any{"id": fmt.Sprintf("t%d", i), "prompt": "wait", "tools": []string{"bash", "finish"},
			"reward": map[string]any{"type": "exact", "answer": "done"}})
	}
	body, _ := json.Marshal(map[string]any{"tasks": tasks, "group_size": 100, "policy": map[string]any{"base_url": p.URL(), "model": "m"}})
	resp, err := http.Post(url+"/v1/rollouts", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var created struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var h runtime.Health
		if resp, err := http.Get(url + "/healthz"); err == nil {
			json.NewDecoder(resp.Body).Decode(&h)
			resp.Body.Close()
		}
		if h.EpisodesRunning == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("8 episodes did not start: %+v", h)
		}
	}
	start := time.Now()
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	took := time.Since(start)
	t.Logf("serve stopped %s after the signal with 400 episodes (8 running)", took)
	if took > 10*time.Second {
		t.Errorf("serve took %s to stop", took)
	}
	url, stop = serve(t, "--data", data)
	defer stop()
	var st runtime.RolloutStatus
	resp, err = http.Get(url + "/v1/rollouts/" + created.ID)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st.State != runtime.RolloutCancelled || !st.Interrupted || st.EpisodesDone != 400 || st.Ends["interrupted"] != 400 {
		t.Errorf("after the shutdown: %+v", st)
	}
}

func TestServeStartupGCLeavesOtherOwnersContainersAlone(t *testing.T) {
	needDocker(t)
	ctx := context.Background()
	guest, err := images.NewBuilder(io.Discard).Build(ctx, guestTarget)
	if err != nil {
		t.Fatal(err)
	}
	leases := t.TempDir()
	t.Setenv("ROLLBOX_LEASE_DIR", leases)
	// A dead lease: its file is there and no process holds it.
	dead := fmt.Sprintf("%016x", time.Now().UnixNano())
	if err := os.WriteFile(filepath.Join(leases, dead+".lease"), []byte("pid 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	owners := map[string]string{"mine": fmt.Sprintf("rollbox-serve-gc-mine-%d", os.Getpid()), "other": fmt.Sprintf("rollbox-serve-gc-other-%d", os.Getpid())}
	count := map[string]func() int{}
	for who, owner := range owners {
		be, err := docker.New(ctx, docker.Options{GuestPath: guest, Owner: owner,
			Labels: map[string]string{lease.LabelLease: dead, lease.LabelHost: lease.Host()}})
		if err != nil {
			t.Fatal(err)
		}
		defer be.Close()
		defer docker.Cleanup(context.Background(), be.Client(), owner)
		if _, err := be.Create(ctx, sandbox.Spec{Image: "base"}); err != nil {
			t.Fatal(err)
		}
		count[who] = func() int {
			list, err := be.Client().ContainerList(ctx, container.ListOptions{All: true,
				Filters: filters.NewArgs(filters.Arg("label", docker.LabelOwner+"="+owner))})
			if err != nil {
				t.Fatal(err)
			}
			return len(list)
		}
	}
	t.Setenv("ROLLBOX_OWNER", owners["mine"])
	_, stop, logs := serveLogged(t, "--data", t.TempDir(), "--backend", "docker")
	waitLogged(t, logs, "start-up clean-up done")
	stop()
	if count["mine"]() != 0 || count["other"]() != 1 {
		t.Errorf("after serve started: %d of mine, %d of the other owner's; want 0 and 1", count["mine"](), count["other"]())
	}
	_, stop, logs = serveLogged(t, "--data", t.TempDir(), "--gc-all-owners")
	waitLogged(t, logs, "start-up clean-up done")
	stop()
	if n := count["other"](); n != 0 {
		t.Errorf("--gc-all-owners left %d of the other owner's dead containers", n)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1GiB": 1 << 30, "512MiB": 512 << 20, "1.5KiB": 1536, "10GB": 10e9, "2mb": 2e6, "4096": 4096, "0": 0, "7 B": 7} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "lots", "-1GiB", "1e300GiB", "GiB"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) succeeded", bad)
		}
	}
}

func TestExportSkipsAndNamesAnUnreadableRecord(t *testing.T) {
	dir := t.TempDir()
	eps := filepath.Join(dir, "episodes")
	os.MkdirAll(eps, 0o755)
	good := &trajectory.Trajectory{EpisodeID: "r1.t.0", RolloutID: "r1", GroupID: "r1.t", TaskID: "t",
		Termination: &trajectory.Termination{Reason: trajectory.EndFinished}}
	w, err := trajectory.NewWriter(eps, good)
	if err != nil {
		t.Fatal(err)
	}
	w.End(good.Termination, nil, trajectory.Stats{})
	os.WriteFile(filepath.Join(eps, "r1.t.1.json"), []byte(`{"schema": "rollbox.traj`), 0o644)
	code, out, stderr := rollbox(t, "export", "--from", dir, "--format", "jsonl")
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(stderr, "r1.t.1.json") || !strings.Contains(stderr, "1 unreadable record(s) skipped") {
		t.Errorf("export: %d\n%s\n%s", code, out, stderr)
	}
}

func TestServeWithAuthTokensRefusesAnonymousRequests(t *testing.T) {
	tokens := writeFile(t, t.TempDir(), "tokens", "trainer-a 5f1d0c3e9a8b7c6d5e4f3a2b1c0d9e8f")
	url, stop := serve(t, "--data", t.TempDir(), "--auth-tokens", tokens)
	defer stop()
	get := func(token string) int {
		req, _ := http.NewRequest("GET", url+"/v1/rollouts", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(""); code != 401 {
		t.Errorf("without a token: %d", code)
	}
	if code := get("5f1d0c3e9a8b7c6d5e4f3a2b1c0d9e8f"); code != 200 {
		t.Errorf("with the token: %d", code)
	}
	if resp, err := http.Get(url + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("healthz without a token: %v %v", resp, err)
	}
}
