package runtime_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// startHTTPService serves the service through its own http.Server (the
// timeouts of Options.HTTP), as rollbox serve does.
func startHTTPService(t *testing.T, timeouts runtime.HTTPTimeouts, mutate ...func(*runtime.Options)) *service {
	t.Helper()
	opts := runtime.Options{DataDir: t.TempDir(), Backends: wasmBackends(t), HTTP: timeouts}
	for _, m := range mutate {
		m(&opts)
	}
	srv, err := runtime.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(nil)
	hs.Config = srv.HTTPServer()
	hs.Start()
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		srv.Close()
	})
	return &service{t: t, srv: srv, http: hs, url: hs.URL}
}

func TestASlowBodyClientIsCutOffAndOthersAreServed(t *testing.T) {
	s := startHTTPService(t, runtime.HTTPTimeouts{ReadHeader: 300 * time.Millisecond, Read: 500 * time.Millisecond})
	addr := strings.TrimPrefix(s.url, "http://")
	for _, tt := range []struct{ name, request string }{
		{"a body shorter than its Content-Length", "POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"tasks\": ["},
		{"headers that never end", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			if _, err := io.WriteString(conn, tt.request); err != nil {
				t.Fatal(err)
			}
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			answer, _ := io.ReadAll(conn) // until the server closes the connection
			took := time.Since(start)
			if took > 3*time.Second {
				t.Errorf("the connection was held %s", took)
			}
			if line, _, _ := strings.Cut(string(answer), "\r\n"); line != "" && !strings.Contains(line, " 408 ") && !strings.Contains(line, " 400 ") {
				t.Errorf("answer %q", line)
			}
			t.Logf("cut off after %s: %.60q", took, answer)
		})
	}
	if _, code := s.health(); code != 200 {
		t.Errorf("healthz: %d", code)
	}
}

func TestAStreamOutlivesTheReadAndWriteTimeouts(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{Latency: 300 * time.Millisecond, Responder: answering(func(string) string { return "done" })})
	s := startHTTPService(t, runtime.HTTPTimeouts{Read: 200 * time.Millisecond, Write: 200 * time.Millisecond},
		func(o *runtime.Options) { o.Limits.MaxRunning = 1 })
	id := s.submit(rolloutBody(p, 4, task("slow"))) // four episodes one after the other: ~2.4 s
	req, _ := http.NewRequestWithContext(context.Background(), "GET", s.url+"/v1/rollouts/"+id+"/episodes?stream=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); n++ {
	}
	if n != 4 {
		t.Errorf("the stream ended after %d of 4 lines", n)
	}
}

var _ = fmt.Sprint

// A probe's /healthz answer says how long it was the service's (Server-Timing:
// service;dur=MS, from the request's arrival in its socket, and
// accept;dur=MS, from the accept): the part of a slow probe that is the
// service's, apart from the client's connect (rollbox bench splits them). Only the first request on a
// connection says it: a kept-alive connection's accept is long past.
func TestAHealthProbeSaysTheServicesPartOfItsLatency(t *testing.T) {
	s := startHTTPService(t, runtime.HTTPTimeouts{})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for i, want := range []bool{true, false} { // a new connection, then the same one kept alive
		resp, err := client.Get(s.url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		st := resp.Header.Get("Server-Timing")
		var ms float64
		_, err = fmt.Sscanf(st, "service;dur=%g", &ms)
		switch {
		case want && (err != nil || ms < 0 || ms > 10_000):
			t.Errorf("probe %d on a new connection: Server-Timing %q, want service;dur=MS", i, st)
		case !want && st != "":
			t.Errorf("probe %d on a kept-alive connection: Server-Timing %q, want none", i, st)
		}
	}
}
