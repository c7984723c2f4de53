package scripted

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rollbox/rollbox/agent"
)

// ErrInvalidScript marks a script file that cannot be loaded.
var ErrInvalidScript = errors.New("invalid script")

// Model is the Turn.Model of every scripted turn.
const Model = "scripted"

// Policy replays scripted turns. It is immutable once loaded and safe for
// concurrent use.
type Policy struct {
	scripts map[string][]turn
}

// turn is one scripted assistant turn, checked at load.
type turn struct {
	content      string
	toolCalls    []agent.ToolCall
	finishReason string
	usage        *agent.Usage
	err          string
	raw          json.RawMessage
}

// Load reads the script file at path. See the package documentation for
// its format.
//
// # Errors
//
// Load fails when the file cannot be read, or, wrapping ErrInvalidScript,
// when any line is invalid (naming the path, the line and the field) or a
// task id is scripted twice. Nothing is loaded unless the whole file is
// valid.
func Load(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("scripted: %w", err)
	}
	defer f.Close()
	return read(f, path+" ")
}

// Read reads a script from r, as Load does from a file.
func Read(r io.Reader) (*Policy, error) {
	return read(r, "")
}

func read(r io.Reader, where string) (*Policy, error) {
	p := &Policy{scripts: make(map[string][]turn)}
	firstLine := make(map[string]int)
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("scripted: %sline %d: %w", where, n, err)
		}
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			id, turns, perr := parseLine(trimmed)
			if perr != nil {
				return nil, fmt.Errorf("%w: %sline %d: %v", ErrInvalidScript, where, n, perr)
			}
			if first, dup := firstLine[id]; dup {
				return nil, fmt.Errorf("%w: %sline %d: task_id %q is already scripted on line %d", ErrInvalidScript, where, n, id, first)
			}
			firstLine[id] = n
			p.scripts[id] = turns
		}
		if err == io.EOF {
			break
		}
	}
	if len(p.scripts) == 0 {
		return nil, fmt.Errorf("%w: %sno scripts: the file is empty", ErrInvalidScript, where)
	}
	return p, nil
}

// Has reports whether a script exists for taskID.
func (p *Policy) Has(taskID string) bool {
	_, ok := p.scripts[taskID]
	return ok
}

// Tasks returns the scripted task ids, sorted.
func (p *Policy) Tasks() []string {
	ids := make([]string, 0, len(p.scripts))
	for id := range p.scripts {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Next returns turn req.Turn of the script for req.TaskID.
//
// # Errors
//
// Next returns an error wrapping agent.ErrPolicy when no script has the
// task id, when the script has no turn req.Turn, or when that turn is
// scripted as an "error"; and ctx's error when ctx has ended.
func (p *Policy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return agent.Turn{}, fmt.Errorf("scripted: %w", err)
	}
	script, ok := p.scripts[req.TaskID]
	if !ok {
		script, ok = p.scripts[promptKey(firstUser(req.Messages))]
	}
	if !ok {
		return agent.Turn{}, fmt.Errorf("%w: no script for task %q or its prompt", agent.ErrPolicy, req.TaskID)
	}
	if req.Turn < 0 || req.Turn >= len(script) {
		return agent.Turn{Model: Model}, fmt.Errorf("%w: script for task %q has %d turns; turn %d was asked for", agent.ErrPolicy, req.TaskID, len(script), req.Turn)
	}
	t := script[req.Turn]
	out := agent.Turn{
		Content:      t.content,
		ToolCalls:    slices.Clone(t.toolCalls),
		FinishReason: t.finishReason,
		Model:        Model,
		Raw:          t.raw,
		Attempts:     1,
	}
	if t.usage != nil {
		u := *t.usage
		out.Usage = &u
	}
	out.Latency = time.Since(start)
	if t.err != "" {
		return out, fmt.Errorf("%w: script for task %q turn %d: %s", agent.ErrPolicy, req.TaskID, req.Turn, t.err)
	}
	return out, nil
}

// parseLine checks one non-blank line and returns its task id and turns.
// Errors name the field as a path (turns[1].tool_calls[0].name).
func parseLine(line []byte) (string, []turn, error) {
	fields, err := object(line, "", "task_id", "prompt", "turns")
	if err != nil {
		return "", nil, err
	}
	var id string
	switch {
	case present(fields, "task_id") && present(fields, "prompt"):
		return "", nil, errors.New("task_id and prompt: give one (a script is picked by the task's id or by its prompt)")
	case present(fields, "prompt"):
		prompt, err := str(fields["prompt"], "prompt", true)
		if err != nil {
			return "", nil, err
		}
		id = promptKey(prompt)
	default:
		if id, err = str(fields["task_id"], "task_id", true); err != nil {
			return "", nil, err
		}
	}
	rawTurns, err := array(fields["turns"], "turns", true)
	if err != nil {
		return "", nil, err
	}
	turns := make([]turn, len(rawTurns))
	for i, raw := range rawTurns {
		if turns[i], err = parseTurn(raw, i); err != nil {
			return "", nil, err
		}
	}
	return id, turns, nil
}

func parseTurn(raw json.RawMessage, i int) (turn, error) {
	path := "turns[" + strconv.Itoa(i) + "]"
	fields, err := object(raw, path, "content", "tool_calls", "finish_reason", "usage", "error")
	if err != nil {
		return turn{}, err
	}
	t := turn{raw: raw}
	if t.content, err = str(fields["content"], path+".content", false); err != nil {
		return turn{}, err
	}
	if t.finishReason, err = str(fields["finish_reason"], path+".finish_reason", false); err != nil {
		return turn{}, err
	}
	if present(fields, "error") {
		if t.err, err = str(fields["error"], path+".error", true); err != nil {
			return turn{}, err
		}
		if present(fields, "content") {
			return turn{}, fmt.Errorf("%s: error cannot be combined with content: a failed turn returns nothing", path)
		}
		if present(fields, "tool_calls") {
			return turn{}, fmt.Errorf("%s: error cannot be combined with tool_calls: a failed turn returns nothing", path)
		}
	}
	calls, err := array(fields["tool_calls"], path+".tool_calls", false)
	if err != nil {
		return turn{}, err
	}
	for j, rawCall := range calls {
		callPath := path + ".tool_calls[" + strconv.Itoa(j) + "]"
		cf, err := object(rawCall, callPath, "id", "name", "arguments")
		if err != nil {
			return turn{}, err
		}
		var call agent.ToolCall
		if call.ID, err = str(cf["id"], callPath+".id", false); err != nil {
			return turn{}, err
		}
		if call.ID == "" {
			call.ID = "call_" + strconv.Itoa(i) + "_" + strconv.Itoa(j)
		}
		if call.Name, err = str(cf["name"], callPath+".name", true); err != nil {
			return turn{}, err
		}
		if call.Arguments, err = arguments(cf["arguments"], callPath+".arguments"); err != nil {
			return turn{}, err
		}
		t.toolCalls = append(t.toolCalls, call)
	}
	if t.finishReason == "" && t.err == "" {
		t.finishReason = "stop"
		if len(t.toolCalls) > 0 {
			t.finishReason = "tool_calls"
		}
	}
	if present(fields, "usage") {
		var u agent.Usage
		dec := json.NewDecoder(bytes.NewReader(fields["usage"]))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&u); err != nil {
			return turn{}, fmt.Errorf("%s.usage: want {\"prompt_tokens\", \"completion_tokens\", \"total_tokens\"} as integers: %v", path, err)
		}
		t.usage = &u
	}
	return t, nil
}

