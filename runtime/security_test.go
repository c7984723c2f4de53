package runtime_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// raw sends a request as a browser or a script would, and returns the
// status and the headers.
func (s *service) raw(method, path, contentType, body string, headers ...string) (int, http.Header) {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

func (s *service) rolloutCount() int {
	s.t.Helper()
	var list struct{ Rollouts []status }
	if code, _ := s.do("GET", "/v1/rollouts", nil, &list); code != 200 {
		s.t.Fatalf("GET /v1/rollouts: %d", code)
	}
	return len(list.Rollouts)
}

func TestABrowserPageCannotDriveTheService(t *testing.T) {
	var calls int
	p := startPolicy(t, fakepolicy.Config{Responder: func(*fakepolicy.Request) fakepolicy.Reply { calls++; return fakepolicy.Reply{Content: "x"} }})
	s := startService(t, "", func(o *runtime.Options) { o.AllowedHosts = runtime.LoopbackHosts() })
	js := `{"tasks": [{"id": "t", "prompt": "p", "reward": {"type": "exact", "answer": "x"}}], "policy": {"base_url": "` + p.URL() + `", "model": "m"}}`
	for _, tt := range []struct {
		name        string
		contentType string
		headers     []string
		want        int
	}{
		{"a form post (text/plain, a simple cross-site request)", "text/plain", nil, 415},
		{"a form post (urlencoded)", "application/x-www-form-urlencoded", nil, 415},
		{"a multipart form post", "multipart/form-data; boundary=x", nil, 415},
		{"no content type", "", nil, 415},
		{"JSON from another origin", "application/json", []string{"Origin", "http://evil.example"}, 403},
		{"JSON from a cross-site fetch", "application/json", []string{"Sec-Fetch-Site", "cross-site"}, 403},
		{"JSON to a rebound host name", "application/json", []string{"Host", "evil.example:7070"}, 403},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, hdr := s.raw("POST", "/v1/rollouts", tt.contentType, js, tt.headers...)
			if code != tt.want {
				t.Errorf("%d, want %d", code, tt.want)
			}
			if hdr.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("CORS answered: %v", hdr)
			}
		})
	}
	// A CORS preflight gets nothing that would let the browser go on.
	code, hdr := s.raw("OPTIONS", "/v1/rollouts", "", "", "Origin", "http://evil.example", "Access-Control-Request-Method", "POST",
		"Access-Control-Request-Headers", "content-type")
	for k := range hdr {
		if strings.HasPrefix(k, "Access-Control-") {
			t.Errorf("preflight %d answered %s", code, k)
		}
	}
	if n := s.rolloutCount(); n != 0 || calls != 0 {
		t.Fatalf("%d rollouts created, %d policy calls made", n, calls)
	}
	// The same request from a script on this host goes through.
	if code, _ := s.raw("POST", "/v1/rollouts", "application/json; charset=utf-8", js); code != 201 {
		t.Errorf("a script's request: %d", code)
	}
	if code, _ := s.raw("POST", "/v1/rollouts", "application/json", js, "Origin", s.url); code != 201 {
		t.Errorf("a same-origin request: %d", code)
	}
}

