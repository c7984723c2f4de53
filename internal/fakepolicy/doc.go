// Package fakepolicy is an OpenAI-compatible chat-completions server for
// tests and load generation: it answers POST .../chat/completions with
// replies from a Go function, after a configurable latency, and can inject
// failures (error statuses with Retry-After, malformed JSON, empty choices,
// dropped connections). When a request asks for them the way vLLM does
// (logprobs, return_tokens_as_token_ids, return_token_ids), it returns
// per-token logprobs and token ids from a deterministic fake tokenizer
// (chunks of up to four bytes, never splitting a UTF-8 sequence).
//
// It stands in for the trainer's inference server: the model is theirs,
// so a fake that speaks the wire format is all Rollbox's own tests need.
// Each call costs one JSON decode and encode and a timer on the server's
// own connection goroutine, so a single server holds thousands of
// concurrent calls. Streaming is not supported.
package fakepolicy
