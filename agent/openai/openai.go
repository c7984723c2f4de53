package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/toolparse"
)

// Defaults for the zero fields of Config.
const (
	DefaultTimeout       = 10 * time.Minute
	DefaultMaxRetries    = 5
	DefaultBackoffBase   = 500 * time.Millisecond
	DefaultBackoffMax    = 30 * time.Second
	DefaultRetryAfterMax = time.Minute
)

// Config configures a Policy. Zero durations and counts take the defaults
// above.
type Config struct {
	// BaseURL is the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1;
	// requests go to BaseURL + "/chat/completions".
	BaseURL string
	// Model is the model name sent with every request.
	Model string
	// APIKey is sent as a bearer token; "EMPTY" when empty (what vLLM and
	// SGLang accept when they check no key). rollbox passes $OPENAI_API_KEY.
	APIKey string
	// Timeout bounds each attempt, reading the whole response included.
	Timeout time.Duration
	// MaxRetries is the number of retries after the first attempt; zero
	// means DefaultMaxRetries and a negative value means none.
	MaxRetries int
	// BackoffBase is the wait before the first retry; it doubles each
	// retry up to BackoffMax, and each wait is jittered down by up to half.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// RetryAfterMax caps how long a server's Retry-After can make the
	// policy wait before one retry.
	RetryAfterMax time.Duration
	// HTTPClient, when set, carries the requests; by default a client with
	// a connection pool sized for many concurrent episodes.
	HTTPClient *http.Client
	// TokenizeURL is the tokenizer endpoint of the token mode (NewTokens);
	// by default /tokenize at the root of BaseURL (without its /v1).
	TokenizeURL string
}

// Policy asks an OpenAI-compatible server for assistant turns. It is safe
// for concurrent use.
type Policy struct {
	client        sdk.Client
	httpClient    *http.Client
	baseURL       string
	endpoint      string
	model         string
	timeout       time.Duration
	maxRetries    int
	backoffBase   time.Duration
	backoffMax    time.Duration
	retryAfterMax time.Duration
}

// New returns a Policy for cfg. It makes no request.
//
// # Errors
//
// New fails when BaseURL is not an http or https URL or Model is empty.
func New(cfg Config) (*Policy, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("openai: BaseURL %q is not an http or https URL", cfg.BaseURL)
	}
	if cfg.Model == "" {
		return nil, errors.New("openai: Model is empty")
	}
	p := &Policy{
		baseURL:       strings.TrimRight(cfg.BaseURL, "/"),
		model:         cfg.Model,
		timeout:       orDefault(cfg.Timeout, DefaultTimeout),
		maxRetries:    cfg.MaxRetries,
		backoffBase:   orDefault(cfg.BackoffBase, DefaultBackoffBase),
		backoffMax:    orDefault(cfg.BackoffMax, DefaultBackoffMax),
		retryAfterMax: orDefault(cfg.RetryAfterMax, DefaultRetryAfterMax),
	}
	p.endpoint = p.baseURL + "/chat/completions"
	switch {
	case p.maxRetries == 0:
		p.maxRetries = DefaultMaxRetries
	case p.maxRetries < 0:
		p.maxRetries = 0
	}
	key := cfg.APIKey
	if key == "" {
		key = "EMPTY"
	}
	httpClient := cfg.HTTPClient
	if httpClient == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = 0 // no limit across hosts
		tr.MaxIdleConnsPerHost = 1024
		httpClient = &http.Client{Transport: tr}
	}
	p.httpClient = httpClient
	p.client = sdk.NewClient(
		option.WithBaseURL(p.baseURL+"/"),
		option.WithAPIKey(key),
		option.WithHTTPClient(httpClient),
		option.WithMaxRetries(0), // Next retries, counting attempts
	)
	return p, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// BaseURL is the server's API root as configured, without a trailing slash.
func (p *Policy) BaseURL() string { return p.baseURL }

// Model is the model name sent with every request.
func (p *Policy) Model() string { return p.model }

