package runtime

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// Import formats (a line's "format", or found from its fields).
const (
	FormatOpenAI     = "openai"
	FormatTrajectory = "trajectory"
)

// Group keys of imported episodes (?group_by=).
const (
	GroupByGroupID = "group_id"
	GroupByTaskID  = "task_id"
	GroupByPrompt  = "prompt"
)

// importOptions are an import request's parameters.
type importOptions struct {
	source        string
	policyVersion string // default for lines that carry none
	groupBy       string // "" : the line's group_id, else its task_id, else the prompt
	tenant        string
	spec          *OutcomeSpec
	specJSON      json.RawMessage
	now           time.Time
}

// lineError is a refused line's reason.
type lineError struct {
	Line    int    `json:"line"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (e *lineError) Error() string { return fmt.Sprintf("line %d: %s: %s", e.Line, e.Field, e.Message) }

func fieldErr(field, format string, args ...any) *lineError {
	return &lineError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// openAILine is an episode in OpenAI chat-completions form: the request's
// messages with the model's answers (tool calls and tool results), the
// model and sampling, and the deployment's identity of it.
type openAILine struct {
	ID            string          `json:"id"`
	Format        string          `json:"format"`
	PolicyVersion string          `json:"policy_version"`
	Model         string          `json:"model"`
	Sampling      json.RawMessage `json:"sampling"`
	TaskID        string          `json:"task_id"`
	GroupID       string          `json:"group_id"`
	StartedAt     *time.Time      `json:"started_at"`
	EndedAt       *time.Time      `json:"ended_at"`
	Created       *float64        `json:"created"`
	Messages      []openAIMessage `json:"messages"`
	Tools         json.RawMessage `json:"tools"`
	Metadata      json.RawMessage `json:"metadata"`
	Signals       []signalIn      `json:"signals"`
	// OutcomeReward overrides the service's outcome reward spec.
	OutcomeReward json.RawMessage `json:"outcome_reward"`
	// OpenAI request parameters, kept as the sampling.
	Temperature         json.RawMessage `json:"temperature"`
	TopP                json.RawMessage `json:"top_p"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	Seed                json.RawMessage `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	N                   json.RawMessage `json:"n"`
	PresencePenalty     json.RawMessage `json:"presence_penalty"`
	FrequencyPenalty    json.RawMessage `json:"frequency_penalty"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   json.RawMessage `json:"parallel_tool_calls"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	Stream              json.RawMessage `json:"stream"`
	// User is the end user's id in OpenAI's API: dropped, never stored.
	User json.RawMessage `json:"user"`
}

type openAIMessage struct {
	Role       string           `json:"role"`
	Content    json.RawMessage  `json:"content"`
	Name       string           `json:"name"`
	ToolCalls  []openAIToolCall `json:"tool_calls"`
	ToolCallID string           `json:"tool_call_id"`
	// The deployment's token ids and logprobs of an assistant turn, when
	// it kept them.
	PromptTokenIDs     []int64         `json:"prompt_token_ids"`
	CompletionTokenIDs []int64         `json:"completion_token_ids"`
	TokenIDs           []int64         `json:"token_ids"`
	Logprobs           json.RawMessage `json:"logprobs"`
	FinishReason       string          `json:"finish_reason"`
	Usage              *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	} `json:"usage"`
	Model            string          `json:"model"`
	PolicyVersion    string          `json:"policy_version"`
	Refusal          json.RawMessage `json:"refusal"`
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Annotations      json.RawMessage `json:"annotations"`
}

type openAIToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
	Index json.RawMessage `json:"index"`
}

// importedEpisode is one parsed line, ready to be stored.
type importedEpisode struct {
	line       int
	id         string
	externalID string
	groupKey   string // the group id before it is hashed into the record's GroupID
	t          *trajectory.Trajectory
	signals    []trajectory.Signal
	spec       *OutcomeSpec
	importedAt time.Time
}

var (
	externalIDRe = regexp.MustCompile(`^[\x21-\x7e]{1,256}$`)
	sourceRe     = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,63}$`)
)

