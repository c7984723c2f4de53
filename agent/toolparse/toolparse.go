package toolparse

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Call is one tool call found in a completion's text.
type Call struct {
	Name string
	// Arguments is the arguments' JSON text: an object (or any other JSON
	// value) re-encoded compactly, or the contents of a JSON string used
	// verbatim, which may be invalid JSON; "{}" when the markup had none.
	Arguments string
}

// ErrMalformed marks tool-call markup that is present but does not parse.
var ErrMalformed = errors.New("malformed tool-call markup")

const (
	hermesOpen    = "<tool_call>"
	hermesClose   = "</tool_call>"
	functionOpen  = "<function="
	functionClose = "</function>"
)

// Parse finds tool calls in text in whichever supported format it uses:
// Hermes <tool_call> blocks when the text has any, else <function=...>
// tags. See [ParseHermes] for what it returns.
func Parse(text string) (content string, calls []Call, err error) {
	if strings.Contains(text, hermesOpen) {
		return ParseHermes(text)
	}
	return ParseFunctionTags(text)
}

// ParseHermes finds Hermes/Qwen tool-call blocks,
// <tool_call>{"name": ..., "arguments": ...}</tool_call>, in text, in order.
// content is the text outside the blocks with surrounding white space
// trimmed.
//
// # Errors
//
// When the text has no <tool_call> tag, ParseHermes returns the text
// unchanged with no calls and no error. When a block is malformed (its
// body is not one JSON object with a non-empty string "name", blocks nest,
// a closing tag has no opening one, or a block other than the last is not
// closed), it returns the text unchanged, no calls, and an error wrapping
// [ErrMalformed] that names the block and its byte offset.
func ParseHermes(text string) (content string, calls []Call, err error) {
	return parseTagged(text, hermesOpen, hermesClose, decodeHermesBody)
}

// ParseFunctionTags finds Llama 3.1 style calls,
// <function=NAME>{...arguments...}</function>, in text, in order. NAME is
// made of letters, digits, '_', '-' and '.'; the body is the arguments'
// JSON (an empty body means "{}"). Results and errors are as for
// [ParseHermes], with <function= as the opening tag.
func ParseFunctionTags(text string) (content string, calls []Call, err error) {
	return parseTagged(text, functionOpen, functionClose, decodeFunctionBody)
}

// parseTagged splits text into blocks between open and close tags and
// decodes each block's body (what follows open) with decode.
func parseTagged(text, open, close string, decode func(body string) (Call, error)) (string, []Call, error) {
	if !strings.Contains(text, open) {
		return text, nil, nil
	}
	malformed := func(block, offset int, format string, args ...any) (string, []Call, error) {
		return text, nil, fmt.Errorf("%w: block %d at byte %d: %s", ErrMalformed, block, offset, fmt.Sprintf(format, args...))
	}
	var (
		outside strings.Builder
		found   []Call
		pos     int // offset of rest in text
		rest    = text
	)
	for block := 1; ; block++ {
		i := strings.Index(rest, open)
		if i < 0 {
			if j := strings.Index(rest, close); j >= 0 {
				return malformed(block-1, pos+j, "%s without a matching %s", close, open)
			}
			outside.WriteString(rest)
			break
		}
		if j := strings.Index(rest[:i], close); j >= 0 {
			return malformed(block-1, pos+j, "%s without a matching %s", close, open)
		}
		outside.WriteString(rest[:i])
		start := pos + i
		rest = rest[i+len(open):]
		pos = start + len(open)

		body, closed := rest, false
		if j := strings.Index(rest, close); j >= 0 {
			body, closed = rest[:j], true
		}
		if strings.Contains(body, open) {
			if closed {
				return malformed(block, start, "%s inside a block", open)
			}
			return malformed(block, start, "not closed by %s", close)
		}
		call, err := decode(body)
		if err != nil {
			if !closed {
				return malformed(block, start, "not closed by %s, and %v", close, err)
			}
			return malformed(block, start, "%v", err)
		}
		found = append(found, call)
		if !closed {
			break // an unclosed last block whose body decoded whole
		}
		rest = rest[len(body)+len(close):]
		pos += len(body) + len(close)
	}
	return strings.TrimSpace(outside.String()), found, nil
}

// decodeHermesBody decodes {"name": ..., "arguments": ...}.
func decodeHermesBody(body string) (Call, error) {
	var v struct {
		Name       *string         `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	trimmed := strings.TrimSpace(body)
	if !strings.HasPrefix(trimmed, "{") {
		return Call{}, errors.New("body is not a JSON object")
	}
	if err := json.Unmarshal([]byte(trimmed), &v); err != nil {
		return Call{}, fmt.Errorf("body is not a JSON object: %v", err)
	}
	if v.Name == nil {
		return Call{}, errors.New(`"name" is missing or not a string`)
	}
	if *v.Name == "" {
		return Call{}, errors.New(`"name" is empty`)
	}
	raw := v.Arguments
	if len(raw) == 0 {
		raw = v.Parameters
	}
	args, err := argumentsText(raw)
	if err != nil {
		return Call{}, err
	}
	return Call{Name: *v.Name, Arguments: args}, nil
}

// decodeFunctionBody decodes NAME>{...} (what follows "<function=").
func decodeFunctionBody(body string) (Call, error) {
	end := strings.IndexByte(body, '>')
	if end < 0 {
		return Call{}, errors.New("the function name is not closed by '>'")
	}
	name := body[:end]
	if name == "" {
		return Call{}, errors.New("the function name is empty")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return Call{}, fmt.Errorf("the function name %q has a character other than letters, digits, '_', '-' and '.'", name)
		}
	}
	raw := strings.TrimSpace(body[end+1:])
	if raw == "" {
		return Call{Name: name, Arguments: "{}"}, nil
	}
	if !json.Valid([]byte(raw)) {
		return Call{}, errors.New("the arguments are not JSON")
	}
	args, err := argumentsText(json.RawMessage(raw))
	if err != nil {
		return Call{}, err
	}
	return Call{Name: name, Arguments: args}, nil
}

// argumentsText turns the arguments' JSON value into their text: "{}" for
// none or null, a string's contents verbatim, anything else compacted.
func argumentsText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "{}", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("arguments: %v", err)
		}
		return s, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", fmt.Errorf("arguments: %v", err)
	}
	return b.String(), nil
}
