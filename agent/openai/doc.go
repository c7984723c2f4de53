// Package openai is an agent.Policy that asks any OpenAI-compatible
// chat-completions server (vLLM, SGLang, OpenAI) for the next assistant
// turn, through the official github.com/openai/openai-go/v3 client.
//
// It sends the conversation, the tools' function schemas (their parameter
// schemas byte for byte, so the chat template renders them in the order
// they were written) and the sampling parameters, with Sampling.Extra
// merged into the body for server-specific options (top_k,
// return_tokens_as_token_ids, chat_template_kwargs, ...). It keeps what a
// trainer needs from the answer: the content, the tool calls (parallel
// ones too, or calls recovered from Hermes/Qwen markup in the content when
// the server ran without a tool parser, see agent/toolparse), the finish
// reason, usage, per-token logprobs, token ids in vLLM's forms, and the raw
// response body.
//
// The policy does its own retrying (the client's is turned off) so it can
// count attempts and time them: 429 (honouring Retry-After and
// retry-after-ms), 408, 5xx, per-call timeouts and connection failures are
// retried with exponential backoff and jitter; other 4xx, malformed
// responses and responses without choices are not. A failure that ends the
// turn is a *CallError wrapping agent.ErrPolicy. The response is read whole
// (no streaming): trainers want the finished turn, and it keeps the raw
// body faithful.
package openai