// importedID is the episode id of an external id: the same for the same
// tenant, source and id, so a line sent twice (or again after a crash) is
// the same episode.
func importedID(tenant, source, externalID string) string {
	h := sha256.Sum256([]byte(tenant + "\x00" + source + "\x00" + externalID))
	return "imp-" + hex.EncodeToString(h[:12])
}

// importedGroupID is the group id of a group key.
func importedGroupID(tenant, source, by, key string) string {
	h := sha256.Sum256([]byte(tenant + "\x00" + source + "\x00" + by + "\x00" + key))
	return source + "." + by + "." + hex.EncodeToString(h[:8])
}

// parseImportLine turns one NDJSON line into an episode: redaction first
// (on every string of the decoded line but identifiers), then the format's
// conversion and validation. Errors name the field.
func (s *Server) parseImportLine(raw []byte, o *importOptions) (*importedEpisode, *lineError) {
	if !s.redactor.mayMatch(raw) && !bytes.Contains(raw, []byte(`"schema"`)) && !bytes.Contains(raw, []byte(`"format"`)) {
		// Nothing to redact (no string of the line can hold what a
		// pattern needs) and the default format: one decode.
		return parseOpenAILine(raw, o)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		var ae *apiError
		if errors.As(jsonFieldError(err, ""), &ae) {
			return nil, &lineError{Field: ae.Field, Message: ae.Message}
		}
		return nil, fieldErr("", "not JSON: %v", err)
	}
	if dec.More() {
		return nil, fieldErr("", "more than one JSON value on the line")
	}
	obj, ok := generic.(map[string]any)
	if !ok {
		return nil, fieldErr("", "want a JSON object (an episode), got %s", jsonKind(generic))
	}
	var redactions []trajectory.Redaction
	if s.redactor != nil {
		for _, k := range []string{"id", "group_id", "task_id", "episode_id"} {
			if v, ok := obj[k].(string); ok {
				if kind := s.redactor.Finds(v); kind != "" {
					return nil, fieldErr(k, "holds what the redaction finds as %s; ids are stored as given, so send an opaque id (a hash)", kind)
				}
			}
		}
		s.redactor.redactValue(obj, nil, &redactions)
		if len(redactions) > 0 {
			b, err := json.Marshal(obj)
			if err != nil {
				return nil, fieldErr("", "%v", err)
			}
			raw = b
		}
	}
	format, _ := obj["format"].(string)
	if format == "" {
		if _, ok := obj["schema"]; ok {
			format = FormatTrajectory
		} else {
			format = FormatOpenAI
		}
	}
	var ep *importedEpisode
	var le *lineError
	switch format {
	case FormatOpenAI:
		ep, le = parseOpenAILine(raw, o)
	case FormatTrajectory:
		ep, le = parseTrajectoryLine(raw, o)
	default:
		return nil, fieldErr("format", "%q is not one of openai, trajectory", format)
	}
	if le != nil {
		return nil, le
	}
	ep.t.Redactions = redactions
	return ep, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return "an object"
}

// decodeLine decodes a line strictly into v; errors name the field.
func decodeLine(raw []byte, v any) *lineError {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ae *apiError
		if errors.As(jsonFieldError(err, ""), &ae) {
			return &lineError{Field: ae.Field, Message: ae.Message}
		}
		return fieldErr("", "%v", err)
	}
	if dec.More() {
		return fieldErr("", "more than one JSON value on the line")
	}
	return nil
}

// content reads a message's content: a string, null, or parts ({"type":
// "text", "text"}; other parts are kept as a [type] placeholder).
func content(raw json.RawMessage, field string) (string, *lineError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fieldErr(field, "want a string, null or an array of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		} else {
			b.WriteString("[" + p.Type + "]")
		}
	}
	return b.String(), nil
}

// normalizePrompt is a first user message as a group key: case folded,
// runs of white space one space, trimmed.
func normalizePrompt(p string) string {
	return strings.Join(strings.FieldsFunc(strings.ToLower(p), unicode.IsSpace), " ")
}

