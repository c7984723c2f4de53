package fakepolicy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func post(t *testing.T, client *http.Client, url, body string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := client.Post(url+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

const hello = `{"model": "m", "messages": [{"role": "user", "content": "hi"}]}`

type response struct {
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
		Logprobs     *struct {
			Content []struct {
				Token   string  `json:"token"`
				Logprob float64 `json:"logprob"`
			} `json:"content"`
		} `json:"logprobs"`
		TokenIDs []int64 `json:"token_ids"`
	} `json:"choices"`
	Usage          *wireUsage `json:"usage"`
	PromptTokenIDs []int64    `json:"prompt_token_ids"`
}

func decode(t *testing.T, b []byte) response {
	t.Helper()
	var r response
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("response %s: %v", b, err)
	}
	return r
}

func TestReplies(t *testing.T) {
	t.Run("the default responder answers ok with usage", func(t *testing.T) {
		s := start(t, Config{})
		status, _, b := post(t, http.DefaultClient, s.URL(), hello)
		r := decode(t, b)
		if status != 200 || len(r.Choices) != 1 || *r.Choices[0].Message.Content != "ok" || r.Choices[0].FinishReason != "stop" {
			t.Fatalf("got %d %s", status, b)
		}
		if r.Usage == nil || r.Usage.CompletionTokens != 1 || r.Usage.TotalTokens != r.Usage.PromptTokens+1 {
			t.Fatalf("usage %+v", r.Usage)
		}
		if r.Model != "fake-model" || s.Calls() != 1 {
			t.Fatalf("model %q calls %d", r.Model, s.Calls())
		}
	})
	t.Run("BashThenFinish calls bash until the conversation has n assistant turns", func(t *testing.T) {
		s := start(t, Config{Responder: BashThenFinish(1)})
		_, _, b := post(t, http.DefaultClient, s.URL(), hello)
		r := decode(t, b)
		c := r.Choices[0]
		if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "bash" ||
			c.Message.ToolCalls[0].Function.Arguments != `{"command":"true"}` || c.Message.ToolCalls[0].ID == "" || c.Message.Content != nil {
			t.Fatalf("first turn %s", b)
		}
		second := `{"model": "m", "messages": [{"role": "user", "content": "hi"},
			{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
			{"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]}]}`
		_, _, b = post(t, http.DefaultClient, s.URL(), second)
		if c := decode(t, b).Choices[0]; c.Message.ToolCalls[0].Function.Name != "finish" {
			t.Fatalf("second turn %s", b)
		}
	})
	t.Run("tool calls come back as Hermes markup when asked to", func(t *testing.T) {
		s := start(t, Config{ToolCallsAsText: true, Responder: Script(Reply{Content: "Listing.", ToolCalls: []ToolCall{{Name: "bash", Arguments: `{"command":"ls"}`}}})})
		_, _, b := post(t, http.DefaultClient, s.URL(), hello)
		c := decode(t, b).Choices[0]
		want := "Listing.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\":\"ls\"}}\n</tool_call>"
		if len(c.Message.ToolCalls) != 0 || *c.Message.Content != want {
			t.Fatalf("content %q", *c.Message.Content)
		}
	})
	t.Run("logprobs carry vLLM token ids when asked for", func(t *testing.T) {
		s := start(t, Config{Responder: Script(Reply{Content: "héllo world"})})
		_, _, b := post(t, http.DefaultClient, s.URL(), `{"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
			"return_tokens_as_token_ids": true, "return_token_ids": true}`)
		r := decode(t, b)
		c := r.Choices[0]
		if c.Logprobs == nil || len(c.Logprobs.Content) != r.Usage.CompletionTokens || len(c.TokenIDs) != r.Usage.CompletionTokens {
			t.Fatalf("logprobs %s", b)
		}
		for i, lp := range c.Logprobs.Content {
			if !strings.HasPrefix(lp.Token, "token_id:") || lp.Logprob >= 0 {
				t.Fatalf("token %d: %+v", i, lp)
			}
		}
		if len(r.PromptTokenIDs) == 0 {
			t.Fatalf("no prompt token ids in %s", b)
		}
	})
	t.Run("usage is left out when configured", func(t *testing.T) {
		s := start(t, Config{OmitUsage: true})
		_, _, b := post(t, http.DefaultClient, s.URL(), hello)
		if decode(t, b).Usage != nil {
			t.Fatalf("usage in %s", b)
		}
	})
	t.Run("requests are recorded as received", func(t *testing.T) {
		s := start(t, Config{Record: true})
		body := `{"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
			"tools": [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": {"type": "object"}}}], "top_k": 5}`
		post(t, http.DefaultClient, s.URL(), body)
		reqs := s.Requests()
		if len(reqs) != 1 || reqs[0].Model != "m" || len(reqs[0].Messages) != 2 || reqs[0].Messages[0].Content != "be brief" ||
			len(reqs[0].Tools) != 1 || reqs[0].Tools[0].Name != "bash" || string(reqs[0].Body) != body {
			t.Fatalf("recorded %+v", reqs)
		}
	})
	t.Run("a malformed request is a 400 with an OpenAI error", func(t *testing.T) {
		s := start(t, Config{})
		status, _, b := post(t, http.DefaultClient, s.URL(), `{"messages": "nope"}`)
		if status != 400 || !bytes.Contains(b, []byte(`"error"`)) {
			t.Fatalf("%d %s", status, b)
		}
	})
}

