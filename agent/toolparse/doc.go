// Package toolparse recovers tool calls from the text of a completion, for
// servers that return a model's raw output without parsing its tool-call
// markup (vLLM or SGLang started without a tool parser, a plain completion
// endpoint, a replayed transcript).
//
// Supported formats:
//
//   - Hermes / Qwen 2.5 / Qwen 3: one or more
//     <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>
//     blocks anywhere in the text. "arguments" may be a JSON object or a JSON
//     string holding the arguments' text; "parameters" is accepted in its
//     place. The last block may lack its closing tag when the text ends
//     right after its JSON (generation stopped on the tag).
//   - Llama 3.1 style function tags: <function=bash>{"command": "ls"}</function>.
//
// Not supported: Qwen3-Coder's XML parameters
// (<function=f><parameter=x>...</parameter></function>, whose values need
// the tool's schema to be typed), Mistral's [TOOL_CALLS], and pythonic
// calls.
//
// The parsers are pure functions that never panic on any input (they are
// fuzzed). Markup that does not parse is left alone: the whole text comes
// back as content with no calls and an error that says what was wrong, so
// a caller never runs half of what a model asked for.
package toolparse
