package trajectory

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"
)

// Schema is the version tag of the document; readers refuse a newer one.
const Schema = "rollbox.trajectory/v1"

// Step types.
const (
	StepModel = "model"
	StepTool  = "tool"
)

// Termination reasons.
const (
	EndFinished        = "finished"
	EndMaxTurns        = "max_turns"
	EndContextOverflow = "context_overflow"
	EndEpisodeTimeout  = "episode_timeout"
	EndPolicyError     = "policy_error"
	EndSandboxError    = "sandbox_error"
	EndCancelled       = "cancelled"
	EndInterrupted     = "interrupted"
	// EndSandboxAbuse: the agent's own commands broke its sandbox. Scored,
	// as a failure (reward 0), never dropped like sandbox_error.
	EndSandboxAbuse = "sandbox_abuse"
	// EndRecordError: the episode's record could not be written (a full or
	// failing disk). Unscored: what it did is not known for sure.
	EndRecordError = "record_error"
)

// EndReasons is the closed list of termination reasons.
func EndReasons() []string {
	return []string{EndFinished, EndMaxTurns, EndContextOverflow, EndEpisodeTimeout, EndPolicyError, EndSandboxError, EndCancelled, EndInterrupted, EndSandboxAbuse, EndRecordError}
}

// Scored reports whether an episode that ended for reason may be given a
// reward: infrastructure ends (sandbox, policy server, cancellation, crash)
// are never scored as the model's failure; an episode whose agent broke its
// own sandbox is scored, as a failure.
func Scored(reason string) bool {
	switch reason {
	case EndFinished, EndMaxTurns, EndContextOverflow, EndEpisodeTimeout, EndSandboxAbuse:
		return true
	}
	return false
}

// AbuseComponent is the reward component (always 0) of an episode that ended
// sandbox_abuse: the reward says why it is 0.
const AbuseComponent = "sandbox_abuse"

// Trajectory is one episode.
type Trajectory struct {
	Schema    string `json:"schema"`
	EpisodeID string `json:"episode_id"`
	RolloutID string `json:"rollout_id"`
	GroupID   string `json:"group_id"`
	// GroupIndex is the episode's place in its GRPO group.
	GroupIndex int    `json:"group_index"`
	TaskID     string `json:"task_id"`
	// TaskHash is the sha256 of the task's canonical JSON.
	TaskHash string `json:"task_hash"`
	Seed     int64  `json:"seed"`
	// Task is the task as given, so the episode can be replayed.
	Task      json.RawMessage `json:"task"`
	StartedAt time.Time       `json:"started_at"`
	EndedAt   *time.Time      `json:"ended_at,omitempty"`
	Sandbox   Sandbox         `json:"sandbox"`
	Policy    Policy          `json:"policy"`
	// Pinned is the nondeterminism the runtime controls, as it was set.
	Pinned        map[string]string `json:"pinned,omitempty"`
	Steps         []Step            `json:"steps"`
	ContextEvents []ContextEvent    `json:"context_events"`
	// Segments are the token sequences of a token-mode episode (derived
	// from the steps: BuildSegments); absent in chat mode.
	Segments    []Segment    `json:"segments,omitempty"`
	Termination *Termination `json:"termination"`
	Reward      *Reward      `json:"reward"`
	Stats       Stats        `json:"stats"`
	// Group is set on streamed episodes once their GRPO group completes.
	Group *GroupStats `json:"group,omitempty"`
}

// Sandbox is the sandbox as it really ran.
type Sandbox struct {
	Backend     string          `json:"backend"`
	ID          string          `json:"id,omitempty"`
	Image       string          `json:"image,omitempty"`
	ImageDigest string          `json:"image_digest,omitempty"`
	Runtime     string          `json:"runtime,omitempty"`
	Network     string          `json:"network,omitempty"`
	Workdir     string          `json:"workdir,omitempty"`
	Limits      json.RawMessage `json:"limits,omitempty"`
	Loosened    []string        `json:"loosened,omitempty"`
	// CloseError is set when the sandbox could not be removed at the end
	// (after the backend's retries): what may be left on the host, for
	// `rollbox gc`. The episode's end and reward are not affected.
	CloseError string `json:"close_error,omitempty"`
}

