package runtime_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// startPromptService serves the service as rollbox serve does: its
// http.Server over its prompt listener (runtime.Server.PromptListener).
func startPromptService(t *testing.T, mutate ...func(*runtime.Options)) *service {
	t.Helper()
	opts := runtime.Options{DataDir: t.TempDir(), Backends: wasmBackends(t)}
	for _, m := range mutate {
		m(&opts)
	}
	srv, ln := openPromptListening(t, opts)
	hs := srv.HTTPServer()
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return &service{t: t, srv: srv, url: "http://" + ln.Addr().String()}
}

// openPromptListening opens the service and its prompt listener on a free
// port (as rollbox serve does), both closed at the test's end; serving the
// listener is the caller's.
func openPromptListening(t *testing.T, opts runtime.Options) (*runtime.Server, net.Listener) {
	t.Helper()
	srv, err := runtime.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.PromptListener(tcp.(*net.TCPListener), 2*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return srv, ln
}

// TestHelperProber is a liveness probe in a process of its own (the
// os/exec tests' idiom): GET ROLLBOX_PROBE_URL/healthz on a new connection
// every 20 ms for ROLLBOX_PROBE_FOR, printing each probe's status and
// milliseconds.
func TestHelperProber(t *testing.T) {
	url := os.Getenv("ROLLBOX_PROBE_URL")
	if url == "" {
		return // only a child process of the probe test probes
	}
	d, _ := time.ParseDuration(os.Getenv("ROLLBOX_PROBE_FOR"))
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		t0 := time.Now()
		resp, err := client.Get(url + "/healthz")
		if err != nil {
			fmt.Printf("probe failed %v\n", err)
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Printf("probe %d %.3f %s\n", resp.StatusCode, float64(time.Since(t0))/float64(time.Millisecond), resp.Header.Get("Content-Type"))
	}
}

// probeFrom probes url's /healthz from a child process for d and returns
// the probes' latencies.
func probeFrom(t *testing.T, url string, d time.Duration) []time.Duration {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProber$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ROLLBOX_PROBE_URL="+url, "ROLLBOX_PROBE_FOR="+d.String())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the prober: %v", err)
	}
	var took []time.Duration
	for sc := bufio.NewScanner(strings.NewReader(string(out))); sc.Scan(); {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "probe" {
			continue
		}
		if len(f) != 4 || f[1] != "200" || f[3] != "application/json" {
			t.Fatalf("a probe: %s", sc.Text())
		}
		ms, _ := strconv.ParseFloat(f[2], 64)
		took = append(took, time.Duration(ms*float64(time.Millisecond)))
	}
	if len(took) == 0 {
		t.Fatalf("the prober probed nothing: %s", out)
	}
	return took
}

// spinningPolicy runs `while :; do :; done` (stopped by the command's
// timeout), then finishes.
func spinningPolicy(req *fakepolicy.Request) fakepolicy.Reply {
	if req.AssistantTurns() == 0 {
		return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command":"while :; do :; done"}`}}}
	}
	return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer":"done"}`}}}
}

// submitSpinning starts a rollout of n episodes each running a CPU-bound
// command for timeoutS seconds, and waits until the service is busy.
func submitSpinning(t *testing.T, s *service, n int, timeoutS float64) string {
	t.Helper()
	p := startPolicy(t, fakepolicy.Config{Responder: spinningPolicy})
	tk := task("spin")
	tk["sandbox"] = map[string]any{"limits": map[string]any{"exec_timeout_s": timeoutS}}
	id := s.submit(rolloutBody(p, n, tk))
	for deadline := time.Now().Add(30 * time.Second); !s.srv.Busy(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the rollout's episodes did not start")
		}
	}
	return id
}

// While every one of the WASM backend's shells runs a CPU-bound command
// (sixteen episodes' `while :; do :; done`, MaxShells of them at once,
// each stopped by its 2 s timeout), a liveness probe on a new connection,
// from a process of its own, is answered within a bound generous enough
// for a loaded host. The commands run in the backend's helper processes,
// not among the service's goroutines: they load the host, and the
// service's threads wait for a core with everything else on it (p90 11 to
// 51 ms measured with and without the prompt listener's answer, load 20
// to 34).
func TestAHealthProbeIsAnsweredPromptlyWhileCommandsFloodTheCPU(t *testing.T) {
	s := startPromptService(t)
	id := submitSpinning(t, s, 16, 2)
	time.Sleep(300 * time.Millisecond) // the commands are running
	took := probeFrom(t, s.url, 2500*time.Millisecond)
	var st status
	s.do("GET", "/v1/rollouts/"+id, nil, &st)
	slices.Sort(took)
	p50, p90, worst := took[len(took)/2], took[len(took)*9/10], took[len(took)-1]
	t.Logf("%d probes, %d episodes running at the end: p50 %v, p90 %v, max %v", len(took), st.Running, p50, p90, worst)
	if p90 > 500*time.Millisecond {
		t.Errorf("probes: p50 %v, p90 %v, max %v; want p90 under 500 ms", p50, p90, worst)
	}
}

// While the service is busy, GET /healthz is answered by the prompt
// listener's goroutine itself, the HTTP server's goroutines not needed:
// here they never run (nothing serves the listener's connections), and the
// probe gets the service's health with its Server-Timing; any other
// request waits for the HTTP server. Through the HTTP server a probe waited
// for its goroutines (its accept loop, its connection's) to be scheduled
// among the episodes', each system call of theirs a chance to lose the
// processor and wait behind the whole service.
func TestABusyServiceAnswersAProbeWithoutItsHTTPServer(t *testing.T) {
	srv, ln := openPromptListening(t, runtime.Options{DataDir: t.TempDir(), Backends: wasmBackends(t)})
	url := "http://" + ln.Addr().String()
	// The rollout is submitted through a server of its own: the prompt
	// listener's is never served.
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	s := &service{t: t, srv: srv, url: hs.URL}
	submitSpinning(t, s, 4, 5)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz with the HTTP server not running: %v", err)
	}
	var h runtime.Health
	err = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || h.Status != runtime.HealthOK || h.EpisodesRunning == 0 {
		t.Errorf("GET /healthz: %d %+v (%v); want 200, ok, episodes running", resp.StatusCode, h, err)
	}
	var ms float64
	if _, err := fmt.Sscanf(resp.Header.Get("Server-Timing"), "service;dur=%g", &ms); err != nil || ms < 0 {
		t.Errorf("Server-Timing %q, want service;dur=MS", resp.Header.Get("Server-Timing"))
	}
	// Anything else is the HTTP server's to answer: not taken here.
	for _, path := range []string{"/openapi.json", "/healthz/", "/v1/rollouts"} {
		c := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
		if resp, err := c.Get(url + path); err == nil {
			resp.Body.Close()
			t.Errorf("GET %s answered %d by the listener itself, want it left to the HTTP server", path, resp.StatusCode)
		}
	}
}