func parseOpenAILine(raw []byte, o *importOptions) (*importedEpisode, *lineError) {
	var l openAILine
	if le := decodeLine(raw, &l); le != nil {
		return nil, le
	}
	if l.ID == "" {
		return nil, fieldErr("id", "is required: the caller's stable id of the episode (a retry of the same id is a duplicate)")
	}
	if !externalIDRe.MatchString(l.ID) {
		return nil, fieldErr("id", "use 1 to 256 printable ASCII characters without spaces")
	}
	pv := l.PolicyVersion
	if pv == "" {
		pv = o.policyVersion
	}
	if pv == "" {
		return nil, fieldErr("policy_version", "is required: the deployment's policy version that served the episode (or ?policy_version= for the whole import)")
	}
	if len(l.Messages) == 0 {
		return nil, fieldErr("messages", "is required: the conversation, at least one user message")
	}
	now := o.now
	started, ended := now, now
	switch {
	case l.StartedAt != nil:
		started = l.StartedAt.UTC()
	case l.Created != nil:
		if math.IsNaN(*l.Created) || *l.Created < 0 || *l.Created > 1e11 {
			return nil, fieldErr("created", "want unix seconds")
		}
		started = time.Unix(0, int64(*l.Created*1e9)).UTC()
	}
	if l.EndedAt != nil {
		ended = l.EndedAt.UTC()
	} else if l.StartedAt != nil || l.Created != nil {
		ended = started
	}
	if ended.Before(started) {
		return nil, fieldErr("ended_at", "is before started_at")
	}

	var system, prompt string
	var steps []trajectory.Step
	calls := map[string]trajectory.ToolCall{}
	turn, sawUser := -1, false
	var segIDs []int64 // the current token segment
	segment := -1
	for i, m := range l.Messages {
		f := fmt.Sprintf("messages[%d]", i)
		text, le := content(m.Content, f+".content")
		if le != nil {
			return nil, le
		}
		step := trajectory.Step{Index: len(steps), Turn: max(turn, 0), StartedAt: started}
		switch m.Role {
		case "system", "developer":
			if !sawUser {
				if system != "" {
					system += "\n\n"
				}
				system += text
				continue
			}
			step.Type, step.Content, step.Name = trajectory.StepUser, text, m.Role
		case "user":
			if !sawUser {
				prompt, sawUser = text, true
				continue
			}
			step.Type, step.Content = trajectory.StepUser, text
		case "assistant":
			if !sawUser {
				return nil, fieldErr(f+".role", "an assistant message before the first user message")
			}
			turn++
			step.Type, step.Turn, step.Content, step.FinishReason = trajectory.StepModel, turn, text, m.FinishReason
			step.Model = m.Model
			if step.Model == "" {
				step.Model = l.Model
			}
			step.PolicyVersion = m.PolicyVersion
			if step.PolicyVersion == "" {
				step.PolicyVersion = pv
			}
			for j, c := range m.ToolCalls {
				cf := fmt.Sprintf("%s.tool_calls[%d]", f, j)
				if c.ID == "" {
					return nil, fieldErr(cf+".id", "is required (tool results name it)")
				}
				if c.Function.Name == "" {
					return nil, fieldErr(cf+".function.name", "is required")
				}
				if _, dup := calls[c.ID]; dup {
					return nil, fieldErr(cf+".id", "%q is the id of an earlier tool call", c.ID)
				}
				args := ""
				if len(c.Function.Arguments) > 0 {
					if err := json.Unmarshal(c.Function.Arguments, &args); err != nil {
						args = string(c.Function.Arguments) // an object, as OpenAI-compatible servers sometimes send
					}
				}
				tc := trajectory.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: args}
				if json.Valid([]byte(args)) {
					tc.Parsed = json.RawMessage(args)
				}
				calls[c.ID] = tc
				step.ToolCalls = append(step.ToolCalls, tc)
			}
			if m.Usage != nil {
				step.Usage = &trajectory.Usage{PromptTokens: m.Usage.PromptTokens, CompletionTokens: m.Usage.CompletionTokens, TotalTokens: m.Usage.TotalTokens}
				step.Tokens = trajectory.TokensReported
			}
			completion := m.CompletionTokenIDs
			if completion == nil {
				completion = m.TokenIDs
			}
			lps, le := logprobNumbers(m.Logprobs, f+".logprobs")
			if le != nil {
				return nil, le
			}
			switch {
			case m.PromptTokenIDs != nil && completion != nil:
				// Token ids of both: the turn joins the token segments,
				// extending the current one when its prompt does.
				if len(segIDs) > 0 && len(m.PromptTokenIDs) >= len(segIDs) && int64sHavePrefix(m.PromptTokenIDs, segIDs) {
					seg := segment
					step.Segment = &seg
					step.PromptDeltaIDs = append([]int64{}, m.PromptTokenIDs[len(segIDs):]...)
				} else {
					segment++
					seg := segment
					step.Segment, step.PromptIDs = &seg, m.PromptTokenIDs
					if seg > 0 {
						step.SegmentReason = trajectory.SegmentTemplate
					}
				}
				step.CompletionIDs = completion
				segIDs = append(append([]int64{}, m.PromptTokenIDs...), completion...)
				step.Tokens = trajectory.TokensExact
				if step.Usage == nil {
					step.Usage = &trajectory.Usage{PromptTokens: int64(len(m.PromptTokenIDs)), CompletionTokens: int64(len(completion)),
						TotalTokens: int64(len(m.PromptTokenIDs) + len(completion))}
				}
				if lps != nil && len(lps) == len(completion) {
					step.Logprobs, _ = json.Marshal(lps)
				} else {
					if lps != nil {
						return nil, fieldErr(f+".logprobs", "has %d numbers for %d completion ids", len(lps), len(completion))
					}
					step.LogprobsAbsent = true
				}
			case m.PromptTokenIDs != nil:
				return nil, fieldErr(f+".completion_token_ids", "is required with prompt_token_ids")
			default:
				step.CompletionTokenIDs = completion
				if len(m.Logprobs) > 0 && string(m.Logprobs) != "null" {
					step.Logprobs = m.Logprobs
				}
			}
		case "tool":
			if m.ToolCallID == "" {
				return nil, fieldErr(f+".tool_call_id", "is required: the id of the tool call this answers")
			}
			c, ok := calls[m.ToolCallID]
			if !ok {
				return nil, fieldErr(f+".tool_call_id", "%q names no earlier tool call", m.ToolCallID)
			}
			step.Type, step.CallID, step.Name, step.Output = trajectory.StepTool, c.ID, c.Name, text
			step.Arguments = c.Parsed
			if step.Arguments == nil {
				step.Arguments, _ = json.Marshal(c.Arguments)
			}
		default:
			return nil, fieldErr(f+".role", "%q is not one of system, developer, user, assistant, tool", m.Role)
		}
		steps = append(steps, step)
	}
	if !sawUser {
		return nil, fieldErr("messages", "has no user message (the first is the episode's prompt)")
	}
	if turn < 0 {
		return nil, fieldErr("messages", "has no assistant message: nothing the model did")
	}

	taskID := l.TaskID
	if taskID == "" {
		// The task of a conversation without one is its normalized prompt.
		ph := sha256.Sum256([]byte(normalizePrompt(prompt)))
		taskID = "prompt-" + hex.EncodeToString(ph[:8])
	}
	task := map[string]any{"id": taskID, "prompt": prompt}
	if system != "" {
		task["system"] = system
	}
	if len(l.Tools) > 0 && string(l.Tools) != "null" {
		task["tool_schemas"] = l.Tools
	}
	taskJSON, _ := json.Marshal(task)
	sampling := l.Sampling
	if len(sampling) == 0 {
		sampling = openAISampling(&l)
	}
	t := &trajectory.Trajectory{Schema: trajectory.Schema, TaskID: taskID, Task: taskJSON, StartedAt: started, EndedAt: &ended,
		Sandbox: trajectory.Sandbox{Backend: "none"},
		Policy:  trajectory.Policy{Kind: "production", Model: l.Model, Sampling: sampling},
		Steps:   steps, ContextEvents: []trajectory.ContextEvent{},
		Termination: &trajectory.Termination{Reason: trajectory.EndFinished, Step: len(steps) - 1,
			Message: "imported from " + o.source},
		Import: &trajectory.Import{ExternalID: l.ID, Format: FormatOpenAI, PolicyVersion: pv, Metadata: l.Metadata,
			Missing: []string{"task.sandbox (an image)", "task.files (the workspace)", "task.tools (Rollbox tools)"}}}
	if segs, err := trajectory.BuildSegments(steps); err == nil {
		t.Segments = segs
	}
	h := sha256.Sum256(taskJSON)
	t.TaskHash = hex.EncodeToString(h[:])
	ep := &importedEpisode{externalID: l.ID, t: t}
	by, key := o.groupBy, ""
	switch {
	case by == GroupByGroupID || by == "" && l.GroupID != "":
		by, key = GroupByGroupID, l.GroupID
	case by == GroupByTaskID || by == "" && l.TaskID != "":
		by, key = GroupByTaskID, l.TaskID
	default:
		by = GroupByPrompt
		ph := sha256.Sum256([]byte(normalizePrompt(prompt)))
		key = hex.EncodeToString(ph[:16])
	}
	if key == "" {
		return nil, fieldErr(by, "is required to group by %s (?group_by=%s)", by, by)
	}
	t.Import.GroupBy, t.Import.GroupKey = by, key
	if le := lineOutcomes(ep, l.Signals, l.OutcomeReward, o); le != nil {
		return nil, le
	}
	return ep, nil
}

