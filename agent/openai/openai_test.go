package openai

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/internal/fakepolicy"
)

// fast is a Config with test-sized waits.
func fast(baseURL string) Config {
	return Config{
		BaseURL:     baseURL,
		Model:       "test-model",
		Timeout:     5 * time.Second,
		MaxRetries:  3,
		BackoffBase: time.Millisecond,
		BackoffMax:  5 * time.Millisecond,
	}
}

func newPolicy(t *testing.T, cfg Config) *Policy {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func startFake(t *testing.T, cfg fakepolicy.Config) *fakepolicy.Server {
	t.Helper()
	s, err := fakepolicy.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// serve starts an httptest server answering every chat-completions call
// with handler.
func serve(t *testing.T, handler http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Reading the body lets the server notice a client that hangs up.
		_, _ = io.Copy(io.Discard, r.Body)
		handler(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func ptr[T any](v T) *T { return &v }

var hello = agent.Request{Messages: []agent.Message{{Role: agent.RoleUser, Content: "hi"}}}

func TestRequestShape(t *testing.T) {
	schema := json.RawMessage(`{"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}, "required": ["zeta"]}`)
	full := agent.Request{
		Turn: 1,
		Messages: []agent.Message{
			{Role: agent.RoleSystem, Content: "You fix code."},
			{Role: agent.RoleUser, Content: "Fix it.", Name: "alice"},
			{Role: agent.RoleAssistant, ToolCalls: []agent.ToolCall{
				{ID: "call_0_0", Name: "bash", Arguments: `{"command":"ls"}`},
				{ID: "call_0_1", Name: "read_file", Arguments: `{"path": "/work/a.py"`},
			}},
			{Role: agent.RoleTool, ToolCallID: "call_0_0", Name: "bash", Content: "a.py\n"},
			{Role: agent.RoleTool, ToolCallID: "call_0_1", Content: "bad arguments"},
		},
		Tools: []agent.ToolSchema{
			{Name: "bash", Description: "Run a shell line.", Parameters: schema},
			{Name: "run_tests"},
		},
		Sampling: agent.Sampling{
			Temperature: ptr(0.7),
			TopP:        ptr(0.95),
			MaxTokens:   ptr(int64(512)),
			Seed:        ptr(int64(42)),
			Stop:        []string{"</answer>"},
			Logprobs:    true,
			Extra:       map[string]any{"top_k": 20, "return_tokens_as_token_ids": true, "chat_template_kwargs": map[string]any{"enable_thinking": false}},
		},
	}
	tests := []struct {
		name  string
		req   agent.Request
		check func(t *testing.T, body map[string]any, raw string)
	}{
		{
			name: "messages of every role are sent as the API defines them",
			req:  full,
			check: func(t *testing.T, body map[string]any, _ string) {
				want := []any{
					map[string]any{"role": "system", "content": "You fix code."},
					map[string]any{"role": "user", "content": "Fix it.", "name": "alice"},
					map[string]any{"role": "assistant", "tool_calls": []any{
						map[string]any{"id": "call_0_0", "type": "function", "function": map[string]any{"name": "bash", "arguments": `{"command":"ls"}`}},
						map[string]any{"id": "call_0_1", "type": "function", "function": map[string]any{"name": "read_file", "arguments": `{"path": "/work/a.py"`}},
					}},
					map[string]any{"role": "tool", "tool_call_id": "call_0_0", "name": "bash", "content": "a.py\n"},
					map[string]any{"role": "tool", "tool_call_id": "call_0_1", "content": "bad arguments"},
				}
				if !reflect.DeepEqual(body["messages"], want) {
					t.Errorf("messages\n got %v\nwant %v", body["messages"], want)
				}
				if body["model"] != "test-model" {
					t.Errorf("model %v", body["model"])
				}
			},
		},
		{
			name: "tools are function schemas with their parameters byte for byte in order",
			req:  full,
			check: func(t *testing.T, body map[string]any, raw string) {
				tools, _ := body["tools"].([]any)
				if len(tools) != 2 {
					t.Fatalf("tools %v", body["tools"])
				}
				first := tools[0].(map[string]any)
				fn := first["function"].(map[string]any)
				if first["type"] != "function" || fn["name"] != "bash" || fn["description"] != "Run a shell line." {
					t.Errorf("tool 0 %v", first)
				}
				if !strings.Contains(raw, `"properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}`) {
					t.Errorf("schema properties reordered or missing in %s", raw)
				}
				second := tools[1].(map[string]any)["function"].(map[string]any)
				if _, ok := second["parameters"]; ok || second["name"] != "run_tests" {
					t.Errorf("tool 1 %v", second)
				}
				if _, ok := second["description"]; ok {
					t.Errorf("empty description sent: %v", second)
				}
			},
		},
		{
			name: "sampling parameters and extra fields are in the body",
			req:  full,
			check: func(t *testing.T, body map[string]any, _ string) {
				want := map[string]any{
					"temperature": 0.7, "top_p": 0.95, "max_tokens": 512.0, "seed": 42.0,
					"stop": []any{"</answer>"}, "logprobs": true, "top_logprobs": 0.0,
					"top_k": 20.0, "return_tokens_as_token_ids": true,
					"chat_template_kwargs": map[string]any{"enable_thinking": false},
				}
				for k, v := range want {
					if !reflect.DeepEqual(body[k], v) {
						t.Errorf("%s = %#v, want %#v", k, body[k], v)
					}
				}
			},
		},
		{
			name: "unset sampling fields are not sent",
			req:  hello,
			check: func(t *testing.T, body map[string]any, _ string) {
				for _, k := range []string{"temperature", "top_p", "max_tokens", "seed", "stop", "logprobs", "top_logprobs", "tools", "stream"} {
					if v, ok := body[k]; ok {
						t.Errorf("%s sent as %v", k, v)
					}
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, fakepolicy.Config{Record: true})
			p := newPolicy(t, fast(s.URL()))
			if _, err := p.Next(context.Background(), tt.req); err != nil {
				t.Fatal(err)
			}
			reqs := s.Requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests", len(reqs))
			}
			var body map[string]any
			if err := json.Unmarshal(reqs[0].Body, &body); err != nil {
				t.Fatal(err)
			}
			tt.check(t, body, string(reqs[0].Body))
		})
	}
}

func TestRequestHeaders(t *testing.T) {
	tests := []struct {
		name   string
		key    string
		env    string
		bearer string
	}{
		{name: "the configured API key is sent", key: "sk-a", env: "sk-env", bearer: "Bearer sk-a"},
		{name: "the environment is not read: the caller passes the key", env: "sk-env", bearer: "Bearer EMPTY"},
		{name: "without any key EMPTY is sent", bearer: "Bearer EMPTY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("OPENAI_API_KEY", tt.env)
			var got, path string
			s := serve(t, func(w http.ResponseWriter, r *http.Request) {
				got, path = r.Header.Get("Authorization"), r.URL.Path
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"choices": [{"message": {"content": "ok"}}]}`)
			})
			cfg := fast(s.URL + "/v1/")
			cfg.APIKey = tt.key
			if _, err := newPolicy(t, cfg).Next(context.Background(), hello); err != nil {
				t.Fatal(err)
			}
			if got != tt.bearer || path != "/v1/chat/completions" {
				t.Fatalf("Authorization %q path %q", got, path)
			}
		})
	}
}

func TestResponseParsing(t *testing.T) {
	id := func(v int64) *int64 { return &v }
	tests := []struct {
		name string
		body string
		want agent.Turn // Raw, Attempts and Latency are checked apart
	}{
		{
			name: "content, finish reason, model and usage are kept",
			body: `{"model": "qwen", "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
				"usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}`,
			want: agent.Turn{Content: "4", FinishReason: "stop", Model: "qwen", Usage: &agent.Usage{PromptTokens: 10, CompletionTokens: 1, TotalTokens: 11}},
		},
		{
			name: "usage is nil when the server sends none",
			body: `{"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}]}`,
			want: agent.Turn{Content: "hi", FinishReason: "length"},
		},
		{
			name: "parallel tool calls keep their ids, order and argument text",
			body: `{"choices": [{"message": {"content": null, "tool_calls": [
				{"id": "a1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}},
				{"id": "a2", "type": "function", "function": {"name": "edit", "arguments": "{not json"}}]}, "finish_reason": "tool_calls"}]}`,
			want: agent.Turn{FinishReason: "tool_calls", ToolCalls: []agent.ToolCall{
				{ID: "a1", Name: "bash", Arguments: `{"command": "ls"}`},
				{ID: "a2", Name: "edit", Arguments: `{not json`},
			}},
		},
		{
			name: "calls without ids get call_<turn>_<i> and object arguments keep their text",
			body: `{"choices": [{"message": {"tool_calls": [{"function": {"name": "run_tests", "arguments": {"x": 1}}}, {"function": {"name": "finish"}}]}}]}`,
			want: agent.Turn{ToolCalls: []agent.ToolCall{
				{ID: "call_3_0", Name: "run_tests", Arguments: `{"x": 1}`},
				{ID: "call_3_1", Name: "finish", Arguments: `{}`},
			}},
		},
		{
			name: "Hermes markup in the content becomes tool calls",
			body: `{"choices": [{"message": {"content": "Checking.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"run_tests\", \"arguments\": \"{}\"}\n</tool_call>"}, "finish_reason": "stop"}]}`,
			want: agent.Turn{Content: "Checking.", FinishReason: "stop", ToolCallsFromText: true, ToolCalls: []agent.ToolCall{
				{ID: "call_3_0", Name: "bash", Arguments: `{"command":"ls"}`},
				{ID: "call_3_1", Name: "run_tests", Arguments: `{}`},
			}},
		},
		{
			name: "malformed Hermes markup stays content with no calls",
			body: `{"choices": [{"message": {"content": "<tool_call>{\"name\": \"bash\", \"arguments\": {</tool_call>"}}]}`,
			want: agent.Turn{Content: `<tool_call>{"name": "bash", "arguments": {</tool_call>`},
		},
		{
			name: "server tool calls win over markup in the content",
			body: `{"choices": [{"message": {"content": "<tool_call>{\"name\": \"x\"}</tool_call>", "tool_calls": [{"id": "s", "function": {"name": "y", "arguments": "{}"}}]}}]}`,
			want: agent.Turn{Content: `<tool_call>{"name": "x"}</tool_call>`, ToolCalls: []agent.ToolCall{{ID: "s", Name: "y", Arguments: "{}"}}},
		},
		{
			name: "vLLM token_id tokens become token ids",
			body: `{"choices": [{"message": {"content": "ab"}, "logprobs": {"content": [
				{"token": "token_id:15", "logprob": -0.5, "bytes": [97], "top_logprobs": []},
				{"token": "token_id:16", "logprob": -0.25, "bytes": [98], "top_logprobs": []}]}}]}`,
			want: agent.Turn{Content: "ab", CompletionTokenIDs: []int64{15, 16}, Logprobs: []agent.TokenLogprob{
				{Token: "token_id:15", TokenID: id(15), Logprob: -0.5},
				{Token: "token_id:16", TokenID: id(16), Logprob: -0.25},
			}},
		},
		{
			name: "token_ids and prompt_token_ids are kept and matched to logprobs",
			body: `{"prompt_token_ids": [1, 2, 3], "choices": [{"message": {"content": "ab"}, "token_ids": [7, 8], "logprobs": {"content": [
				{"token": "a", "logprob": -1}, {"token": "b", "logprob": -2}]}}]}`,
			want: agent.Turn{Content: "ab", PromptTokenIDs: []int64{1, 2, 3}, CompletionTokenIDs: []int64{7, 8}, Logprobs: []agent.TokenLogprob{
				{Token: "a", TokenID: id(7), Logprob: -1},
				{Token: "b", TokenID: id(8), Logprob: -2},
			}},
		},
		{
			name: "plain logprobs have no token ids",
			body: `{"choices": [{"message": {"content": "a"}, "logprobs": {"content": [{"token": "a", "logprob": -0.1}]}}]}`,
			want: agent.Turn{Content: "a", Logprobs: []agent.TokenLogprob{{Token: "a", Logprob: -0.1}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, tt.body)
			})
			req := hello
			req.Turn = 3
			got, err := newPolicy(t, fast(s.URL)).Next(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Raw) != tt.body || got.Attempts != 1 || got.Latency <= 0 {
				t.Errorf("Raw %q Attempts %d Latency %v", got.Raw, got.Attempts, got.Latency)
			}
			got.Raw, got.Attempts, got.Latency = nil, 0, 0
			if !reflect.DeepEqual(got, tt.want) {
				gj, _ := json.Marshal(got)
				wj, _ := json.Marshal(tt.want)
				t.Errorf("turn\n got %s\nwant %s", gj, wj)
			}
		})
	}
}

func TestRetries(t *testing.T) {
	tests := []struct {
		name       string
		fault      fakepolicy.Fault
		failFirst  int64
		maxRetries int
		attempts   int
		minLatency time.Duration
		wantErr    string // empty: success
		status     int
		exhausted  bool
	}{
		{name: "two 500s then success take three attempts", fault: fakepolicy.Fault{Status: 500}, failFirst: 2, maxRetries: 3, attempts: 3},
		{name: "a 503 is retried", fault: fakepolicy.Fault{Status: 503}, failFirst: 1, maxRetries: 3, attempts: 2},
		{name: "a 429 waits for retry-after-ms", fault: fakepolicy.Fault{Status: 429, RetryAfterMS: 80}, failFirst: 1, maxRetries: 3, attempts: 2, minLatency: 80 * time.Millisecond},
		{name: "a dropped connection is retried", fault: fakepolicy.Fault{Disconnect: true}, failFirst: 2, maxRetries: 3, attempts: 3},
		{
			name: "retries running out give up with the status and the server's text", fault: fakepolicy.Fault{Status: 500, Message: "CUDA out of memory"},
			failFirst: 100, maxRetries: 2, attempts: 3, status: 500, exhausted: true,
			wantErr: `HTTP 500 Internal Server Error: CUDA out of memory (gave up after 3 attempts)`,
		},
		{
			name: "a 400 is not retried", fault: fakepolicy.Fault{Status: 400, Message: "max_tokens is too large"},
			failFirst: 100, maxRetries: 3, attempts: 1, status: 400,
			wantErr: `HTTP 400 Bad Request (not retried): max_tokens is too large`,
		},
		{
			name: "a 404 is not retried", fault: fakepolicy.Fault{Status: 404, Message: "model not found"},
			failFirst: 100, maxRetries: 3, attempts: 1, status: 404, wantErr: "model not found",
		},
		{
			name: "no retries when MaxRetries is negative", fault: fakepolicy.Fault{Status: 502},
			failFirst: 100, maxRetries: -1, attempts: 1, status: 502, exhausted: true, wantErr: "HTTP 502",
		},
		{
			name: "a malformed body is a policy error", fault: fakepolicy.Fault{MalformedJSON: true},
			failFirst: 100, maxRetries: 3, attempts: 1, status: 200, wantErr: "response is not a chat completion",
		},
		{
			name: "a response without choices is a policy error", fault: fakepolicy.Fault{EmptyChoices: true},
			failFirst: 100, maxRetries: 3, attempts: 1, status: 200, wantErr: "response has no choices",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, fakepolicy.Config{Fault: fakepolicy.FailFirst(tt.failFirst, tt.fault)})
			cfg := fast(s.URL())
			cfg.MaxRetries = tt.maxRetries
			turn, err := newPolicy(t, cfg).Next(context.Background(), hello)
			if turn.Attempts != tt.attempts || s.Calls() != int64(tt.attempts) {
				t.Errorf("Attempts %d, server calls %d, want %d", turn.Attempts, s.Calls(), tt.attempts)
			}
			if turn.Latency < tt.minLatency {
				t.Errorf("Latency %v, want at least %v", turn.Latency, tt.minLatency)
			}
			if tt.wantErr == "" {
				if err != nil || turn.Content != "ok" {
					t.Fatalf("Next = %q, %v", turn.Content, err)
				}
				return
			}
			var ce *CallError
			if !errors.Is(err, agent.ErrPolicy) || !errors.As(err, &ce) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want a *CallError wrapping ErrPolicy containing %q", err, tt.wantErr)
			}
			if ce.StatusCode != tt.status || ce.Attempts != tt.attempts || ce.RetriesExhausted != tt.exhausted {
				t.Errorf("CallError %+v", ce)
			}
		})
	}
}