// Next asks the server for the assistant turn that follows req.Messages.
// The returned Turn has Attempts and Latency (retries and waits included)
// set even when Next fails, and Raw holds the last response body when it
// was JSON.
//
// # Errors
//
// A failed call is a *CallError wrapping agent.ErrPolicy: the last HTTP
// status after retries ran out, a status that is not retried, a response
// that is not a chat completion or has no choices, or a request that
// cannot be built (a message with an unknown role, a tool schema that is
// not JSON). When ctx ends first, Next returns at once with an error
// wrapping ctx's cause (context.Canceled or context.DeadlineExceeded), not
// agent.ErrPolicy.
func (p *Policy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	start := time.Now()
	var turn agent.Turn
	params, err := p.params(req)
	if err != nil {
		return turn, &CallError{Endpoint: p.endpoint, Model: p.model, Message: err.Error()}
	}
	res, err := p.call(ctx, p.endpoint, func(ctx context.Context, opts ...option.RequestOption) error {
		_, err := p.client.Chat.Completions.New(ctx, params, opts...)
		return err
	})
	turn.Attempts, turn.Latency, turn.Raw = res.attempts, time.Since(start), res.raw()
	if err != nil {
		return turn, err
	}
	t, err := decodeResponse(res.body, req.Turn)
	if err != nil {
		return turn, &CallError{Endpoint: p.endpoint, Model: p.model, StatusCode: res.status, Attempts: res.attempts, Message: err.Error()}
	}
	t.Raw, t.Attempts, t.Latency = turn.Raw, turn.Attempts, turn.Latency
	return t, nil
}

// callResult is the last attempt of a call: its status and body, and the
// number of attempts made.
type callResult struct {
	status   int
	body     []byte
	attempts int
}

// raw is the body when it is JSON.
func (r callResult) raw() json.RawMessage {
	if json.Valid(r.body) {
		return json.RawMessage(r.body)
	}
	return nil
}

// call makes one request to endpoint with do, retrying what is worth
// retrying (see Next): do runs the request with the options that capture
// the response. The error is a *CallError, or wraps ctx's cause when ctx
// ended first.
func (p *Policy) call(ctx context.Context, endpoint string, do func(context.Context, ...option.RequestOption) error) (callResult, error) {
	for attempt := 1; ; attempt++ {
		res := p.attempt(ctx, do)
		out := callResult{status: res.status, body: res.body, attempts: attempt}
		if ctx.Err() != nil {
			return out, p.cancelled(ctx, endpoint, attempt)
		}
		if res.fail == nil {
			return out, nil
		}
		fail := res.fail
		fail.Endpoint, fail.Model, fail.Attempts = endpoint, p.model, attempt
		if !res.retryable {
			return out, fail
		}
		if attempt > p.maxRetries {
			fail.RetriesExhausted = true
			return out, fail
		}
		wait := p.backoff(attempt, res.retryAfter)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return out, p.cancelled(ctx, endpoint, attempt)
		}
	}
}

func (p *Policy) cancelled(ctx context.Context, endpoint string, attempts int) error {
	return fmt.Errorf("openai: POST %s stopped after %d attempt(s): %w", endpoint, attempts, context.Cause(ctx))
}

// backoff is the wait before retry number attempt (1 for the first):
// exponential from backoffBase, capped at backoffMax, jittered down by up
// to half; at least the server's Retry-After, capped at retryAfterMax.
func (p *Policy) backoff(attempt int, retryAfter time.Duration) time.Duration {
	d := p.backoffBase
	for i := 1; i < attempt && d < p.backoffMax; i++ {
		d *= 2
	}
	d = min(d, p.backoffMax)
	if half := d / 2; half > 0 {
		d = half + rand.N(half+1)
	}
	return max(d, min(retryAfter, p.retryAfterMax))
}

// attemptResult is the outcome of one HTTP call: a body with fail nil, or
// a failure and whether it is worth retrying.
type attemptResult struct {
	status     int
	body       []byte
	fail       *CallError
	retryable  bool
	retryAfter time.Duration
}

