package fakepolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Config configures a Server. The zero value answers every call at once
// with the assistant message "ok".
type Config struct {
	// Addr is the address to listen on; "127.0.0.1:0" when empty.
	Addr string
	// Model is the model name reported in responses; "fake-model" when
	// empty.
	Model string
	// Latency is added to every call, plus a uniformly random extra in
	// [0, Jitter).
	Latency time.Duration
	Jitter  time.Duration
	// Responder produces the assistant's reply; nil answers "ok".
	Responder Responder
	// Fault, when set, is asked before each call (n counts calls from 1)
	// and may return a failure to send instead of the reply.
	Fault func(n int64, req *Request) Fault
	// ToolCallsAsText sends tool calls as Hermes <tool_call> markup inside
	// the content instead of tool_calls, as a server without a tool parser
	// does.
	ToolCallsAsText bool
	// OmitUsage leaves usage out of responses.
	OmitUsage bool
	// Record keeps every request for [Server.Requests]. It is off by
	// default so that load tests do not hold every prompt.
	Record bool
	// MaxBodyBytes caps a request body; 64 MiB when zero.
	MaxBodyBytes int64
	// NoTokenizer leaves out the token endpoints' tokenizer (/tokenize and
	// /detokenize answer 404), as a server that has none.
	NoTokenizer bool
	// Revision is reported as the model's "revision" in /v1/models;
	// FakeRevision when empty.
	Revision string
}

// Request is a chat-completions request as the server received it.
type Request struct {
	Model string
	// Endpoint is "chat" (chat completions) or "completions" (token mode).
	Endpoint string
	Messages []Message
	// PromptIDs and Prompt are a completions request's prompt as token ids
	// and as the text they decode to: the text the server saw.
	PromptIDs []int64
	Prompt    string
	Tools     []Tool
	// Logprobs, ReturnTokensAsTokenIDs and ReturnTokenIDs are the request's
	// logprobs, return_tokens_as_token_ids and return_token_ids.
	Logprobs               bool
	ReturnTokensAsTokenIDs bool
	ReturnTokenIDs         bool
	// Body is the request body exactly as received.
	Body json.RawMessage
}

// AssistantTurns counts the assistant messages in the request: the index
// of the turn being asked for in a conversation the caller replays whole.
func (r *Request) AssistantTurns() int {
	n := 0
	for _, m := range r.Messages {
		if m.Role == "assistant" {
			n++
		}
	}
	return n
}

// Message is one request message. Content given as an array of text parts
// is joined.
type Message struct {
	Role       string
	Content    string
	ToolCalls  []ToolCall
	ToolCallID string
	Name       string
}

// ToolCall is a function call in a request message or a Reply.
type ToolCall struct {
	// ID is assigned ("call_<n>_<i>") when a Reply leaves it empty.
	ID        string
	Name      string
	Arguments string
}

// Tool is a function tool offered in a request.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
}

// Reply is the assistant message a Responder produces.
type Reply struct {
	Content   string
	ToolCalls []ToolCall
	// FinishReason defaults to "tool_calls" when there are calls and to
	// "stop" otherwise.
	FinishReason string
}

// Responder produces the reply to a request. It is called concurrently.
type Responder func(req *Request) Reply

// Fault is a failure to send instead of a reply. The zero Fault sends the
// reply.
type Fault struct {
	// Status, when non-zero, sends an OpenAI-style JSON error with this
	// HTTP status and Message, and a Retry-After header when RetryAfter is
	// set (e.g. "1", or an HTTP date). RetryAfterMS sets OpenAI's
	// retry-after-ms header.
	Status       int
	Message      string
	RetryAfter   string
	RetryAfterMS int
	// MalformedJSON sends 200 with a truncated JSON body.
	MalformedJSON bool
	// EmptyChoices sends 200 with a well-formed body that has no choices.
	EmptyChoices bool
	// Disconnect closes the connection without answering.
	Disconnect bool
	// EchoWrongPrompt (completions) reports prompt ids and a prompt token
	// count that are not the prompt it was sent, as a server that
	// re-tokenized it would.
	EchoWrongPrompt bool
	// OmitLogprobs (completions) sends no logprobs even when asked.
	OmitLogprobs bool
}