// openAISampling collects a request's sampling parameters.
func openAISampling(l *openAILine) json.RawMessage {
	m := map[string]json.RawMessage{}
	for k, v := range map[string]json.RawMessage{"temperature": l.Temperature, "top_p": l.TopP, "max_tokens": l.MaxTokens,
		"max_completion_tokens": l.MaxCompletionTokens, "seed": l.Seed, "stop": l.Stop, "n": l.N, "presence_penalty": l.PresencePenalty,
		"frequency_penalty": l.FrequencyPenalty, "tool_choice": l.ToolChoice, "parallel_tool_calls": l.ParallelToolCalls,
		"response_format": l.ResponseFormat} {
		if len(v) > 0 {
			m[k] = v
		}
	}
	if len(m) == 0 {
		return nil
	}
	b, _ := json.Marshal(m)
	return b
}

// logprobNumbers reads logprobs as numbers: an array of numbers, or
// OpenAI's {"content": [{"token", "logprob"}, ...]}. nil when absent.
func logprobNumbers(raw json.RawMessage, field string) ([]float64, *lineError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var nums []float64
	if err := json.Unmarshal(raw, &nums); err == nil {
		return nums, nil
	}
	var oa struct {
		Content []struct {
			Logprob *float64 `json:"logprob"`
		} `json:"content"`
	}
	if err := json.Unmarshal(raw, &oa); err != nil {
		return nil, fieldErr(field, "want an array of numbers or {\"content\": [{\"token\", \"logprob\"}, ...]}")
	}
	for i, c := range oa.Content {
		if c.Logprob == nil {
			return nil, fieldErr(fmt.Sprintf("%s.content[%d].logprob", field, i), "is required")
		}
		nums = append(nums, *c.Logprob)
	}
	return nums, nil
}