func (p *Policy) attempt(ctx context.Context, do func(context.Context, ...option.RequestOption) error) attemptResult {
	actx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	var (
		body []byte
		resp *http.Response
	)
	err := do(actx,
		option.WithResponseBodyInto(&body),
		option.WithResponseInto(&resp),
	)
	if err == nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		return attemptResult{status: status, body: body}
	}
	if resp != nil && resp.StatusCode >= 400 {
		// The client re-populates the body of an error response.
		errBody, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		status := resp.StatusCode
		return attemptResult{
			status:     status,
			body:       errBody,
			fail:       &CallError{StatusCode: status, Message: serverMessage(errBody)},
			retryable:  status == http.StatusTooManyRequests || status == http.StatusRequestTimeout || status >= 500,
			retryAfter: retryAfter(resp.Header, time.Now()),
		}
	}
	res := attemptResult{fail: &CallError{Err: err, Message: err.Error()}}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		res.fail.Message = urlErr.Err.Error() // the URL is in Error already
	}
	if resp != nil {
		res.status, res.fail.StatusCode = resp.StatusCode, resp.StatusCode
	}
	switch {
	case ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded):
		res.fail.Message = fmt.Sprintf("timed out after %v", p.timeout)
		res.retryable = true
	case isTransportError(err):
		res.retryable = true
	}
	return res
}

// isTransportError reports whether err comes from the connection (dial,
// reset, a response cut short) rather than from building the request.
func isTransportError(err error) bool {
	var urlErr *url.Error
	var netErr net.Error
	return errors.As(err, &urlErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// retryAfter reads how long the server asked to wait: OpenAI's
// retry-after-ms, else Retry-After in seconds or as an HTTP date; zero when
// absent or unreadable.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := h.Get("Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s > 0 {
			return time.Duration(s * float64(time.Second))
		}
		return 0
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// serverMessage is the error text in an error response body: OpenAI's
// error.message, vLLM's message, or the body itself, cut to 512 bytes.
func serverMessage(body []byte) string {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &v) == nil {
		var nested struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(v.Error, &nested) == nil && nested.Message != "":
			return cut(nested.Message)
		case json.Unmarshal(v.Error, &s) == nil && s != "":
			return cut(s)
		case v.Message != "":
			return cut(v.Message)
		case json.Unmarshal(v.Detail, &s) == nil && s != "":
			return cut(s)
		}
	}
	text := strings.TrimSpace(string(body))
	if text == "" {
		return "(empty body)"
	}
	return cut(text)
}

func cut(s string) string {
	const limit = 512
	if len(s) <= limit {
		return s
	}
	s = s[:limit]
	for !utf8.ValidString(s) && len(s) > limit-utf8.UTFMax {
		s = s[:len(s)-1]
	}
	return s + "..."
}

// CallError is a policy call that failed. It wraps agent.ErrPolicy, and
// the transport error when there was one.
type CallError struct {
	// Endpoint is the URL posted to and Model the model asked.
	Endpoint string
	Model    string
	// StatusCode is the last HTTP status received; 0 when no response
	// arrived.
	StatusCode int
	// Attempts counts the calls made; 0 when the request could not be
	// built.
	Attempts int
	// RetriesExhausted is set when the failure was retryable but retries
	// ran out.
	RetriesExhausted bool
	// Message says what went wrong: the server's error text, the transport
	// error, or what is wrong with the response or the request.
	Message string
	// Err is the transport error, if any.
	Err error
}

