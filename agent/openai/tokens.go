package openai

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/openai/openai-go/v3/option"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/toolparse"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// TokenPolicy is the token-in/token-out mode for vLLM and SGLang: the
// server's own tokenizer endpoint (/tokenize with messages and
// add_generation_prompt) renders the first prompt of a segment, each turn
// sends the prompt as token ids to /v1/completions and keeps the sampled
// ids and their logprobs, and a later turn's prompt is the previous prompt,
// its completion, the template's closing ids the completion lacks, and the
// server's rendering of only the new messages (tool results, user
// messages): every prompt extends the last, so a trainer gets exactly the
// tokens the model saw and sampled. Rollbox never renders or tokenizes
// text itself. Tool calls are parsed from the completion text
// (agent/toolparse). It is safe for concurrent use.
type TokenPolicy struct {
	p           *Policy
	tokenizeURL string
	completions string
	info        trajectory.Tokenizer
	// base is the server's rendering of a fixed conversation that ends with
	// an assistant message; the ids of new messages are what rendering
	// base + messages adds to it.
	base []int64
}

// deltaBase is the fixed conversation rendered before the new messages of
// a turn to find their ids with the template's delimiters.
var deltaBase = []agent.Message{{Role: agent.RoleUser, Content: "."}, {Role: agent.RoleAssistant, Content: "."}}