func int64sHavePrefix(s, prefix []int64) bool {
	for i, v := range prefix {
		if s[i] != v {
			return false
		}
	}
	return true
}

// trajectoryLine is a Rollbox record with the import's own fields beside
// it (they are not part of the record's schema).
type trajectoryLine struct {
	ID            string          `json:"id"`
	PolicyVersion string          `json:"policy_version"`
	Signals       []signalIn      `json:"signals"`
	OutcomeReward json.RawMessage `json:"outcome_reward"`
	Metadata      json.RawMessage `json:"metadata"`
}

func parseTrajectoryLine(raw []byte, o *importOptions) (*importedEpisode, *lineError) {
	var extra trajectoryLine
	json.Unmarshal(raw, &extra)
	// The record itself is checked against the schema without the
	// import's own fields.
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fieldErr("", "not a JSON object: %v", err)
	}
	for _, k := range []string{"id", "policy_version", "signals", "metadata", "format", "outcome_reward"} {
		delete(obj, k)
	}
	doc, _ := json.Marshal(obj)
	if err := trajectory.Validate(doc); err != nil {
		return nil, fieldErr(schemaErrorField(err), "%v", err)
	}
	t, err := trajectory.Decode(doc)
	if err != nil {
		return nil, fieldErr("schema", "%v", err)
	}
	if t.Termination == nil {
		return nil, fieldErr("termination", "is required: only ended episodes are imported")
	}
	ext := extra.ID
	if ext == "" {
		ext = t.EpisodeID
	}
	if !externalIDRe.MatchString(ext) {
		return nil, fieldErr("id", "use 1 to 256 printable ASCII characters without spaces")
	}
	pv := extra.PolicyVersion
	if pv == "" && len(t.Stats.PolicyVersions) == 1 {
		for v := range t.Stats.PolicyVersions {
			pv = v
		}
	}
	if pv == "" {
		pv = o.policyVersion
	}
	if pv == "" {
		return nil, fieldErr("policy_version", "is required: the record's turns carry none (or several); give it beside the record or as ?policy_version=")
	}
	var missing []string
	var task struct {
		Sandbox struct {
			Image string `json:"image"`
		} `json:"sandbox"`
		Prompt string `json:"prompt"`
	}
	json.Unmarshal(t.Task, &task)
	if task.Sandbox.Image == "" && t.Sandbox.Backend != "wasm" {
		missing = append(missing, "task.sandbox.image")
	}
	if prev, ok := t.Value(); ok {
		t.Reward = &trajectory.Reward{Total: &prev, Details: []string{"(the record's own reward, replaced by the outcome reward)"}}
	}
	t.Import = &trajectory.Import{ExternalID: ext, Format: FormatTrajectory, PolicyVersion: pv, Metadata: extra.Metadata, Missing: missing}
	t.Group, t.Rescore, t.ReplayOf = nil, nil, nil
	ep := &importedEpisode{externalID: ext, t: t}
	by, key := o.groupBy, ""
	switch {
	case by == GroupByGroupID || by == "" && t.GroupID != "":
		by, key = GroupByGroupID, t.GroupID
	case by == GroupByTaskID || by == "" && t.TaskID != "":
		by, key = GroupByTaskID, t.TaskID
	default:
		by = GroupByPrompt
		ph := sha256.Sum256([]byte(normalizePrompt(task.Prompt)))
		key = hex.EncodeToString(ph[:16])
	}
	if key == "" {
		return nil, fieldErr(by, "is required to group by %s", by)
	}
	t.Import.GroupBy, t.Import.GroupKey = by, key
	if le := lineOutcomes(ep, extra.Signals, extra.OutcomeReward, o); le != nil {
		return nil, le
	}
	return ep, nil
}