func (e *CallError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "openai: POST %s (model %q): ", e.Endpoint, e.Model)
	switch {
	case e.Attempts == 0:
		b.WriteString("bad request: ")
	case e.StatusCode >= 400:
		fmt.Fprintf(&b, "HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
		if !e.RetriesExhausted {
			b.WriteString(" (not retried)")
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	switch {
	case e.RetriesExhausted:
		fmt.Fprintf(&b, " (gave up after %d attempts)", e.Attempts)
	case e.Attempts > 1:
		fmt.Fprintf(&b, " (attempt %d)", e.Attempts)
	}
	return b.String()
}

// Unwrap returns agent.ErrPolicy and the transport error, if any.
func (e *CallError) Unwrap() []error {
	if e.Err != nil {
		return []error{agent.ErrPolicy, e.Err}
	}
	return []error{agent.ErrPolicy}
}

// params builds the request body for req.
func (p *Policy) params(req agent.Request) (sdk.ChatCompletionNewParams, error) {
	params := sdk.ChatCompletionNewParams{Model: shared.ChatModel(p.model)}
	for i, m := range req.Messages {
		msg, err := messageParam(m)
		if err != nil {
			return params, fmt.Errorf("message %d: %w", i, err)
		}
		params.Messages = append(params.Messages, msg)
	}
	for i, t := range req.Tools {
		if t.Name == "" {
			return params, fmt.Errorf("tool %d: name is empty", i)
		}
		fn := shared.FunctionDefinitionParam{Name: t.Name}
		if t.Description != "" {
			fn.Description = sdk.String(t.Description)
		}
		if len(t.Parameters) > 0 {
			if !json.Valid(t.Parameters) {
				return params, fmt.Errorf("tool %q: parameters are not JSON", t.Name)
			}
			// Sent byte for byte: a map would reorder the properties.
			fn.SetExtraFields(map[string]any{"parameters": t.Parameters})
		}
		params.Tools = append(params.Tools, sdk.ChatCompletionFunctionTool(fn))
	}
	s := req.Sampling
	if s.Temperature != nil {
		params.Temperature = sdk.Float(*s.Temperature)
	}
	if s.TopP != nil {
		params.TopP = sdk.Float(*s.TopP)
	}
	if s.MaxTokens != nil {
		params.MaxTokens = sdk.Int(*s.MaxTokens)
	}
	if s.Seed != nil {
		params.Seed = sdk.Int(*s.Seed)
	}
	if len(s.Stop) > 0 {
		params.Stop = sdk.ChatCompletionNewParamsStopUnion{OfStringArray: s.Stop}
	}
	if s.Logprobs {
		params.Logprobs = sdk.Bool(true)
		params.TopLogprobs = sdk.Int(0)
	}
	if len(s.Extra) > 0 {
		for k, v := range s.Extra {
			if _, err := json.Marshal(v); err != nil {
				return params, fmt.Errorf("sampling extra %q: %v", k, err)
			}
		}
		params.SetExtraFields(s.Extra)
	}
	return params, nil
}

func messageParam(m agent.Message) (sdk.ChatCompletionMessageParamUnion, error) {
	switch m.Role {
	case agent.RoleSystem:
		msg := &sdk.ChatCompletionSystemMessageParam{}
		msg.Content.OfString = sdk.String(m.Content)
		if m.Name != "" {
			msg.Name = sdk.String(m.Name)
		}
		return sdk.ChatCompletionMessageParamUnion{OfSystem: msg}, nil
	case agent.RoleUser:
		msg := &sdk.ChatCompletionUserMessageParam{}
		msg.Content.OfString = sdk.String(m.Content)
		if m.Name != "" {
			msg.Name = sdk.String(m.Name)
		}
		return sdk.ChatCompletionMessageParamUnion{OfUser: msg}, nil
	case agent.RoleAssistant:
		msg := &sdk.ChatCompletionAssistantMessageParam{}
		// Content may be left out when there are tool calls (the API's
		// rule); templates then see None, as they do for a parsed call.
		if m.Content != "" || len(m.ToolCalls) == 0 {
			msg.Content.OfString = sdk.String(m.Content)
		}
		if m.Name != "" {
			msg.Name = sdk.String(m.Name)
		}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, sdk.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &sdk.ChatCompletionMessageFunctionToolCallParam{
					ID: tc.ID,
					Function: sdk.ChatCompletionMessageFunctionToolCallFunctionParam{
						Name:      tc.Name,
						Arguments: tc.Arguments,
					},
				},
			})
		}
		return sdk.ChatCompletionMessageParamUnion{OfAssistant: msg}, nil
	case agent.RoleTool:
		msg := &sdk.ChatCompletionToolMessageParam{ToolCallID: m.ToolCallID}
		msg.Content.OfString = sdk.String(m.Content)
		if m.Name != "" {
			// Not in OpenAI's schema, but some templates (Llama, Mistral) use it.
			msg.SetExtraFields(map[string]any{"name": m.Name})
		}
		return sdk.ChatCompletionMessageParamUnion{OfTool: msg}, nil
	}
	return sdk.ChatCompletionMessageParamUnion{}, fmt.Errorf("role %q is not one of system, user, assistant, tool", m.Role)
}