// FailFirst returns a Config.Fault that sends f for the first k calls.
func FailFirst(k int64, f Fault) func(int64, *Request) Fault {
	return func(n int64, _ *Request) Fault {
		if n <= k {
			return f
		}
		return Fault{}
	}
}

// Script returns a Responder that replays replies in order, picking the
// reply by the number of assistant messages already in the conversation
// (so concurrent conversations each get the whole script). Past the end it
// answers "done" with finish_reason "stop".
func Script(replies ...Reply) Responder {
	return func(req *Request) Reply {
		if i := req.AssistantTurns(); i < len(replies) {
			return replies[i]
		}
		return Reply{Content: "done"}
	}
}

// BashThenFinish returns a Responder that calls bash with the command
// "true" n times, one call a turn, then calls finish with the answer
// "done".
func BashThenFinish(n int) Responder {
	return func(req *Request) Reply {
		if req.AssistantTurns() < n {
			return Reply{ToolCalls: []ToolCall{{Name: "bash", Arguments: `{"command":"true"}`}}}
		}
		return Reply{ToolCalls: []ToolCall{{Name: "finish", Arguments: `{"answer":"done"}`}}}
	}
}

// Server is a running fake policy server.
type Server struct {
	cfg   Config
	ln    net.Listener
	srv   *http.Server
	calls atomic.Int64
	ids   atomic.Int64
	// tokenizeCalls counts /tokenize requests.
	tokenizeCalls atomic.Int64

	closeOnce sync.Once
	closeErr  error
	served    chan struct{} // closed when Serve returns

	mu       sync.Mutex
	requests []*Request
}

// Start listens on cfg.Addr and serves until Close.
//
// # Errors
//
// Start fails when it cannot listen on the address.
func Start(cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Model == "" {
		cfg.Model = "fake-model"
	}
	if cfg.Responder == nil {
		cfg.Responder = func(*Request) Reply { return Reply{Content: "ok"} }
	}
	if cfg.Revision == "" {
		cfg.Revision = FakeRevision
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 20
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("fakepolicy: listen on %s: %w", cfg.Addr, err)
	}
	s := &Server{cfg: cfg, ln: ln, served: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	mux.HandleFunc("POST /chat/completions", s.chatCompletions)
	mux.HandleFunc("POST /v1/completions", s.completions)
	if !cfg.NoTokenizer {
		mux.HandleFunc("POST /tokenize", s.tokenize)
		mux.HandleFunc("POST /detokenize", s.detokenize)
	}
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
	}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln) // returns http.ErrServerClosed after Close
	}()
	return s, nil
}

// URL is the server's base URL for an OpenAI client, ending in /v1.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + "/v1" }

// Calls counts the chat-completions and completions requests received,
// failed ones included.
func (s *Server) Calls() int64 { return s.calls.Load() }

// TokenizeCalls counts the /tokenize requests received.
func (s *Server) TokenizeCalls() int64 { return s.tokenizeCalls.Load() }

// Requests returns the requests received so far, in arrival order, when
// Config.Record is set.
func (s *Server) Requests() []*Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Request(nil), s.requests...)
}

// Close stops the server, dropping calls in flight, and waits for it to
// stop. It is idempotent and safe to call concurrently.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.srv.Close()
		<-s.served
	})
	return s.closeErr
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{"id": s.cfg.Model, "object": "model", "owned_by": "fakepolicy",
			"root": "fakepolicy/" + s.cfg.Model, "revision": s.cfg.Revision}},
	})
}

// wire types of the request.