func TestTenantsSeeAndTouchOnlyWhatTheyCreated(t *testing.T) {
	tenants, err := runtime.ParseTenants(strings.NewReader("# trainers\nalice 0123456789abcdef0123\nbob   fedcba9876543210fedc\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := blockingPolicy(t)
	s := startService(t, "", func(o *runtime.Options) { o.Tenants = tenants })
	alice := &service{t: t, srv: s.srv, http: s.http, url: s.url, token: "0123456789abcdef0123"}
	bob := &service{t: t, srv: s.srv, http: s.http, url: s.url, token: "fedcba9876543210fedc"}

	// Without a token, or with a wrong one: 401, except health and the API document.
	for _, tok := range []string{"", "not-a-token-at-all-0000"} {
		anon := &service{t: t, url: s.url, token: tok}
		if code, hdr := anon.do("GET", "/v1/rollouts", nil, nil); code != 401 || !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("GET /v1/rollouts with token %q: %d", tok, code)
		}
		if code, _ := anon.do("POST", "/v1/rollouts", rolloutBody(p, 1, task("x")), nil); code != 401 {
			t.Errorf("POST with token %q: %d", tok, code)
		}
		if code, _ := anon.do("GET", "/metrics", nil, nil); code != 401 {
			t.Errorf("GET /metrics with token %q: %d", tok, code)
		}
	}
	if code, _ := (&service{t: t, url: s.url}).do("GET", "/healthz", nil, nil); code != 200 {
		t.Errorf("healthz without a token: %d", code)
	}

	id := alice.submit(rolloutBody(p, 2, task("mine")))
	alice.waitRunning(2, 10*time.Second)
	var opened struct{ ID string }
	if code, _ := alice.do("POST", "/v1/episodes", map[string]any{"task": task("env")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	episode := id + ".mine.0"
	for _, req := range []struct{ method, path string }{
		{"GET", "/v1/rollouts/" + id}, {"DELETE", "/v1/rollouts/" + id}, {"GET", "/v1/rollouts/" + id + "/episodes"},
		{"GET", "/v1/rollouts/" + id + "/summary"}, {"GET", "/v1/rollouts/" + id + "/export"},
		{"POST", "/v1/rollouts/" + id + "/policy-version"}, {"GET", "/v1/episodes/" + episode},
		{"GET", "/v1/episodes/" + opened.ID}, {"POST", "/v1/episodes/" + opened.ID + "/step"},
		{"POST", "/v1/episodes/" + opened.ID + "/finish"}, {"DELETE", "/v1/episodes/" + opened.ID},
		{"POST", "/v1/episodes/" + opened.ID + "/fork"},
	} {
		var body any
		if req.method == "POST" {
			body = map[string]any{"tool_calls": []any{}, "content": "hi", "version": "v2"}
			if strings.HasSuffix(req.path, "/finish") {
				body = map[string]any{}
			}
			if strings.HasSuffix(req.path, "/policy-version") {
				body = map[string]any{"version": "v2"}
			}
			if strings.HasSuffix(req.path, "/fork") {
				body = map[string]any{"n": 1}
			}
		}
		var e apiErr
		if code, _ := bob.do(req.method, req.path, body, &e); code != 404 {
			t.Errorf("bob %s %s: %d %+v", req.method, req.path, code, e)
		}
	}
	if n := bob.rolloutCount(); n != 0 {
		t.Errorf("bob lists %d rollouts", n)
	}
	// Alice's forks are hers: bob reaches none of them.
	var forked runtime.ForkResult
	if code, _ := alice.do("POST", "/v1/episodes/"+opened.ID+"/fork", map[string]any{"n": 1}, &forked); code != 201 || len(forked.IDs) != 1 {
		t.Fatalf("alice forks her episode: %d %+v", code, forked)
	}
	child := forked.IDs[0]
	for _, req := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/v1/episodes/" + child, nil},
		{"POST", "/v1/episodes/" + child + "/step", map[string]any{"tool_calls": []any{}, "content": "hi"}},
		{"POST", "/v1/episodes/" + child + "/fork", map[string]any{"n": 1}},
		{"POST", "/v1/episodes/" + child + "/finish", map[string]any{}},
	} {
		if code, _ := bob.do(req.method, req.path, req.body, nil); code != 404 {
			t.Errorf("bob %s alice's fork %s: %d", req.method, req.path, code)
		}
	}
	if code, _ := alice.do("POST", "/v1/episodes/"+child+"/finish", map[string]any{"answer": "done"}, nil); code != 200 {
		t.Errorf("alice finishes her fork: %d", code)
	}
	if code, _ := bob.do("POST", "/v1/episodes/"+child+"/fork", map[string]any{"n": 1}, nil); code != 404 {
		t.Errorf("bob forks alice's ended fork: %d, want 404 (not 409: it is not his to know of)", code)
	}
	// Bob announcing a version does not touch alice's rollouts.
	var res runtime.PolicyVersionResult
	bob.do("POST", "/v1/policy-version", map[string]any{"version": "bob-v9"}, &res)
	if len(res.Rollouts) != 0 {
		t.Errorf("bob's announcement reached %v", res.Rollouts)
	}
	// Alice still has it all.
	if st := alice.status(id); st.State != runtime.RolloutRunning || st.Running != 2 {
		t.Errorf("alice's rollout after bob's attempts: %+v", st)
	}
	if n := alice.rolloutCount(); n != 1 {
		t.Errorf("alice lists %d rollouts", n)
	}
	var tr map[string]any
	if code, _ := alice.do("GET", "/v1/episodes/"+opened.ID, nil, &tr); code != 200 {
		t.Errorf("alice GET her env episode: %d", code)
	}
	if code, _ := alice.do("DELETE", "/v1/rollouts/"+id, nil, nil); code != 200 {
		t.Errorf("alice DELETE: %d", code)
	}
}

func TestATokensFileWithAMistakeIsRefusedNamingTheLine(t *testing.T) {
	for _, tt := range []struct{ name, file, want string }{
		{"a short token", "alice short\n", "line 1"},
		{"a token twice", "alice 0123456789abcdef0123\nbob 0123456789abcdef0123\n", "line 2"},
		{"three words", "alice x 0123456789abcdef0123\n", "line 1"},
		{"a bad tenant name", "al/ice 0123456789abcdef0123\n", "line 1"},
		{"no token", "# nobody\n", "no token"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := runtime.ParseTenants(strings.NewReader(tt.file), "tokens"); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to name %q", err, tt.want)
			}
		})
	}
}