func TestTransportFailures(t *testing.T) {
	t.Run("a call that times out is retried", func(t *testing.T) {
		var calls atomic.Int32
		s := serve(t, func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 1 {
				<-r.Context().Done()
				return
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices": [{"message": {"content": "late"}}]}`)
		})
		cfg := fast(s.URL)
		cfg.Timeout = 50 * time.Millisecond
		turn, err := newPolicy(t, cfg).Next(context.Background(), hello)
		if err != nil || turn.Content != "late" || turn.Attempts != 2 || turn.Latency < 50*time.Millisecond {
			t.Fatalf("Next = %+v, %v", turn, err)
		}
	})
	t.Run("timeouts running out say so", func(t *testing.T) {
		s := serve(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		cfg := fast(s.URL)
		cfg.Timeout, cfg.MaxRetries = 20*time.Millisecond, 1
		turn, err := newPolicy(t, cfg).Next(context.Background(), hello)
		if !errors.Is(err, agent.ErrPolicy) || !strings.Contains(err.Error(), "timed out after 20ms (gave up after 2 attempts)") || turn.Attempts != 2 {
			t.Fatalf("Next = %+v, %v", turn, err)
		}
	})
	t.Run("a refused connection is retried then gives up", func(t *testing.T) {
		s := httptest.NewServer(http.NotFoundHandler())
		base := s.URL
		s.Close()
		turn, err := newPolicy(t, fast(base)).Next(context.Background(), hello)
		var urlErr *url.Error
		if !errors.Is(err, agent.ErrPolicy) || !errors.As(err, &urlErr) || turn.Attempts != 4 {
			t.Fatalf("Next = %+v, %v", turn, err)
		}
		t.Log(err)
	})
	t.Run("an error body that is not JSON is quoted as text", func(t *testing.T) {
		s := serve(t, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "upstream connect error", http.StatusBadGateway)
		})
		cfg := fast(s.URL)
		cfg.MaxRetries = -1
		turn, err := newPolicy(t, cfg).Next(context.Background(), hello)
		if err == nil || !strings.Contains(err.Error(), "HTTP 502 Bad Gateway: upstream connect error") || turn.Raw != nil {
			t.Fatalf("Next = %+v, %v", turn, err)
		}
	})
	t.Run("a request that cannot be built is refused without a call", func(t *testing.T) {
		s := startFake(t, fakepolicy.Config{})
		req := agent.Request{Messages: []agent.Message{{Role: "narrator", Content: "x"}}}
		turn, err := newPolicy(t, fast(s.URL())).Next(context.Background(), req)
		if !errors.Is(err, agent.ErrPolicy) || !strings.Contains(err.Error(), `message 0: role "narrator"`) || s.Calls() != 0 || turn.Attempts != 0 {
			t.Fatalf("Next = %+v, %v", turn, err)
		}
	})
}

