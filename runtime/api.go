package runtime

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/rollbox/rollbox/agent"
)

// Error codes of the API's error bodies.
const (
	codeBadRequest   = "bad_request"
	codeNotFound     = "not_found"
	codeOverloaded   = "overloaded"
	codeTooLarge     = "too_large"
	codeConflict     = "episode_ended"
	codeUnavailable  = "sandbox_unavailable"
	codeInternal     = "internal"
	codeShuttingDown = "shutting_down"
	// codeRecovering: the service is finalising what a previous process
	// left; the request can be answered once it has (Retry-After).
	codeRecovering          = "recovering"
	codeInsufficientStorage = "insufficient_storage"
	codeStorageUnavailable  = "storage_unavailable"
	codeUnauthorized        = "unauthorized"
	codeForbidden           = "forbidden"
	codeUnsupportedMedia    = "unsupported_media_type"
	codeTimeout             = "timeout"
	maxRolloutBody          = 64 << 20
	maxEnvRequestBody       = 16 << 20
)

// apiError is an error answer: {"error": {"code", "message", "field"}}.
type apiError struct {
	Status     int    `json:"-"`
	Code       string `json:"code"`
	Message    string `json:"message"`
	Field      string `json:"field,omitempty"`
	RetryAfter int    `json:"-"` // seconds, for 429 and 503
}

func (e *apiError) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

func badField(field, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Code: codeBadRequest, Field: field, Message: fmt.Sprintf(format, args...)}
}

func notFound(what, id string) *apiError {
	return &apiError{Status: http.StatusNotFound, Code: codeNotFound, Field: "id", Message: fmt.Sprintf("no %s %q", what, id)}
}

func writeHTTPJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"encoding the answer failed"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{Status: http.StatusInternalServerError, Code: codeInternal, Message: err.Error()}
	}
	if ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ae.RetryAfter))
	}
	if ae.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="rollbox"`)
	}
	writeHTTPJSON(w, ae.Status, map[string]any{"error": ae})
}

// readBody reads a request body up to limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Code: codeTooLarge, Message: fmt.Sprintf("the body is larger than %d bytes", limit)}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, &apiError{Status: http.StatusRequestTimeout, Code: codeTimeout,
				Message: "the body did not arrive in time (shorter than its Content-Length, or too slow)"}
		}
		return nil, badField("", "reading the body: %v", err)
	}
	return b, nil
}

// decodeStrict decodes one JSON object into v, refusing unknown fields and
// trailing data. Errors are 400s naming the field, prefixed with prefix
// ("policy" → "policy.model").
func decodeStrict(b []byte, v any, prefix string) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonFieldError(err, prefix)
	}
	if dec.More() {
		return badField(prefix, "more than one JSON value")
	}
	return nil
}

func join(prefix, field string) string {
	switch {
	case prefix == "":
		return field
	case field == "":
		return prefix
	case strings.HasPrefix(field, "["):
		return prefix + field
	}
	return prefix + "." + field
}

func jsonFieldError(err error, prefix string) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		return badField(join(prefix, te.Field), "want %s, got JSON %s", jsonType(te.Type.String()), te.Value)
	case errors.As(err, &se):
		return badField(prefix, "malformed JSON at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.EOF):
		return badField(prefix, "the body is empty; want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badField(prefix, "malformed JSON: unexpected end of input")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		return badField(join(prefix, name), "unknown field %q", name)
	}
	return badField(prefix, "malformed JSON: %v", err)
}

func jsonType(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map[") || strings.Contains(goType, "."):
		return "an object"
	case strings.HasPrefix(goType, "int") || strings.HasPrefix(goType, "float") || strings.HasPrefix(goType, "uint"):
		return "a number"
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "a boolean"
	}
	return goType
}

// taskFieldRe finds the field a task validator's message starts with:
// "limits.max_turns: ...", "sandbox.backend \"x\" is not ...", "tools[2]: ...".
var taskFieldRe = regexp.MustCompile(`^([a-z_][a-z0-9_]*(?:\[[^\]]*\])?(?:\.[a-z_][a-z0-9_]*(?:\[[^\]]*\])?)*)[: ]`)

// taskError turns a task parse or validation error into a 400 naming the
// field under prefix ("tasks[3]" → "tasks[3].limits.max_turns").
func taskError(err error, prefix string) error {
	msg := err.Error()
	field := prefix
	if m := taskFieldRe.FindStringSubmatch(msg); m != nil && m[1] != "not" && m[1] != "more" {
		field = join(prefix, m[1])
	}
	if rest, ok := strings.CutPrefix(msg, "unknown field "); ok {
		if name, err := strconv.Unquote(rest); err == nil {
			field = join(prefix, name)
		}
	}
	return badField(field, "%s", msg)
}

// PolicyRequest is a rollout's "policy" object.
type PolicyRequest struct {
	BaseURL string `json:"base_url"`
	Model   string `json:"model"`
	// Sampling is decoded into an agent.Sampling.
	Sampling json.RawMessage `json:"sampling,omitempty"`
	// MaxRetries is the client's retries of a failed call (default 5; 0 for none).
	MaxRetries *int `json:"max_retries,omitempty"`
	// TimeoutS bounds one call (default 600).
	TimeoutS float64 `json:"timeout_s,omitempty"`
	// MaxConcurrency caps this rollout's endpoint's calls in flight (it can
	// only lower the service's own cap).
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// Mode is "chat" (default: /chat/completions with messages) or
	// "tokens" (token in, token out: the server's /tokenize and
	// /completions; see agent/openai.TokenPolicy).
	Mode string `json:"mode,omitempty"`
	// TokenizeURL is the token mode's tokenizer endpoint (default: /tokenize
	// at the root of base_url).
	TokenizeURL string `json:"tokenize_url,omitempty"`
}

// RolloutRequest is the body of POST /v1/rollouts.
type RolloutRequest struct {
	Tasks     []json.RawMessage `json:"tasks"`
	GroupSize int               `json:"group_size"`
	Policy    json.RawMessage   `json:"policy"`
	// Backend is used by tasks that name none (default: the service's).
	Backend string `json:"backend,omitempty"`
	// Overrides replace task fields for this rollout.
	Overrides json.RawMessage `json:"overrides,omitempty"`
	// PolicyVersion is the trainer's (opaque) name of the policy the
	// server runs now; every turn records the version current when it was
	// sampled. Default: the service's last announced version.
	PolicyVersion string `json:"policy_version,omitempty"`
	// MaxStaleness, when set, ends an unfinished episode cancelled once
	// more than this many newer versions were announced after the version
	// of its first turn.
	MaxStaleness *int `json:"max_staleness,omitempty"`
	// Schedule is the order episodes start in: "groups" (the default when
	// group_size > 1) starts a group's episodes together and only as many
	// groups as the policy's concurrency keeps busy, so complete groups
	// stream from the start; "episodes" (the default for group_size 1)
	// starts every episode as soon as a slot is free.
	Schedule string `json:"schedule,omitempty"`
	// TrainStep is the trainer's step the rollout is for: a parl reward
	// anneals its auxiliary weights by it (default 0).
	TrainStep *int64 `json:"train_step,omitempty"`
	// RetryInterrupted (a cluster coordinator's): an episode whose worker
	// was lost after it asked the policy runs again instead of ending
	// interrupted with its partial journal.
	RetryInterrupted bool `json:"retry_interrupted,omitempty"`
}

// Schedules of a rollout.
const (
	ScheduleGroups   = "groups"
	ScheduleEpisodes = "episodes"
)

// PolicyVersionRequest is the body of POST /v1/policy-version and POST
// /v1/rollouts/{id}/policy-version: the trainer announces the version the
// policy server now runs.
type PolicyVersionRequest struct {
	Version string `json:"version"`
}

// Overrides are a rollout's "overrides": limits set here replace each
// task's (zero fields are left alone).
type Overrides struct {
	// Limits is decoded into an agent.EpisodeLimits.
	Limits json.RawMessage `json:"limits"`
}

// EpisodeRequest is the body of POST /v1/episodes.
type EpisodeRequest struct {
	Task    json.RawMessage `json:"task"`
	Backend string          `json:"backend,omitempty"`
	Seed    int64           `json:"seed,omitempty"`
	// TrainStep is the trainer's step the episode is for, as a rollout's
	// train_step: a parl reward anneals its λ to their value at it. Forks
	// of the episode keep it.
	TrainStep *int64 `json:"train_step,omitempty"`
}

// StepCall is one tool call of a step request. Arguments may be the raw
// JSON text (as OpenAI returns it) or a JSON object.
type StepCall struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// StepRequest is the body of POST /v1/episodes/{id}/step: the assistant
// message the trainer's model produced.
type StepRequest struct {
	Content      string       `json:"content,omitempty"`
	ToolCalls    []StepCall   `json:"tool_calls"`
	FinishReason string       `json:"finish_reason,omitempty"`
	Model        string       `json:"model,omitempty"`
	Usage        *agent.Usage `json:"usage,omitempty"`
	// PromptTokenIDs and CompletionTokenIDs are kept in the trajectory.
	PromptTokenIDs     []int64 `json:"prompt_token_ids,omitempty"`
	CompletionTokenIDs []int64 `json:"completion_token_ids,omitempty"`
	// LatencyMS is the model call's wall time, for the record.
	LatencyMS float64 `json:"latency_ms,omitempty"`
	// PolicyVersion is the trainer's version of the policy that produced
	// the message, for the record.
	PolicyVersion string `json:"policy_version,omitempty"`
}

// FinishRequest is the body of POST /v1/episodes/{id}/finish.
type FinishRequest struct {
	Answer *string  `json:"answer,omitempty"`
	IDs    []string `json:"ids,omitempty"`
}