// Policy describes who decided.
type Policy struct {
	Kind     string          `json:"kind"` // openai, scripted, replay, env (the trainer owns the loop)
	Endpoint string          `json:"endpoint,omitempty"`
	Model    string          `json:"model,omitempty"`
	Sampling json.RawMessage `json:"sampling,omitempty"`
	// Mode is ModeTokens for the token-in/token-out mode; empty (chat) otherwise.
	Mode string `json:"mode,omitempty"`
	// Tokenizer identifies the server's tokenizer and chat template (token mode).
	Tokenizer *Tokenizer `json:"tokenizer,omitempty"`
}

// Policy modes.
const (
	ModeChat   = "chat"
	ModeTokens = "tokens"
)

// Values of Step.Tokens.
const (
	TokensExact     = "exact"
	TokensReported  = "reported"
	TokensEstimated = "estimated"
)

// Tokenizer is the identity of a token-mode server's tokenizer, so a
// trainer can check its own is the same before it trusts the ids.
type Tokenizer struct {
	// Model is the model the server serves; Revision what the server
	// reports of its weights/tokenizer (its model card's revision or root
	// path, and its version), empty when it reports nothing.
	Model    string `json:"model"`
	Revision string `json:"revision,omitempty"`
	// Fingerprint is the sha256 (hex) of the ids the server renders for a
	// fixed probe conversation: two servers with the same tokenizer and chat
	// template give the same fingerprint.
	Fingerprint string `json:"fingerprint"`
	// Endpoint is the tokenizer endpoint used.
	Endpoint string `json:"endpoint,omitempty"`
	// CloseIDs are the ids the template puts after an assistant message's
	// content (e.g. <|im_end|> and a newline): appended after a completion
	// that did not sample them, with loss mask 0.
	CloseIDs []int64 `json:"close_ids,omitempty"`
}

// Segment is one prefix-consistent token sequence of a token-mode episode:
// each turn's prompt is a prefix of Ids, and Ids ends with the last turn's
// completion. A segment starts at the first turn ("start") and wherever the
// history the model sees was rewritten ("pruned", "context_truncated") or
// the server's rendering of the new messages did not extend the sequence
// ("template").
type Segment struct {
	StartTurn int     `json:"start_turn"`
	EndTurn   int     `json:"end_turn"`
	Reason    string  `json:"reason"`
	Ids       []int64 `json:"ids"`
	// LossMask has one entry per id: 1 on sampled ids, 0 on prompt, tool
	// output and template ids.
	LossMask []int8 `json:"loss_mask"`
}

// Segment reasons.
const (
	SegmentStart     = "start"
	SegmentPruned    = "pruned"
	SegmentTruncated = "context_truncated"
	SegmentTemplate  = "template"
)

// SegmentReasons is the closed list of segment reasons.
func SegmentReasons() []string {
	return []string{SegmentStart, SegmentPruned, SegmentTruncated, SegmentTemplate}
}

// ToolCall is a call as the model made it: Arguments is the raw text;
// Parsed is the decoded object when the text is valid JSON.
type ToolCall struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Parsed    json.RawMessage `json:"parsed,omitempty"`
}

