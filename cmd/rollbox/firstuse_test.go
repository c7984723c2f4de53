package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
)

// syncBuffer is a bytes.Buffer safe for the progress goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestASlowFirstUseShowsItsElapsedTimeAndAFastOneNothing(t *testing.T) {
	for _, tty := range []bool{false, true} {
		var out syncBuffer
		f := &firstUse{w: &out, what: "preparing the wasm backend…", tty: tty, quiet: 50 * time.Millisecond, interval: 100 * time.Millisecond, now: time.Now}
		f.run()
		time.Sleep(120 * time.Millisecond)
		f.Write([]byte("rollbox: building images/wasm/python for wasip1/wasm (cached until its source changes)\n"))
		time.Sleep(200 * time.Millisecond)
		f.end(nil)
		got := out.String()
		lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
		if !regexp.MustCompile(`preparing the wasm backend… \d+(\.\d+)?m?s`).MatchString(got) ||
			!regexp.MustCompile(`rollbox: preparing the wasm backend: done in \d+(\.\d+)?m?s\n$`).MatchString(got) {
			t.Errorf("tty %v: %q", tty, got)
		}
		// The build's own line comes out whole, on a line of its own (first,
		// when a loaded host ran this goroutine before the quiet timer).
		if !strings.HasPrefix(got, "rollbox: building images/wasm/python") && !strings.Contains(got, "\nrollbox: building images/wasm/python") &&
			!strings.Contains(got, "\x1b[Krollbox: building images/wasm/python") {
			t.Errorf("tty %v: the builder's line is not on a line of its own: %q", tty, got)
		}
		if !tty && len(lines) < 3 {
			t.Errorf("want a line with the elapsed time, the builder's and the end: %q", got)
		}
	}
	var out syncBuffer
	f := startFirstUse(&out, "preparing the wasm backend…")
	f.end(errors.New("no"))
	if out.String() != "" {
		t.Errorf("a quick preparation printed %q", out.String())
	}
}

// dockerListener is a DOCKER_HOST that counts the connections made to it.
func dockerListener(t *testing.T) *atomic.Int64 {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	t.Setenv("DOCKER_HOST", "unix://"+sock)
	return &n
}

func TestServeOnWASMNeverContactsTheDockerEngineAndLogsJSONOnly(t *testing.T) {
	contacts := dockerListener(t)
	dir := t.TempDir()
	p, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	url, stop, logs := serveLogged(t, "--data", filepath.Join(dir, "data"), "--backend", "wasm", "--log-level", "debug")
	b := runTwoWASMEpisodes(t, url, p.URL())
	if n := strings.Count(string(b), "\n"); n != 2 {
		t.Fatalf("streamed %d episodes", n)
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	if n := contacts.Load(); n != 0 {
		t.Errorf("serve on the wasm backend connected %d time(s) to the Docker engine", n)
	}
	// Every line on stderr is a JSON log record, none holds a Go value dump.
	lines := strings.Split(strings.TrimSpace(logs()), "\n")
	if len(lines) < 3 {
		t.Fatalf("%d log lines: %q", len(lines), lines)
	}
	dump := regexp.MustCompile(`map\[|&\{|\{[A-Z][A-Za-z]*:`)
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil {
			t.Errorf("not a JSON log record: %q", l)
		}
		if dump.MatchString(l) {
			t.Errorf("a Go value dump in the log: %q", l)
		}
	}
}

// hungDockerEngine is a DOCKER_HOST that answers pings and never answers
// anything else: an engine wedged under load.
func hungDockerEngine(t *testing.T) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stuck := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/_ping") {
			w.Header().Set("API-Version", "1.41")
			io.WriteString(w, "OK")
			return
		}
		select {
		case <-stuck:
		case <-r.Context().Done():
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { close(stuck); srv.Close() })
	t.Setenv("DOCKER_HOST", "unix://"+sock)
}

// A service whose Docker engine hangs still listens, answers its health
// probe, runs WASM episodes and stops on its signal: the start-up clean-up
// of a crashed predecessor's containers waits on the engine beside it, not
// in front of it.
func TestServeListensAndRunsWASMEpisodesWhileTheDockerEngineHangs(t *testing.T) {
	hungDockerEngine(t)
	p, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	url, stop := serve(t, "--data", t.TempDir(), "--backend", "docker")
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	b := runTwoWASMEpisodes(t, url, p.URL())
	if n := strings.Count(string(b), `"termination":{"reason":"finished"`); n != 2 {
		t.Errorf("%d of 2 WASM episodes finished: %s", n, b)
	}
	if code := stop(); code != 0 {
		t.Errorf("serve exited %d", code)
	}
}

// runTwoWASMEpisodes runs a rollout of one WASM task × 2 against the
// service at url with the policy at policyURL, and returns its stream.
func runTwoWASMEpisodes(t *testing.T, url, policyURL string) []byte {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"tasks": []any{map[string]any{"id": "t", "prompt": "p", "tools": []string{"bash", "finish"},
		"sandbox": map[string]any{"backend": "wasm"}, "reward": map[string]any{"type": "exact", "answer": "done"}}},
		"group_size": 2, "policy": map[string]any{"base_url": policyURL, "model": "fake-model"}})
	resp, err := http.Post(url+"/v1/rollouts", "application/json", bytes.NewReader(body))
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("POST: %v %v", err, resp)
	}
	var created struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	resp, err = http.Get(url + "/v1/rollouts/" + created.ID + "/episodes?stream=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}