// object decodes raw as a JSON object whose keys are all in known.
func object(raw json.RawMessage, path string, known ...string) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		what := "a JSON object"
		if path == "" {
			return nil, fmt.Errorf("not %s: %s", what, describe(raw, err))
		}
		return nil, fmt.Errorf("%s: must be %s, not %s", path, what, describe(raw, err))
	}
	for key := range fields {
		if !slices.Contains(known, key) {
			name := key
			if path != "" {
				name = path + "." + key
			}
			return nil, fmt.Errorf("%s: unknown field (known: %s)", name, strings.Join(known, ", "))
		}
	}
	return fields, nil
}

// str decodes an optional (or, when required, non-empty) string.
func str(raw json.RawMessage, path string, required bool) (string, error) {
	if raw == nil || isNull(raw) {
		if required {
			return "", fmt.Errorf("%s: missing", path)
		}
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: must be a string, not %s", path, describe(raw, nil))
	}
	if required && s == "" {
		return "", fmt.Errorf("%s: empty", path)
	}
	return s, nil
}

// array decodes an optional (or, when required, non-empty) array.
func array(raw json.RawMessage, path string, required bool) ([]json.RawMessage, error) {
	if raw == nil || isNull(raw) {
		if required {
			return nil, fmt.Errorf("%s: missing", path)
		}
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%s: must be an array, not %s", path, describe(raw, nil))
	}
	if required && len(items) == 0 {
		return nil, fmt.Errorf("%s: empty", path)
	}
	return items, nil
}

// arguments turns a call's arguments into their text.
func arguments(raw json.RawMessage, path string) (string, error) {
	if raw == nil || isNull(raw) {
		return "{}", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("%s: %v", path, err)
		}
		return s, nil
	case '{':
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			return "", fmt.Errorf("%s: %v", path, err)
		}
		return b.String(), nil
	}
	return "", fmt.Errorf("%s: must be a JSON object or a string, not %s", path, describe(raw, nil))
}

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }

// present reports whether fields has key with a value other than null.
func present(fields map[string]json.RawMessage, key string) bool {
	raw, ok := fields[key]
	return ok && !isNull(raw)
}

// describe names the kind of a JSON value for an error message, or gives
// the syntax error.
func describe(raw json.RawMessage, err error) string {
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) {
		return fmt.Sprintf("invalid JSON (%v at byte %d)", syntax, syntax.Offset)
	}
	switch raw = bytes.TrimSpace(raw); {
	case len(raw) == 0:
		return "nothing"
	case raw[0] == '{':
		return "an object"
	case raw[0] == '[':
		return "an array"
	case raw[0] == '"':
		return "a string"
	case string(raw) == "true" || string(raw) == "false":
		return "a boolean"
	case string(raw) == "null":
		return "null"
	}
	return "a number"
}

// promptKey keys a script picked by its prompt (a sub-agent's sub-task,
// whose task id is its orchestrator task's): apart from every task id.
func promptKey(prompt string) string { return "\x00prompt:" + strings.TrimSpace(prompt) }

// firstUser is the first user message's content: the task's prompt.
func firstUser(msgs []agent.Message) string {
	for _, m := range msgs {
		if m.Role == agent.RoleUser {
			return m.Content
		}
	}
	return ""
}
