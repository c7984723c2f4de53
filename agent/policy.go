package agent

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Roles of a Message.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one chat message as an OpenAI-compatible server takes it.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	Name       string     `json:"name,omitempty"`
	// Text is an assistant message's completion text exactly as sampled
	// (token mode): a token-mode policy renders it in place of Content and
	// ToolCalls, so a re-rendered history shows the model its own words.
	Text string `json:"-"`
}

// ToolCall is one function call the model asked for. Arguments is the raw
// JSON text exactly as the model produced it (it may be invalid).
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ToolSchema is an OpenAI function-calling tool definition.
type ToolSchema struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// Sampling holds the sampling parameters passed to the policy server.
// Unset fields are not sent.
type Sampling struct {
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	MaxTokens   *int64   `json:"max_tokens,omitempty"`
	Seed        *int64   `json:"seed,omitempty"`
	Stop        []string `json:"stop,omitempty"`
	// Logprobs asks for per-token log probabilities (and token ids, where
	// the server can return them).
	Logprobs bool `json:"logprobs,omitempty"`
	// Extra is merged into the request body as is (vLLM/SGLang options such
	// as top_k, repetition_penalty, return_tokens_as_token_ids).
	Extra map[string]any `json:"extra,omitempty"`
}

// Request is what the loop asks a policy.
type Request struct {
	// EpisodeID and TaskID let scripted and replay policies find their turns.
	EpisodeID string
	TaskID    string
	// Turn is the 0-based index of the model turn being asked for.
	Turn     int
	Messages []Message
	Tools    []ToolSchema
	Sampling Sampling
	// Tokens is set in token mode: the token sequence the turn continues.
	Tokens *TokenContext
}

// TokenContext is what a token-mode policy continues (Request.Tokens).
type TokenContext struct {
	// Prefix is the current segment's ids: the previous turn's prompt and
	// completion. Nil starts a new segment: the policy has the server
	// render the whole of Messages.
	Prefix []int64
	// New is the index in Messages of the first message Prefix does not
	// hold (the tool results and user messages since the last turn).
	New int
}

// TurnTokens are a token-mode turn's ids as sent and as the server
// answered (Turn.Tokens).
type TurnTokens struct {
	// Prompt is the prompt sent, as ids. It extends Request.Tokens.Prefix
	// unless the policy had to render the whole conversation again, which
	// SegmentReason then says (trajectory.SegmentTemplate).
	Prompt        []int64
	SegmentReason string
	// Completion are the sampled ids.
	Completion []int64
	// Logprobs has one entry per Completion id; nil when the server sent
	// none.
	Logprobs []float64
	// EchoedPrompt and LogprobIDs are what the server said of the prompt and
	// of the sampled tokens, when it said anything (nil otherwise): the
	// session checks them against Prompt and Completion.
	EchoedPrompt []int64
	LogprobIDs   []int64
}

// Usage is the token accounting a server reports.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// TokenLogprob is one sampled token.
type TokenLogprob struct {
	Token   string  `json:"token"`
	TokenID *int64  `json:"token_id,omitempty"`
	Logprob float64 `json:"logprob"`
}

// Turn is one assistant turn as the policy returned it.
type Turn struct {
	Content string `json:"content"`
	// ToolCalls are the parsed calls: from the server's tool_calls, or,
	// when the server did not parse them, from tool-call markup in Content
	// (Hermes/Qwen <tool_call>{...}</tool_call>), in which case
	// ToolCallsFromText is set.
	ToolCalls         []ToolCall `json:"tool_calls,omitempty"`
	ToolCallsFromText bool       `json:"tool_calls_from_text,omitempty"`
	FinishReason      string     `json:"finish_reason,omitempty"`
	Model             string     `json:"model,omitempty"`
	// Usage is nil when the server reported none.
	Usage    *Usage         `json:"usage,omitempty"`
	Logprobs []TokenLogprob `json:"logprobs,omitempty"`
	// PromptTokenIDs and CompletionTokenIDs are the token ids of the prompt
	// as the server rendered it and of the sampled completion, when the
	// server returned them (vLLM's return_token_ids, or completion tokens
	// sent as "token_id:N" logprobs); nil otherwise. Trainers use them to
	// avoid re-tokenizing.
	PromptTokenIDs     []int64 `json:"prompt_token_ids,omitempty"`
	CompletionTokenIDs []int64 `json:"completion_token_ids,omitempty"`
	// Raw is the server's response body (or the scripted line), kept for the
	// trajectory.
	Raw json.RawMessage `json:"raw,omitempty"`
	// Latency is the wall time of the call, retries included.
	Latency time.Duration `json:"latency"`
	// Attempts counts calls made, retries included.
	Attempts int `json:"attempts,omitempty"`
	// Tokens are the ids of a token-mode turn; nil in chat mode.
	Tokens *TurnTokens `json:"-"`
	// Text is the completion text as sampled (token mode).
	Text string `json:"-"`
	// PolicyVersion is the trainer's policy version current when the call
	// was sent (set by the runtime).
	PolicyVersion string `json:"-"`
}

// Policy produces the next assistant turn. Implementations retry what is
// worth retrying themselves; an error they return ends the episode with
// policy_error.
type Policy interface {
	Next(ctx context.Context, req Request) (Turn, error)
}

// ErrPolicy marks a failure of the policy (server errors after retries,
// malformed responses, an exhausted script); the episode ends policy_error.
var ErrPolicy = errors.New("policy error")