type wireRequest struct {
	Model                  string        `json:"model"`
	Messages               []wireMessage `json:"messages"`
	Tools                  []wireTool    `json:"tools"`
	Stream                 bool          `json:"stream"`
	Logprobs               bool          `json:"logprobs"`
	ReturnTokensAsTokenIDs bool          `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool          `json:"return_token_ids"`
}

type wireMessage struct {
	Role       string         `json:"role"`
	Content    wireContent    `json:"content"`
	ToolCalls  []wireToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	Name       string         `json:"name,omitempty"`
}

// wireContent is a message's content: null, a string, or text parts.
type wireContent string

func (c *wireContent) UnmarshalJSON(b []byte) error {
	switch {
	case string(b) == "null":
		*c = ""
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = wireContent(s)
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return errors.New("content is neither a string nor an array of parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		sb.WriteString(p.Text)
	}
	*c = wireContent(sb.String())
	return nil
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type wireTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// wire types of the response.

type wireResponse struct {
	ID             string       `json:"id"`
	Object         string       `json:"object"`
	Created        int64        `json:"created"`
	Model          string       `json:"model"`
	Choices        []wireChoice `json:"choices"`
	Usage          *wireUsage   `json:"usage,omitempty"`
	PromptTokenIDs []int64      `json:"prompt_token_ids,omitempty"`
}

type wireChoice struct {
	Index        int           `json:"index"`
	Message      wireReply     `json:"message"`
	FinishReason string        `json:"finish_reason"`
	Logprobs     *wireLogprobs `json:"logprobs"`
	TokenIDs     []int64       `json:"token_ids,omitempty"`
}

type wireReply struct {
	Role      string         `json:"role"`
	Content   *string        `json:"content"`
	ToolCalls []wireToolCall `json:"tool_calls,omitempty"`
}

type wireLogprobs struct {
	Content []wireTokenLogprob `json:"content"`
}

type wireTokenLogprob struct {
	Token       string   `json:"token"`
	Logprob     float64  `json:"logprob"`
	Bytes       []int    `json:"bytes"`
	TopLogprobs []string `json:"top_logprobs"`
}

type wireUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	n := s.calls.Add(1)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error(), "")
		return
	}
	var wr wireRequest
	if err := json.Unmarshal(body, &wr); err != nil {
		writeError(w, http.StatusBadRequest, "the request body is not a chat-completions request: "+err.Error(), "")
		return
	}
	if wr.Stream {
		writeError(w, http.StatusBadRequest, "stream is not supported by the fake policy server", "stream")
		return
	}
	if len(wr.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "messages is empty", "messages")
		return
	}
	req := &Request{
		Model:                  wr.Model,
		Endpoint:               "chat",
		Messages:               make([]Message, len(wr.Messages)),
		Logprobs:               wr.Logprobs,
		ReturnTokensAsTokenIDs: wr.ReturnTokensAsTokenIDs,
		ReturnTokenIDs:         wr.ReturnTokenIDs,
		Body:                   body,
	}
	for i, m := range wr.Messages {
		msg := Message{Role: m.Role, Content: string(m.Content), ToolCallID: m.ToolCallID, Name: m.Name}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		req.Messages[i] = msg
	}
	for _, t := range wr.Tools {
		req.Tools = append(req.Tools, Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters})
	}
	if s.cfg.Record {
		s.mu.Lock()
		s.requests = append(s.requests, req)
		s.mu.Unlock()
	}

	if d := s.delay(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}

	var fault Fault
	if s.cfg.Fault != nil {
		fault = s.cfg.Fault(n, req)
	}
	switch {
	case fault.Disconnect:
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler) // HTTP/2 or no hijacker: abort the stream
	case fault.Status != 0:
		if fault.RetryAfter != "" {
			w.Header().Set("Retry-After", fault.RetryAfter)
		}
		if fault.RetryAfterMS > 0 {
			w.Header().Set("Retry-After-Ms", strconv.Itoa(fault.RetryAfterMS))
		}
		msg := fault.Message
		if msg == "" {
			msg = fmt.Sprintf("injected failure %d on call %d", fault.Status, n)
		}
		writeError(w, fault.Status, msg, "")
		return
	case fault.MalformedJSON:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"id": "chatcmpl-fake", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assis`)
		return
	}

	resp := s.respond(n, req, fault.EmptyChoices)
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) delay() time.Duration {
	d := s.cfg.Latency
	if s.cfg.Jitter > 0 {
		d += rand.N(s.cfg.Jitter)
	}
	return d
}