// Step is a model turn or a tool result.
type Step struct {
	Index int    `json:"index"`
	Type  string `json:"type"`
	// Turn is the model turn this step belongs to (0-based).
	Turn      int       `json:"turn"`
	StartedAt time.Time `json:"started_at"`
	// DurationMS is the step's wall time in milliseconds.
	DurationMS float64 `json:"duration_ms"`

	// Model turn fields.
	Content           string          `json:"content,omitempty"`
	ToolCalls         []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallsFromText bool            `json:"tool_calls_from_text,omitempty"`
	FinishReason      string          `json:"finish_reason,omitempty"`
	Model             string          `json:"model,omitempty"`
	Usage             *Usage          `json:"usage,omitempty"`
	Logprobs          json.RawMessage `json:"logprobs,omitempty"`
	// PromptTokenIDs and CompletionTokenIDs are the server's own token ids,
	// when it returned them (chat mode).
	PromptTokenIDs     []int64         `json:"prompt_token_ids,omitempty"`
	CompletionTokenIDs []int64         `json:"completion_token_ids,omitempty"`
	Raw                json.RawMessage `json:"raw,omitempty"`
	Attempts           int             `json:"attempts,omitempty"`
	// Tokens says where the turn's token accounting comes from: TokensExact
	// (token mode: the ids below are what the model saw and sampled),
	// TokensReported (the server's usage) or TokensEstimated (Rollbox's
	// estimate; no ids are ever made up).
	Tokens string `json:"tokens,omitempty"`
	// PolicyVersion is the trainer's policy version that produced the turn
	// (the rollout's current version when the call was sent).
	PolicyVersion string `json:"policy_version,omitempty"`
	// Token mode. Segment is the index of the segment (Trajectory.Segments)
	// the turn belongs to. The turn that starts a segment carries the whole
	// prompt in PromptIDs and the reason in SegmentReason; a later turn
	// carries only PromptDeltaIDs, the ids appended to the segment after the
	// previous turn's completion (the template's closing and opening
	// delimiters and the new tool/user messages, as the server rendered
	// them): its prompt is the previous prompt + the previous CompletionIDs +
	// PromptDeltaIDs. CompletionIDs are the sampled ids; Logprobs then holds
	// one number per completion id (LogprobsAbsent when the server sent
	// none). TokensError says how the server's ids disagreed with the prompt
	// it was given (the episode then ended policy_error).
	Segment        *int    `json:"segment,omitempty"`
	SegmentReason  string  `json:"segment_reason,omitempty"`
	PromptIDs      []int64 `json:"prompt_ids,omitempty"`
	PromptDeltaIDs []int64 `json:"prompt_delta_ids,omitempty"`
	CompletionIDs  []int64 `json:"completion_ids,omitempty"`
	LogprobsAbsent bool    `json:"logprobs_absent,omitempty"`
	TokensError    string  `json:"tokens_error,omitempty"`

	// Tool result fields.
	CallID string `json:"call_id,omitempty"`
	Name   string `json:"name,omitempty"`
	// Arguments is the parsed arguments object when valid, else the raw text
	// as a JSON string.
	Arguments json.RawMessage `json:"arguments,omitempty"`
	OK        *bool           `json:"ok,omitempty"`
	// ErrorKind is null or one of the closed list of tool error kinds
	// (tools.ErrorKinds; the JSON Schema's error_kind).
	ErrorKind *string `json:"error_kind"`
	Error     string  `json:"error,omitempty"`
	ExitCode  *int    `json:"exit_code"`
	Signal    string  `json:"signal,omitempty"`
	TimedOut  bool    `json:"timed_out,omitempty"`
	OOMKilled bool    `json:"oom_killed,omitempty"`
	// Output is exactly what the model saw.
	Output string `json:"output"`
	// Truncated says Output was cut to the task's cap; BytesDropped counts
	// the bytes of the full output the model did not see.
	Truncated    bool  `json:"truncated"`
	BytesDropped int64 `json:"bytes_dropped"`
	// Stdout and Stderr are the full streams, lossless, up to the storage
	// cap; StoredDropped counts what the storage cap dropped from each.
	Stdout              *Bytes `json:"stdout,omitempty"`
	Stderr              *Bytes `json:"stderr,omitempty"`
	StdoutStoredDropped int64  `json:"stdout_stored_dropped,omitempty"`
	StderrStoredDropped int64  `json:"stderr_stored_dropped,omitempty"`
	// Files written by the tool (path → sha256), for replay comparisons.
	Files map[string]string `json:"files,omitempty"`
}

// Usage is the token accounting of a model turn.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// Estimated is set when the server reported nothing and the numbers are
	// Rollbox's estimate.
	Estimated bool `json:"estimated,omitempty"`
}

// ContextEvent records something done to the model's context.
type ContextEvent struct {
	Step int    `json:"step"`
	Kind string `json:"kind"` // tool_output_truncated, context_truncated, context_overflow, pruned, prune_refused, read_refused
	// Detail is a human-readable description.
	Detail string   `json:"detail"`
	IDs    []string `json:"ids,omitempty"`
	Tokens int64    `json:"tokens,omitempty"`
}

// Termination is how the episode ended.
type Termination struct {
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
	// Step is the index of the last step recorded.
	Step int `json:"step"`
	// Answer and IDs are what finish was given.
	Answer *string  `json:"answer,omitempty"`
	IDs    []string `json:"ids,omitempty"`
}

// Reward is the outcome reward with its parts.
type Reward struct {
	Total      float64            `json:"total"`
	Components map[string]float64 `json:"components"`
	// Verifier is the verifier's own output, when one ran.
	Verifier *Verifier `json:"verifier,omitempty"`
	Details  []string  `json:"details,omitempty"`
}