func TestCancellation(t *testing.T) {
	tests := []struct {
		name string
		cfg  fakepolicy.Config
		conf func(*Config)
	}{
		{name: "cancelling during a call returns at once", cfg: fakepolicy.Config{Latency: 10 * time.Second}},
		{
			name: "cancelling during a backoff wait returns at once",
			cfg:  fakepolicy.Config{Fault: fakepolicy.FailFirst(100, fakepolicy.Fault{Status: 503})},
			conf: func(c *Config) { c.BackoffBase, c.BackoffMax = 10*time.Second, 10*time.Second },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, tt.cfg)
			cfg := fast(s.URL())
			if tt.conf != nil {
				tt.conf(&cfg)
			}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			began := time.Now()
			turn, err := newPolicy(t, cfg).Next(ctx, hello)
			if elapsed := time.Since(began); elapsed > time.Second {
				t.Fatalf("Next took %v after cancel", elapsed)
			}
			if !errors.Is(err, context.Canceled) || errors.Is(err, agent.ErrPolicy) || turn.Attempts != 1 {
				t.Fatalf("Next = %+v, %v; want context.Canceled and not ErrPolicy", turn, err)
			}
		})
	}
}

func TestEndToEndWithTheFakeServer(t *testing.T) {
	t.Run("Hermes text with vLLM token ids parses into calls and ids", func(t *testing.T) {
		s := startFake(t, fakepolicy.Config{ToolCallsAsText: true, Responder: fakepolicy.BashThenFinish(2)})
		p := newPolicy(t, fast(s.URL()))
		req := agent.Request{
			Turn:     0,
			Messages: []agent.Message{{Role: agent.RoleUser, Content: "go"}},
			Sampling: agent.Sampling{Logprobs: true, Extra: map[string]any{"return_tokens_as_token_ids": true, "return_token_ids": true}},
		}
		for turn := 0; turn < 3; turn++ {
			req.Turn = turn
			got, err := p.Next(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			want := "bash"
			if turn == 2 {
				want = "finish"
			}
			if !got.ToolCallsFromText || len(got.ToolCalls) != 1 || got.ToolCalls[0].Name != want || got.Content != "" {
				t.Fatalf("turn %d: %+v", turn, got)
			}
			if got.ToolCalls[0].ID != callID(turn, 0) {
				t.Fatalf("turn %d: id %q", turn, got.ToolCalls[0].ID)
			}
			if got.Usage == nil || int64(len(got.Logprobs)) != got.Usage.CompletionTokens || len(got.CompletionTokenIDs) != len(got.Logprobs) || len(got.PromptTokenIDs) == 0 {
				t.Fatalf("turn %d: usage %+v, %d logprobs, %d completion ids, %d prompt ids", turn, got.Usage, len(got.Logprobs), len(got.CompletionTokenIDs), len(got.PromptTokenIDs))
			}
			for i, lp := range got.Logprobs {
				if lp.TokenID == nil || *lp.TokenID != got.CompletionTokenIDs[i] {
					t.Fatalf("turn %d token %d: %+v vs %d", turn, i, lp, got.CompletionTokenIDs[i])
				}
			}
			req.Messages = append(req.Messages,
				agent.Message{Role: agent.RoleAssistant, ToolCalls: got.ToolCalls},
				agent.Message{Role: agent.RoleTool, ToolCallID: got.ToolCalls[0].ID, Content: ""})
		}
	})
}

func TestNewRefusesBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{name: "a base URL without a scheme is refused", cfg: Config{BaseURL: "localhost:8000/v1", Model: "m"}, want: "not an http or https URL"},
		{name: "an empty model is refused", cfg: Config{BaseURL: "http://localhost:8000/v1"}, want: "Model is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %v, want %q", err, tt.want)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
	}{
		{name: "seconds are read", header: http.Header{"Retry-After": {"3"}}, want: 3 * time.Second},
		{name: "fractional seconds are read", header: http.Header{"Retry-After": {"0.5"}}, want: 500 * time.Millisecond},
		{name: "an HTTP date is read relative to now", header: http.Header{"Retry-After": {now.Add(7 * time.Second).Format(http.TimeFormat)}}, want: 7 * time.Second},
		{name: "retry-after-ms wins over Retry-After", header: http.Header{"Retry-After": {"3"}, "Retry-After-Ms": {"250"}}, want: 250 * time.Millisecond},
		{name: "garbage is ignored", header: http.Header{"Retry-After": {"soon"}}, want: 0},
		{name: "a date in the past is ignored", header: http.Header{"Retry-After": {now.Add(-time.Hour).Format(http.TimeFormat)}}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryAfter(tt.header, now); got != tt.want {
				t.Fatalf("retryAfter = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	p := newPolicy(t, Config{BaseURL: "http://x", Model: "m", BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second, RetryAfterMax: 5 * time.Second})
	t.Run("waits double and stay within half of their nominal value", func(t *testing.T) {
		for attempt, nominal := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 30: time.Second} {
			for range 50 {
				if d := p.backoff(attempt, 0); d < nominal/2 || d > nominal {
					t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, nominal/2, nominal)
				}
			}
		}
	})
	t.Run("a Retry-After longer than the backoff is honoured up to its cap", func(t *testing.T) {
		if d := p.backoff(1, 3*time.Second); d != 3*time.Second {
			t.Fatalf("backoff = %v", d)
		}
		if d := p.backoff(1, time.Hour); d != 5*time.Second {
			t.Fatalf("backoff = %v", d)
		}
	})
}

// BenchmarkNext measures a whole call against the zero-latency fake server
// (client and server in one process): the policy's own cost per turn is a
// part of it.
func BenchmarkNext(b *testing.B) {
	s, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(1 << 30)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	p, err := New(fast(s.URL()))
	if err != nil {
		b.Fatal(err)
	}
	req := agent.Request{
		Messages: []agent.Message{
			{Role: agent.RoleSystem, Content: strings.Repeat("You are a careful engineer. ", 40)},
			{Role: agent.RoleUser, Content: "The tests in /work fail. Fix the code."},
		},
		Tools: []agent.ToolSchema{{Name: "bash", Description: "Run a shell line.", Parameters: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}`)}},
	}
	b.Run("sequential", func(b *testing.B) {
		for b.Loop() {
			if _, err := p.Next(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := p.Next(context.Background(), req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