// respond builds the response to call n.
func (s *Server) respond(n int64, req *Request, emptyChoices bool) *wireResponse {
	resp := &wireResponse{
		ID:      "chatcmpl-fake-" + strconv.FormatInt(s.ids.Add(1), 10),
		Object:  "chat.completion",
		Created: time.Now().Unix(),
		Model:   s.cfg.Model,
		Choices: []wireChoice{},
	}
	promptTokens := 0
	for _, m := range req.Messages {
		promptTokens += 3 + countTokens(m.Role) + countTokens(m.Content)
		for _, tc := range m.ToolCalls {
			promptTokens += countTokens(tc.Name) + countTokens(tc.Arguments)
		}
	}
	if emptyChoices {
		if !s.cfg.OmitUsage {
			resp.Usage = &wireUsage{PromptTokens: promptTokens, TotalTokens: promptTokens}
		}
		return resp
	}

	reply := s.cfg.Responder(req)
	finish := reply.FinishReason
	if finish == "" {
		finish = "stop"
		if len(reply.ToolCalls) > 0 {
			finish = "tool_calls"
		}
	}
	// generated is the text a Hermes-style model would have produced: it is
	// what the fake tokenizer counts and what logprobs cover.
	var generated strings.Builder
	generated.WriteString(reply.Content)
	var calls []wireToolCall
	for i, tc := range reply.ToolCalls {
		id := tc.ID
		if id == "" {
			id = fmt.Sprintf("call_%d_%d", n, i)
		}
		var c wireToolCall
		c.ID, c.Type = id, "function"
		c.Function.Name, c.Function.Arguments = tc.Name, tc.Arguments
		calls = append(calls, c)
		name, _ := json.Marshal(tc.Name)
		args := tc.Arguments
		if !json.Valid([]byte(args)) {
			quoted, _ := json.Marshal(args)
			args = string(quoted)
		}
		if generated.Len() > 0 {
			generated.WriteString("\n")
		}
		fmt.Fprintf(&generated, "<tool_call>\n{\"name\": %s, \"arguments\": %s}\n</tool_call>", name, args)
	}
	text := generated.String()

	msg := wireReply{Role: "assistant"}
	if s.cfg.ToolCallsAsText {
		msg.Content = &text
	} else {
		if reply.Content != "" || len(calls) == 0 {
			content := reply.Content
			msg.Content = &content
		}
		msg.ToolCalls = calls
	}
	choice := wireChoice{Message: msg, FinishReason: finish}

	completionTokens := countTokens(text)
	if req.Logprobs {
		lp := &wireLogprobs{Content: make([]wireTokenLogprob, 0, completionTokens)}
		forEachToken(text, func(tok string) {
			id := tokenID(tok)
			t := wireTokenLogprob{Token: tok, Logprob: -float64(id%1000+1) / 1000, TopLogprobs: []string{}}
			if req.ReturnTokensAsTokenIDs {
				t.Token = "token_id:" + strconv.FormatInt(id, 10)
			}
			t.Bytes = make([]int, len(tok))
			for i := 0; i < len(tok); i++ {
				t.Bytes[i] = int(tok[i])
			}
			lp.Content = append(lp.Content, t)
		})
		choice.Logprobs = lp
	}
	if req.ReturnTokenIDs {
		choice.TokenIDs = tokenIDs(text)
		var prompt strings.Builder
		for _, m := range req.Messages {
			prompt.WriteString(m.Role)
			prompt.WriteString(m.Content)
		}
		resp.PromptTokenIDs = tokenIDs(prompt.String())
	}
	resp.Choices = []wireChoice{choice}
	if !s.cfg.OmitUsage {
		resp.Usage = &wireUsage{PromptTokens: promptTokens, CompletionTokens: completionTokens, TotalTokens: promptTokens + completionTokens}
	}
	return resp
}

// forEachToken calls fn with each token of the fake tokenizer: chunks of
// up to four bytes that never split a UTF-8 sequence (an invalid byte is a
// token of its own).
func forEachToken(s string, fn func(string)) {
	for len(s) > 0 {
		end := 0
		for end < len(s) {
			_, size := utf8.DecodeRuneInString(s[end:])
			if end > 0 && end+size > 4 {
				break
			}
			end += size
		}
		fn(s[:end])
		s = s[end:]
	}
}

func countTokens(s string) int {
	n := 0
	forEachToken(s, func(string) { n++ })
	return n
}

func tokenID(tok string) int64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(tok))
	return int64(h.Sum32() % 151643) // Qwen-sized vocabulary
}

func tokenIDs(s string) []int64 {
	ids := []int64{}
	forEachToken(s, func(tok string) { ids = append(ids, tokenID(tok)) })
	return ids
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func writeError(w http.ResponseWriter, status int, message, param string) {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	} else if status == http.StatusTooManyRequests {
		typ = "rate_limit_error"
	}
	e := map[string]any{"message": message, "type": typ, "code": status}
	if param != "" {
		e["param"] = param
	}
	writeJSON(w, status, map[string]any{"error": e})
}