// wire types of the response, read with encoding/json rather than the
// client's types so that absent fields stay absent and vLLM's additions
// (token_ids, prompt_token_ids) are seen.
type wireResponse struct {
	Model          string       `json:"model"`
	Choices        []wireChoice `json:"choices"`
	Usage          *agent.Usage `json:"usage"`
	PromptTokenIDs []int64      `json:"prompt_token_ids"`
}

type wireChoice struct {
	Index   int `json:"index"`
	Message struct {
		Content   *string        `json:"content"`
		ToolCalls []wireToolCall `json:"tool_calls"`
	} `json:"message"`
	FinishReason *string `json:"finish_reason"`
	Logprobs     *struct {
		Content []struct {
			Token   string   `json:"token"`
			Logprob *float64 `json:"logprob"`
		} `json:"content"`
	} `json:"logprobs"`
	TokenIDs []int64 `json:"token_ids"`
}

type wireToolCall struct {
	ID       string `json:"id"`
	Function struct {
		Name string `json:"name"`
		// Arguments is a JSON string as the API defines it; some servers
		// send an object, which is kept as its text.
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// decodeResponse turns a chat-completion body into a Turn (Raw, Attempts
// and Latency left to the caller).
func decodeResponse(body []byte, turnIndex int) (agent.Turn, error) {
	var turn agent.Turn
	var resp wireResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		if len(body) == 0 {
			return turn, errors.New("response body is empty")
		}
		return turn, fmt.Errorf("response is not a chat completion: %v", err)
	}
	if len(resp.Choices) == 0 {
		return turn, errors.New("response has no choices")
	}
	choice := resp.Choices[0]
	for _, c := range resp.Choices[1:] {
		if c.Index < choice.Index {
			choice = c
		}
	}
	turn.Model = resp.Model
	turn.Usage = resp.Usage
	if choice.FinishReason != nil {
		turn.FinishReason = *choice.FinishReason
	}
	if choice.Message.Content != nil {
		turn.Content = *choice.Message.Content
	}
	for i, tc := range choice.Message.ToolCalls {
		call := agent.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: argumentsText(tc.Function.Arguments)}
		if call.ID == "" {
			call.ID = callID(turnIndex, i)
		}
		turn.ToolCalls = append(turn.ToolCalls, call)
	}
	if len(turn.ToolCalls) == 0 {
		if content, calls, err := toolparse.Parse(turn.Content); err == nil && len(calls) > 0 {
			turn.Content = content
			turn.ToolCallsFromText = true
			for i, c := range calls {
				turn.ToolCalls = append(turn.ToolCalls, agent.ToolCall{ID: callID(turnIndex, i), Name: c.Name, Arguments: c.Arguments})
			}
		}
	}

	if choice.Logprobs != nil {
		allIDs := len(choice.Logprobs.Content) > 0
		for _, lp := range choice.Logprobs.Content {
			t := agent.TokenLogprob{Token: lp.Token}
			if lp.Logprob != nil {
				t.Logprob = *lp.Logprob
			}
			if rest, ok := strings.CutPrefix(lp.Token, "token_id:"); ok {
				if id, err := strconv.ParseInt(rest, 10, 64); err == nil {
					t.TokenID = &id
				}
			}
			allIDs = allIDs && t.TokenID != nil
			turn.Logprobs = append(turn.Logprobs, t)
		}
		if allIDs && len(choice.TokenIDs) == 0 {
			for _, t := range turn.Logprobs {
				turn.CompletionTokenIDs = append(turn.CompletionTokenIDs, *t.TokenID)
			}
		}
	}
	if len(choice.TokenIDs) > 0 {
		turn.CompletionTokenIDs = choice.TokenIDs
		if len(choice.TokenIDs) == len(turn.Logprobs) {
			for i := range turn.Logprobs {
				if turn.Logprobs[i].TokenID == nil {
					id := choice.TokenIDs[i]
					turn.Logprobs[i].TokenID = &id
				}
			}
		}
	}
	turn.PromptTokenIDs = resp.PromptTokenIDs
	return turn, nil
}

func callID(turn, i int) string { return "call_" + strconv.Itoa(turn) + "_" + strconv.Itoa(i) }

// argumentsText is a tool call's arguments as text: a JSON string's
// contents, any other JSON value's own text, "{}" when absent or null.
func argumentsText(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return "{}"
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	return string(raw)
}