// Verifier is a command the reward ran, and what it ran on.
type Verifier struct {
	Command    string  `json:"command"`
	ExitCode   int     `json:"exit_code"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	Stdout     *Bytes  `json:"stdout,omitempty"`
	Stderr     *Bytes  `json:"stderr,omitempty"`
	DurationMS float64 `json:"duration_ms"`
	// Restored and Removed are from records of the in-place verifier
	// (before clean-room verification); new records leave them empty.
	Restored []string `json:"restored,omitempty"`
	Removed  []string `json:"removed,omitempty"`
	// CleanRoom: the command ran in a fresh sandbox, not the agent's.
	CleanRoom bool `json:"clean_room,omitempty"`
	// Copied are the agent's files copied into the verifier's sandbox;
	// Deleted the task's files left out because the agent deleted them;
	// Added the hidden tests added.
	Copied  []string `json:"copied,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
	Added   []string `json:"added,omitempty"`
	// Skipped are what the agent left that was not copied, and why
	// (symlinks, special files, files over the size cap, runner
	// configuration, protected tests, ...).
	Skipped []Skip `json:"skipped,omitempty"`
	// Report is the format of the runner's report read, if any; Tests its
	// totals; Missing the must_pass tests it did not name; Failing those
	// that did not pass (capped).
	Report  string      `json:"report,omitempty"`
	Tests   *TestCounts `json:"tests,omitempty"`
	Missing []string    `json:"missing,omitempty"`
	Failing []string    `json:"failing,omitempty"`
	// Blame says why the reward is 0 because of what the agent left,
	// when the tests could not decide it (a workspace too large, an agent
	// file that does not fit, a report never written).
	Blame string `json:"blame,omitempty"`
	// Attempts is how many verifier sandboxes were made (a failure of the
	// infrastructure is retried once).
	Attempts int `json:"attempts,omitempty"`
	// CollectMS is the time spent reading the agent's files out.
	CollectMS float64 `json:"collect_ms,omitempty"`
}

// Skip is one path of the agent's workspace the verifier did not copy.
type Skip struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// TestCounts are the totals of a runner's report.
type TestCounts struct {
	Total   int `json:"total"`
	Passed  int `json:"passed"`
	Failed  int `json:"failed"`
	Skipped int `json:"skipped"`
}

// Stats are totals over the steps.
type Stats struct {
	Turns            int            `json:"turns"`
	ToolCalls        int            `json:"tool_calls"`
	ToolErrors       map[string]int `json:"tool_errors"`
	PromptTokens     int64          `json:"prompt_tokens"`
	CompletionTokens int64          `json:"completion_tokens"`
	ContextTokens    int64          `json:"context_tokens"`
	PolicyMS         float64        `json:"policy_ms"`
	ToolMS           float64        `json:"tool_ms"`
	DurationMS       float64        `json:"duration_ms"`
	// PolicyVersions counts model turns by the policy version that
	// produced them (absent when no turn carried a version).
	PolicyVersions map[string]int `json:"policy_versions,omitempty"`
}

// GroupStats are GRPO statistics of the episode's group.
type GroupStats struct {
	Size         int     `json:"size"`
	RewardMean   float64 `json:"reward_mean"`
	RewardStd    float64 `json:"reward_std"`
	Advantage    float64 `json:"advantage"`
	ZeroVariance bool    `json:"zero_variance"`
}

// Bytes is a byte string that survives JSON losslessly: valid UTF-8 is a
// plain JSON string, anything else {"base64": "..."}.
type Bytes []byte

// NewBytes returns a *Bytes of b (nil for nil).
func NewBytes(b []byte) *Bytes {
	if b == nil {
		return nil
	}
	v := Bytes(b)
	return &v
}

// MarshalJSON implements json.Marshaler.
func (b Bytes) MarshalJSON() ([]byte, error) {
	if utf8.Valid(b) {
		return json.Marshal(string(b))
	}
	return json.Marshal(map[string]string{"base64": base64.StdEncoding.EncodeToString(b)})
}

// UnmarshalJSON implements json.Unmarshaler.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		*b = Bytes(s)
		return nil
	}
	var o struct {
		Base64 *string `json:"base64"`
	}
	if err := json.Unmarshal(data, &o); err != nil || o.Base64 == nil {
		return fmt.Errorf("bytes: want a string or {\"base64\": ...}, got %.40s", data)
	}
	d, err := base64.StdEncoding.DecodeString(*o.Base64)
	if err != nil {
		return fmt.Errorf("bytes: %w", err)
	}
	*b = d
	return nil
}