// NewTokens returns a token-mode policy for cfg and checks the server can
// serve it: its tokenizer endpoint (Config.TokenizeURL; by default /tokenize
// at the root of BaseURL, without its /v1) must render chat messages, and
// its chat template must put an assistant message's content right after
// the generation prompt. It records the tokenizer's identity
// (TokenPolicy.Tokenizer).
//
// # Errors
//
// Errors name the endpoint and what was wrong: no tokenizer endpoint (404),
// a failed call, or a template token mode cannot continue. They wrap
// agent.ErrPolicy.
func NewTokens(ctx context.Context, cfg Config) (*TokenPolicy, error) {
	p, err := New(cfg)
	if err != nil {
		return nil, err
	}
	t := &TokenPolicy{p: p, tokenizeURL: cfg.TokenizeURL, completions: p.baseURL + "/completions"}
	if t.tokenizeURL == "" {
		t.tokenizeURL = strings.TrimSuffix(p.baseURL, "/v1") + "/tokenize"
	}
	if err := t.probe(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

// Tokenizer is the server's tokenizer identity, for the record.
func (t *TokenPolicy) Tokenizer() trajectory.Tokenizer { return t.info }

// BaseURL is the server's API root.
func (t *TokenPolicy) BaseURL() string { return t.p.baseURL }

// Model is the model name sent with every request.
func (t *TokenPolicy) Model() string { return t.p.model }

// probe renders the probe conversations: the generation prompt after a
// user message, the same with an assistant reply, and the reply's text on
// its own. The reply's ids must follow the generation prompt; what follows
// them is the template's closing of an assistant message.
func (t *TokenPolicy) probe(ctx context.Context) error {
	user := deltaBase[:1]
	withPrompt, err := t.render(ctx, user, nil, true)
	if err != nil {
		return t.admission(err)
	}
	base, err := t.render(ctx, deltaBase, nil, false)
	if err != nil {
		return t.admission(err)
	}
	text, err := t.tokenize(ctx, map[string]any{"model": t.p.model, "prompt": deltaBase[1].Content, "add_special_tokens": false})
	if err != nil {
		return t.admission(err)
	}
	if !hasPrefix(base, withPrompt) || !hasPrefix(base[len(withPrompt):], text) {
		return &CallError{Endpoint: t.tokenizeURL, Model: t.p.model, Attempts: 1, Message: fmt.Sprintf(
			"the chat template does not render an assistant message as the generation prompt followed by its text "+
				"(generation prompt %v, conversation %v, text %v): token mode cannot continue a completion", withPrompt, base, text)}
	}
	t.base = base
	h := sha256.New()
	for _, ids := range [][]int64{withPrompt, base, text} {
		b, _ := json.Marshal(ids)
		h.Write(append(b, '\n'))
	}
	t.info = trajectory.Tokenizer{Model: t.p.model, Fingerprint: hex.EncodeToString(h.Sum(nil)), Endpoint: t.tokenizeURL,
		CloseIDs: append([]int64{}, base[len(withPrompt)+len(text):]...), Revision: t.revision(ctx)}
	return nil
}

func (t *TokenPolicy) admission(err error) error {
	var ce *CallError
	if errors.As(err, &ce) && ce.StatusCode == http.StatusNotFound {
		ce.Message = "the server has no tokenizer endpoint (404): token mode needs vLLM's or SGLang's /tokenize " +
			"(set the tokenizer URL if the server serves it elsewhere)"
	}
	return fmt.Errorf("token mode: %w", err)
}

// revision is what the server reports of the model: its model card's
// revision or root, and the server's version, when it reports them.
func (t *TokenPolicy) revision(ctx context.Context) string {
	get := func(url string, v any) bool {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		resp, err := t.p.httpClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(v) == nil
	}
	var parts []string
	var models struct {
		Data []struct {
			ID       string `json:"id"`
			Root     string `json:"root"`
			Revision string `json:"revision"`
		} `json:"data"`
	}
	if get(t.p.baseURL+"/models", &models) {
		for _, m := range models.Data {
			if m.ID != t.p.model {
				continue
			}
			switch {
			case m.Revision != "":
				parts = append(parts, m.Revision)
			case m.Root != "" && m.Root != m.ID:
				parts = append(parts, m.Root)
			}
		}
	}
	var version struct {
		Version string `json:"version"`
	}
	if get(strings.TrimSuffix(t.p.baseURL, "/v1")+"/version", &version) && version.Version != "" {
		parts = append(parts, "server "+version.Version)
	}
	return strings.Join(parts, "; ")
}

// wireMessage is a message as the tokenizer endpoint takes it: an
// assistant message sampled in token mode is its text as sampled.
type wireMessage struct {
	Role       string         `json:"role"`
	Content    string         `json:"content"`
	ToolCalls  []wireCallJSON `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	Name       string         `json:"name,omitempty"`
}

type wireCallJSON struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func wireMessages(msgs []agent.Message) []wireMessage {
	out := make([]wireMessage, len(msgs))
	for i, m := range msgs {
		w := wireMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Name: m.Name}
		if m.Role == agent.RoleAssistant && m.Text != "" {
			w.Content = m.Text
		} else {
			for _, c := range m.ToolCalls {
				var wc wireCallJSON
				wc.ID, wc.Type, wc.Function.Name, wc.Function.Arguments = c.ID, "function", c.Name, c.Arguments
				w.ToolCalls = append(w.ToolCalls, wc)
			}
		}
		out[i] = w
	}
	return out
}

// render has the server's chat template render msgs as ids.
func (t *TokenPolicy) render(ctx context.Context, msgs []agent.Message, tools []agent.ToolSchema, addGenerationPrompt bool) ([]int64, error) {
	body := map[string]any{"model": t.p.model, "messages": wireMessages(msgs), "add_generation_prompt": addGenerationPrompt, "add_special_tokens": false}
	if len(tools) > 0 {
		var ts []map[string]any
		for _, s := range tools {
			fn := map[string]any{"name": s.Name, "description": s.Description}
			if len(s.Parameters) > 0 {
				fn["parameters"] = s.Parameters
			}
			ts = append(ts, map[string]any{"type": "function", "function": fn})
		}
		body["tools"] = ts
	}
	return t.tokenize(ctx, body)
}

// tokenize posts body to the tokenizer endpoint and returns its ids.
func (t *TokenPolicy) tokenize(ctx context.Context, body map[string]any) ([]int64, error) {
	res, err := t.p.call(ctx, t.tokenizeURL, func(ctx context.Context, opts ...option.RequestOption) error {
		i := strings.LastIndex(t.tokenizeURL, "/")
		opts = append(opts, option.WithBaseURL(t.tokenizeURL[:i+1]))
		return t.p.client.Post(ctx, t.tokenizeURL[i+1:], body, nil, opts...)
	})
	if err != nil {
		return nil, err
	}
	var out struct {
		Tokens []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(res.body, &out); err != nil || out.Tokens == nil {
		return nil, &CallError{Endpoint: t.tokenizeURL, Model: t.p.model, StatusCode: res.status, Attempts: res.attempts,
			Message: fmt.Sprintf("the answer has no token ids: %s", cut(string(res.body)))}
	}
	return out.Tokens, nil
}

// prompt is the turn's prompt: the whole conversation rendered when a
// segment starts, else the segment's ids + the closing ids its last
// completion lacks + the new messages' ids. reason is set when a
// continuation had to render the whole conversation instead.
func (t *TokenPolicy) prompt(ctx context.Context, req agent.Request) (ids []int64, reason string, err error) {
	tc := req.Tokens
	if tc == nil || tc.Prefix == nil {
		ids, err = t.render(ctx, req.Messages, req.Tools, true)
		return ids, "", err
	}
	if tc.New < 0 || tc.New > len(req.Messages) {
		return nil, "", fmt.Errorf("token context: new messages from %d of %d", tc.New, len(req.Messages))
	}
	msgs := append(append([]agent.Message{}, deltaBase...), req.Messages[tc.New:]...)
	rendered, err := t.render(ctx, msgs, nil, true)
	if err != nil {
		return nil, "", err
	}
	if !hasPrefix(rendered, t.base) {
		// The template renders the history differently once new messages
		// follow it: the sequence cannot be extended; start again.
		ids, err = t.render(ctx, req.Messages, req.Tools, true)
		return ids, trajectory.SegmentTemplate, err
	}
	close := t.info.CloseIDs
	k := overlap(tc.Prefix, close)
	ids = make([]int64, 0, len(tc.Prefix)+len(close)-k+len(rendered)-len(t.base))
	ids = append(append(append(ids, tc.Prefix...), close[k:]...), rendered[len(t.base):]...)
	return ids, "", nil
}

// overlap is the longest k such that ids ends with close[:k] (the closing
// ids the model already sampled, such as its end-of-turn token).
func overlap(ids, close []int64) int {
	for k := min(len(close), len(ids)); k > 0; k-- {
		if equalIDs(ids[len(ids)-k:], close[:k]) {
			return k
		}
	}
	return 0
}

// Next renders the turn's prompt as ids (see TokenPolicy) and samples its
// completion. The Turn's Tokens hold the prompt sent, the sampled ids and
// logprobs, and what the server said of them, for the session to check;
// Raw is the response without its id and logprob arrays (they are in the
// record's own fields).
//
// # Errors
//
// As Policy.Next; a failure of the tokenizer endpoint is a *CallError
// naming it.
func (t *TokenPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	start := time.Now()
	var turn agent.Turn
	prompt, reason, err := t.prompt(ctx, req)
	if err != nil {
		turn.Latency = time.Since(start)
		return turn, err
	}
	body := t.completionBody(req, prompt)
	res, err := t.p.call(ctx, t.completions, func(ctx context.Context, opts ...option.RequestOption) error {
		return t.p.client.Post(ctx, "completions", body, nil, opts...)
	})
	turn.Attempts, turn.Latency = res.attempts, time.Since(start)
	if err != nil {
		turn.Raw = res.raw()
		return turn, err
	}
	out, err := decodeCompletion(res.body, prompt, req.Turn)
	if err != nil {
		turn.Raw = res.raw()
		return turn, &CallError{Endpoint: t.completions, Model: t.p.model, StatusCode: res.status, Attempts: res.attempts, Message: err.Error()}
	}
	out.Attempts, out.Latency = turn.Attempts, turn.Latency
	out.Tokens.Prompt, out.Tokens.SegmentReason = prompt, reason
	return out, nil
}

func (t *TokenPolicy) completionBody(req agent.Request, prompt []int64) map[string]any {
	s := req.Sampling
	body := map[string]any{"model": t.p.model, "prompt": prompt, "logprobs": 0,
		"return_tokens_as_token_ids": true, "return_token_ids": true}
	if s.Temperature != nil {
		body["temperature"] = *s.Temperature
	}
	if s.TopP != nil {
		body["top_p"] = *s.TopP
	}
	if s.MaxTokens != nil {
		body["max_tokens"] = *s.MaxTokens
	}
	if s.Seed != nil {
		body["seed"] = *s.Seed
	}
	if len(s.Stop) > 0 {
		body["stop"] = s.Stop
	}
	for k, v := range s.Extra {
		body[k] = v
	}
	return body
}

// decodeCompletion reads a /v1/completions answer (vLLM's and SGLang's
// fields) into a Turn with Tokens set. The server's echo of the prompt is
// compared with prompt as JSON text and decoded only when it differs (it
// is as long as the context: decoding it every turn would cost more than
// the rest of the turn). Raw is the answer without its per-token arrays
// (prompt and completion ids, logprobs): the record keeps them once, in its
// own fields.
func decodeCompletion(body []byte, prompt []int64, turnIndex int) (agent.Turn, error) {
	var turn agent.Turn
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		if len(body) == 0 {
			return turn, errors.New("response body is empty")
		}
		return turn, fmt.Errorf("response is not a completion: %v", err)
	}
	var choices []map[string]json.RawMessage
	if err := json.Unmarshal(doc["choices"], &choices); err != nil || len(choices) == 0 {
		return turn, errors.New("response has no choices")
	}
	c := choices[0]
	var choice struct {
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Logprobs     *struct {
			Tokens        []string   `json:"tokens"`
			TokenLogprobs []*float64 `json:"token_logprobs"`
		} `json:"logprobs"`
		TokenIDs []int64 `json:"token_ids"`
	}
	small := map[string]json.RawMessage{}
	for _, k := range []string{"text", "finish_reason", "logprobs", "token_ids"} {
		if v, ok := c[k]; ok {
			small[k] = v
		}
	}
	b, _ := json.Marshal(small)
	if err := json.Unmarshal(b, &choice); err != nil {
		return turn, fmt.Errorf("response choice: %v", err)
	}
	if choice.Text == nil {
		return turn, errors.New("response choice has no text")
	}
	var top struct {
		Model string       `json:"model"`
		Usage *agent.Usage `json:"usage"`
	}
	if v, ok := doc["model"]; ok {
		json.Unmarshal(v, &top.Model)
	}
	if v, ok := doc["usage"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &top.Usage); err != nil {
			return turn, fmt.Errorf("response usage: %v", err)
		}
	}
	tt := &agent.TurnTokens{Completion: choice.TokenIDs}
	echo, ok := c["prompt_token_ids"]
	if !ok {
		echo, ok = doc["prompt_token_ids"]
	}
	if ok && string(echo) != "null" {
		ids, err := echoedPrompt(echo, prompt)
		if err != nil {
			return turn, fmt.Errorf("response prompt_token_ids: %v", err)
		}
		tt.EchoedPrompt = ids
	}
	if lp := choice.Logprobs; lp != nil && len(lp.TokenLogprobs) > 0 {
		tt.Logprobs = make([]float64, len(lp.TokenLogprobs))
		for i, v := range lp.TokenLogprobs {
			if v == nil {
				tt.Logprobs = nil // a hole: the record says logprobs are absent
				break
			}
			tt.Logprobs[i] = *v
		}
		var ids []int64
		for _, tok := range lp.Tokens {
			rest, ok := strings.CutPrefix(tok, "token_id:")
			id, err := strconv.ParseInt(rest, 10, 64)
			if !ok || err != nil {
				ids = nil
				break
			}
			ids = append(ids, id)
		}
		if len(ids) == len(lp.Tokens) && ids != nil {
			tt.LogprobIDs = ids
			if tt.Completion == nil {
				tt.Completion = ids
			}
		}
	}
	turn.Tokens, turn.Model, turn.Usage, turn.Text = tt, top.Model, top.Usage, *choice.Text
	if choice.FinishReason != nil {
		turn.FinishReason = *choice.FinishReason
	}
	turn.Content = turn.Text
	if content, calls, err := toolparse.Parse(turn.Text); err == nil && len(calls) > 0 {
		turn.Content, turn.ToolCallsFromText = content, true
		for i, call := range calls {
			turn.ToolCalls = append(turn.ToolCalls, agent.ToolCall{ID: callID(turnIndex, i), Name: call.Name, Arguments: call.Arguments})
		}
	}
	delete(doc, "prompt_token_ids")
	for _, c := range choices {
		delete(c, "token_ids")
		delete(c, "prompt_token_ids")
		delete(c, "logprobs")
	}
	doc["choices"], _ = json.Marshal(choices)
	turn.Raw, _ = json.Marshal(doc)
	return turn, nil
}

// echoedPrompt reads the server's echo of the prompt: prompt itself when
// the JSON text is the same, the decoded ids otherwise.
func echoedPrompt(raw json.RawMessage, prompt []int64) ([]int64, error) {
	want, _ := json.Marshal(prompt)
	if bytes.Equal(raw, want) {
		return prompt, nil
	}
	var compact bytes.Buffer
	if json.Compact(&compact, raw) == nil && bytes.Equal(compact.Bytes(), want) {
		return prompt, nil
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, err
	}
	return ids, nil
}

func hasPrefix(ids, prefix []int64) bool {
	return len(ids) >= len(prefix) && equalIDs(ids[:len(prefix)], prefix)
}

func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