var schemaPathRe = regexp.MustCompile(`at '/?([^']*)'`)

// schemaErrorField finds the JSON pointer a schema error names, as a
// field ("steps[3].type").
func schemaErrorField(err error) string {
	ms := schemaPathRe.FindAllStringSubmatch(err.Error(), -1)
	if len(ms) == 0 {
		return ""
	}
	p := ms[len(ms)-1][1]
	var b strings.Builder
	for i, part := range strings.Split(p, "/") {
		if part == "" {
			continue
		}
		if part[0] >= '0' && part[0] <= '9' {
			b.WriteString("[" + part + "]")
			continue
		}
		if i > 0 && b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(part)
	}
	return b.String()
}

// lineOutcomes sets an imported episode's outcome spec (the line's own, or
// the service's) and the signals it came with.
func lineOutcomes(ep *importedEpisode, signals []signalIn, specRaw json.RawMessage, o *importOptions) *lineError {
	ep.spec = o.spec
	specJSON := o.specJSON
	if len(specRaw) > 0 && string(specRaw) != "null" {
		sp, err := ParseOutcomeSpec(specRaw)
		if err != nil {
			var ae *apiError
			if errors.As(err, &ae) {
				return fieldErr(join("outcome_reward", ae.Field), "%s", ae.Message)
			}
			return fieldErr("outcome_reward", "%v", err)
		}
		ep.spec, specJSON = sp, specRaw
	}
	sigs, le := parseSignals(signals, "signals", o.now)
	if le != nil {
		return le
	}
	ep.signals = sigs
	ep.t.Outcomes = &trajectory.Outcomes{Status: trajectory.OutcomePending, Spec: specJSON, Signals: []trajectory.Signal{},
		MaturesAt: o.now.Add(ep.spec.window())}
	return nil
}