func TestFaults(t *testing.T) {
	tests := []struct {
		name   string
		fault  Fault
		status int
		check  func(t *testing.T, h http.Header, b []byte)
	}{
		{
			name:   "a 429 carries Retry-After headers",
			fault:  Fault{Status: 429, RetryAfter: "2", RetryAfterMS: 20, Message: "slow down"},
			status: 429,
			check: func(t *testing.T, h http.Header, b []byte) {
				if h.Get("Retry-After") != "2" || h.Get("Retry-After-Ms") != "20" || !bytes.Contains(b, []byte("slow down")) {
					t.Fatalf("%v %s", h, b)
				}
			},
		},
		{
			name:   "malformed JSON is a 200 with a truncated body",
			fault:  Fault{MalformedJSON: true},
			status: 200,
			check: func(t *testing.T, _ http.Header, b []byte) {
				if json.Valid(b) {
					t.Fatalf("valid JSON %s", b)
				}
			},
		},
		{
			name:   "empty choices is a well-formed body without choices",
			fault:  Fault{EmptyChoices: true},
			status: 200,
			check: func(t *testing.T, _ http.Header, b []byte) {
				if r := decode(t, b); len(r.Choices) != 0 {
					t.Fatalf("choices in %s", b)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := start(t, Config{Fault: FailFirst(1, tt.fault)})
			status, h, b := post(t, http.DefaultClient, s.URL(), hello)
			if status != tt.status {
				t.Fatalf("status %d, want %d: %s", status, tt.status, b)
			}
			tt.check(t, h, b)
			if status, _, _ := post(t, http.DefaultClient, s.URL(), hello); status != 200 || s.Calls() != 2 {
				t.Fatalf("second call: status %d, calls %d", status, s.Calls())
			}
		})
	}
	t.Run("a disconnect closes the connection without an answer", func(t *testing.T) {
		s := start(t, Config{Fault: FailFirst(1, Fault{Disconnect: true})})
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		if _, err := client.Post(s.URL()+"/chat/completions", "application/json", strings.NewReader(hello)); err == nil {
			t.Fatal("no error from a dropped connection")
		}
	})
}

func TestManyConcurrentCalls(t *testing.T) {
	const calls = 2000
	const latency = 100 * time.Millisecond
	s := start(t, Config{Latency: latency, Jitter: 10 * time.Millisecond, Responder: BashThenFinish(3)})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: calls}}
	defer client.CloseIdleConnections()
	began := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for range calls {
		wg.Go(func() {
			resp, err := client.Post(s.URL()+"/chat/completions", "application/json", strings.NewReader(hello))
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	elapsed := time.Since(began)
	if s.Calls() != calls {
		t.Fatalf("calls %d", s.Calls())
	}
	// All calls wait concurrently: far less than calls × latency (200 s),
	// with room for the race detector.
	if elapsed > calls*latency/20 {
		t.Fatalf("%d calls of %v took %v", calls, latency, elapsed)
	}
	t.Logf("%d concurrent calls of %v latency in %v", calls, latency, elapsed)
}

func TestCloseIsIdempotent(t *testing.T) {
	s, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _ = s.Close() })
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
