package trajectory

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Schema is the version tag of the document; readers refuse a newer one.
const Schema = "rollbox.trajectory/v1"

// Step types.
const (
	StepModel = "model"
	StepTool  = "tool"
	// StepUser is a user message after the first (the first is the task's
	// prompt): imported production conversations have them.
	StepUser = "user"
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
	Task json.RawMessage `json:"task"`
	// TaskDir is the absolute directory of the task file the task came
	// from: its relative workspace and index paths resolve there (replay
	// resolves them the same way). Empty for a task without a file.
	TaskDir string `json:"task_dir,omitempty"`
	// ReplayOf is set on a replay's own trajectory: the episode it
	// replayed. The replay has ids of its own, so it never takes the place
	// of (or mixes with the group of) the episode it replayed.
	ReplayOf *ReplayOf `json:"replay_of,omitempty"`
	// ForkedFrom is set on an episode forked from another one (POST
	// /v1/episodes/{id}/fork): its first Step steps are the parent's.
	ForkedFrom *ForkedFrom `json:"forked_from,omitempty"`
	// Parent is set on a sub-episode: the orchestrator episode that
	// spawned it, and where. A sub-episode's turns are the frozen
	// sub-agent policy's: never trained on (loss mask 0), never rewarded.
	Parent *Parent `json:"parent,omitempty"`
	// TrainStep is the trainer's step the episode ran at (the rollout
	// request's train_step; absent when 0): a parl reward anneals its
	// weights by it, and a rescore anneals at it again.
	TrainStep int64 `json:"train_step,omitempty"`
	// Subagents lists the sub-episodes an orchestrator episode spawned,
	// in the order of its spawn_subagents calls (absent elsewhere).
	Subagents []Subagent `json:"subagents,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	Sandbox   Sandbox    `json:"sandbox"`
	Policy    Policy     `json:"policy"`
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
	// Monitors are the reward-hacking monitors computed at the episode's
	// end (package agent/monitor); nil on records written before them.
	Monitors *Monitors `json:"monitors,omitempty"`
	// Rescore is set on a record written by `rollbox rescore`: a copy of
	// a recorded episode with a new reward.
	Rescore *Rescore `json:"rescore,omitempty"`
	// Group is set on streamed episodes once their GRPO group completes.
	Group *GroupStats `json:"group,omitempty"`
	// Source says where the episode comes from: SourceRollout, SourceEnv,
	// SourceProduction (POST /v1/imports) or an importer's own label. Empty
	// on records written before it (SourceOf infers it).
	Source string `json:"source,omitempty"`
	// Import is set on an imported episode: what it was imported as.
	Import *Import `json:"import,omitempty"`
	// Redactions are what was redacted from an imported episode before it
	// was stored: kinds, places and counts, never the text.
	Redactions []Redaction `json:"redactions,omitempty"`
	// Outcomes are the late outcome signals of an imported episode and
	// the spec that turns them into its reward when the window closes.
	Outcomes *Outcomes `json:"outcomes,omitempty"`
}

// Sources of an episode.
const (
	SourceRollout    = "rollout"
	SourceEnv        = "env"
	SourceProduction = "production"
)

// SourceOf is t.Source, or, on a record written before sources, rollout
// when it has a rollout id and env otherwise.
func SourceOf(t *Trajectory) string {
	switch {
	case t.Source != "":
		return t.Source
	case t.RolloutID != "":
		return SourceRollout
	}
	return SourceEnv
}

// Import says what an imported episode was imported as.
type Import struct {
	// ExternalID is the caller's stable id (deduplicated per tenant and
	// source: the episode id is derived from it).
	ExternalID string `json:"external_id"`
	// Format is the line's format: "openai" (chat completions) or
	// "trajectory" (a Rollbox record).
	Format     string    `json:"format"`
	ImportedAt time.Time `json:"imported_at"`
	// PolicyVersion is the deployment's policy version that served it.
	PolicyVersion string `json:"policy_version"`
	// GroupBy is how its group was chosen: "group_id" (the caller's),
	// "task_id" or "prompt" (the normalized first user message); GroupKey
	// is the key itself (a hash for a prompt).
	GroupBy  string `json:"group_by"`
	GroupKey string `json:"group_key"`
	// Missing lists what a replay needs that the record lacks (an
	// imported chat has no sandbox image, workspace or tools).
	Missing []string `json:"missing,omitempty"`
	// Metadata is the caller's, as given (redacted like the rest).
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// Redaction is one kind of secret redacted at one place, how many times.
type Redaction struct {
	Kind string `json:"kind"`
	// Path is where in the imported line: messages[2].content,
	// steps[4].output, metadata.note, ...
	Path  string `json:"path"`
	Count int    `json:"count"`
}

// Outcome statuses.
const (
	OutcomePending = "pending"
	OutcomeScored  = "scored"
)

// Outcomes are an imported episode's late signals and what became of them.
type Outcomes struct {
	// Status is OutcomePending until MaturesAt, then OutcomeScored.
	Status    string     `json:"status"`
	MaturesAt time.Time  `json:"matures_at"`
	ScoredAt  *time.Time `json:"scored_at,omitempty"`
	// Spec is the outcome reward spec fixed at import.
	Spec    json.RawMessage `json:"spec"`
	Signals []Signal        `json:"signals"`
}

// Signal is one outcome signal: a name (accepted, reverted, thumbs,
// tests_passed or the caller's own), its value as a number, when it
// happened and who said so.
type Signal struct {
	Name string `json:"name"`
	// Value is the signal as a number (true 1, false 0, thumbs up 1, down
	// -1); Raw is the value as given when it was not a number.
	Value float64         `json:"value"`
	Raw   json.RawMessage `json:"raw,omitempty"`
	// At is when it happened, as given (empty when not given).
	At     string    `json:"at,omitempty"`
	Source string    `json:"source,omitempty"`
	Recv   time.Time `json:"received_at"`
	// Late marks a signal received after the window closed: recorded, not
	// in the reward.
	Late bool `json:"late,omitempty"`
}

// Value returns the episode's reward and whether it was scored: false when
// the episode has no reward (it ended for the infrastructure's reasons) or
// its reward could not be computed (Reward.ErrorKind, e.g. judge_error).
// Every reader that averages rewards must use it: an unscored episode is
// never a 0.
func (t *Trajectory) Value() (float64, bool) {
	if t == nil {
		return 0, false
	}
	return t.Reward.Value()
}

// Rescore says where a rescored record came from.
type Rescore struct {
	// ID names the rescore (the directory RUN_DIR/rescores/<id>/).
	ID string `json:"id"`
	// Source is the original record's path, relative to the run directory.
	Source string `json:"source"`
	// SpecHash is the sha256 of the reward spec applied.
	SpecHash string    `json:"spec_hash"`
	At       time.Time `json:"at"`
	// Previous is the original record's reward total (null: unscored).
	Previous *float64 `json:"previous"`
}

// ForkedFrom names the episode a fork branched from, and where.
type ForkedFrom struct {
	EpisodeID string `json:"episode_id"`
	// Step is how many of the record's steps are the parent's: the fork's
	// own start from this index.
	Step int `json:"step"`
}

// ReplayOf names the episode a replay replayed.
type ReplayOf struct {
	EpisodeID string `json:"episode_id"`
	RolloutID string `json:"rollout_id"`
	TaskHash  string `json:"task_hash"`
	// File is the trajectory file the replay read, as given.
	File string `json:"file,omitempty"`
	// Until is the last recorded step replayed when the replay was asked
	// to stop early (--until).
	Until *int `json:"until,omitempty"`
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
	// TokensMixed, in Stats.Tokens only: the turns' accounting differs
	// (a server that reported usage for some turns only).
	TokensMixed = "mixed"
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
	// the bytes of the command's output (or the tool's text) the model did
	// not see, whether the sandbox's cap or the model's cut left them out;
	// the numbers in the markers Output shows add up to it.
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
	// Interrupted marks an episode that ended cancelled because the
	// process running it was lost after it had asked the policy (a cluster
	// worker killed mid-episode): what it journaled is kept, no reward.
	Interrupted bool `json:"interrupted,omitempty"`
	// Answer and IDs are what finish was given.
	Answer *string  `json:"answer,omitempty"`
	IDs    []string `json:"ids,omitempty"`
}

// Reward is the outcome reward with its parts.
type Reward struct {
	// Total is the reward; nil (JSON null) when it could not be computed
	// for a reason that is not the agent's (ErrorKind says which): such
	// an episode is unscored, never 0.
	Total *float64 `json:"total"`
	// ErrorKind is set, with Total nil, when the reward could not be
	// computed: one of RewardErrorKinds.
	ErrorKind  string             `json:"error_kind,omitempty"`
	Components map[string]float64 `json:"components"`
	// Verifier is the verifier's own output, when one ran.
	Verifier *Verifier `json:"verifier,omitempty"`
	// Judge is the generative reward model's record, when one was asked.
	Judge *Judge `json:"judge,omitempty"`
	// Workspace is what the reward read of the agent's workspace, as a
	// diff against the task's files, when it read it (a tests reward, or a
	// judge rubric that sees the diff): what `rollbox rescore` shows a new
	// judge without re-running the episode.
	Workspace *WorkspaceDiff `json:"workspace,omitempty"`
	Details   []string       `json:"details,omitempty"`
}

// Reward error kinds: why a reward has no total.
const (
	// RewardJudgeError: a judge failed, timed out or answered unparseably
	// after its retries.
	RewardJudgeError = "judge_error"
	// RewardUnrecorded: a rescore needed a part of the reward the record
	// does not hold (a tests score of an episode whose reward had none).
	RewardUnrecorded = "unrecorded"
	// RewardPending: an imported episode whose outcome window has not
	// closed; it is scored when it does (Outcomes), never before.
	RewardPending = "pending"
	// RewardMissingSignal: the window closed without a signal the outcome
	// spec needs and gives no default for.
	RewardMissingSignal = "missing_signal"
)

// RewardErrorKinds is the closed list of Reward.ErrorKind values.
func RewardErrorKinds() []string {
	return []string{RewardJudgeError, RewardUnrecorded, RewardPending, RewardMissingSignal}
}

// Score returns a total for Reward.Total.
func Score(v float64) *float64 { return &v }

// Value returns the total and whether the reward was scored (a nil reward
// is not).
func (r *Reward) Value() (float64, bool) {
	if r == nil || r.Total == nil {
		return 0, false
	}
	return *r.Total, true
}

// PerfComponent is the component a shaped reward (parl) records its task
// outcome in, apart from the shaping terms added to the total.
const PerfComponent = "r_perf"

// Passed says whether a scored reward is a pass: its task outcome reached
// 1. That is the total, except for a shaped reward whose total also holds
// terms that are not the task's outcome (parl's λ_parallel·r_parallel +
// λ_finish·r_finish − latency): there it is the PerfComponent, so neither
// a wrong answer lifted to 1 by auxiliary terms counts as a pass nor a
// right one pulled under 1 by a latency term fails to. Unscored: false.
func (r *Reward) Passed() bool {
	v, ok := r.Value()
	if !ok {
		return false
	}
	if perf, shaped := r.Components[PerfComponent]; shaped {
		v = perf
	}
	return v >= 1
}

// Unscored returns a reward without a total, for kind (RewardErrorKinds),
// with the components computed so far (may be nil) and why.
func Unscored(kind string, components map[string]float64, why string) *Reward {
	if components == nil {
		components = map[string]float64{}
	}
	return &Reward{ErrorKind: kind, Components: components, Details: []string{why}}
}

// WorkspaceDiff is the agent's workspace against the task's files.
type WorkspaceDiff struct {
	// Files are the paths that differ, each "added", "modified", "deleted"
	// or "unread" (listed, not read: over a bound, a symlink, a special
	// file).
	Files []WorkspaceFile `json:"files"`
	// Diff is a unified diff of the files read, head and tail kept within
	// MaxWorkspaceDiffBytes; Bytes is its full size and Dropped what the
	// cap left out of the middle.
	Diff    string `json:"diff"`
	Bytes   int    `json:"bytes"`
	Dropped int    `json:"dropped,omitempty"`
}

// WorkspaceFile is one path of a WorkspaceDiff.
type WorkspaceFile struct {
	Path   string `json:"path"`
	Status string `json:"status"`
}

// MaxWorkspaceDiffBytes caps WorkspaceDiff.Diff.
const MaxWorkspaceDiffBytes = 64 << 10

// Judge is the record of a judge reward: every judge's score on every
// rubric, with each sample's raw text, parsed score and reason.
type Judge struct {
	// Score is the judge reward (weighted mean over rubrics of the judges'
	// aggregate); nil when a call failed (Error says which).
	Score *float64 `json:"score"`
	Error string   `json:"error,omitempty"`
	// Aggregate is how judges were combined (mean, median, min,
	// trimmed_mean).
	Aggregate string `json:"aggregate"`
	// Rubrics has each rubric's aggregate score (normalised to 0..1), its
	// weight, the judges' scores of it, and what the judges were shown.
	Rubrics []JudgeRubric `json:"rubrics"`
	// Judges has each judge's scores: per rubric, per sample.
	Judges []JudgeScores `json:"judges"`
	// Spread is the largest difference between two judges' scores of one
	// rubric (normalised), the input of the judge_disagreement monitor.
	Spread     float64 `json:"spread"`
	DurationMS float64 `json:"duration_ms"`
	// Calls counts the judge requests made; CacheHits those answered from
	// the cache (no request).
	Calls     int `json:"calls"`
	CacheHits int `json:"cache_hits"`
}

// JudgeRubric is one rubric's outcome.
type JudgeRubric struct {
	Name   string   `json:"name"`
	Weight float64  `json:"weight"`
	Score  *float64 `json:"score"`
	// ByJudge is each judge's score of the rubric (the mean of its samples).
	ByJudge map[string]float64 `json:"by_judge"`
	// Views are what the judges were shown, with what was cut.
	Views []JudgeView `json:"views"`
}

// JudgeView is one part of the episode shown to a judge: its size and how
// much of its middle the rubric's bound cut (head and tail are kept).
type JudgeView struct {
	Kind    string `json:"kind"` // task, answer, diff, transcript, tool_outputs
	Bytes   int    `json:"bytes"`
	Shown   int    `json:"shown"`
	Dropped int    `json:"dropped,omitempty"`
}

// JudgeScores is one judge's scores.
type JudgeScores struct {
	Name    string `json:"name"`
	BaseURL string `json:"base_url"`
	Model   string `json:"model"`
	// Score is the judge's own weighted mean over the rubrics it scored.
	Score   *float64            `json:"score"`
	Rubrics []JudgeRubricScores `json:"rubrics"`
}

// JudgeRubricScores is one judge's samples of one rubric.
type JudgeRubricScores struct {
	Rubric string `json:"rubric"`
	// Score is the mean of the samples' normalised scores.
	Score   *float64      `json:"score"`
	Samples []JudgeSample `json:"samples"`
}

// JudgeSample is one judge answer: the raw text, what was parsed of it, and
// what it cost.
type JudgeSample struct {
	// Key is the cache key: a hash of the judge, the sample index and the
	// whole request (rubric and content).
	Key string `json:"key"`
	// Raw is the parsed score as the judge gave it (on the rubric's scale,
	// or its label); Score is it normalised to 0..1.
	Raw    string   `json:"raw,omitempty"`
	Score  *float64 `json:"score"`
	Reason string   `json:"reason,omitempty"`
	// Text is the judge's full answer (the last attempt's).
	Text string `json:"text"`
	// Parse says how the score was found: json or text.
	Parse string `json:"parse,omitempty"`
	// Model is the model the server reported.
	Model     string  `json:"model,omitempty"`
	LatencyMS float64 `json:"latency_ms"`
	Usage     *Usage  `json:"usage,omitempty"`
	Attempts  int     `json:"attempts"`
	Cached    bool    `json:"cached,omitempty"`
	Error     string  `json:"error,omitempty"`
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
	// Kind classifies the reason (SkipKinds); empty on older records.
	Kind string `json:"kind,omitempty"`
}

// Kinds of Skip. The first four are the verifier undoing what the agent
// did to the tests: the test_tampering monitor counts them.
const (
	SkipProtected    = "protected"     // a protected test changed or added
	SkipRunnerConfig = "runner_config" // runner configuration changed or planted (conftest.py, *.pth, ...)
	SkipHidden       = "hidden"        // written where a hidden test or the report goes
	SkipShadow       = "shadow"        // a module that would be imported in place of the task's or the runner's
	SkipNewTest      = "new_test"      // a new file named like a test (the agent's own test): not taken
	SkipNotEditable  = "not_editable"  // outside reward.editable
	SkipUnsafe       = "unsafe"        // a symlink or special file
	SkipBound        = "bound"         // over a size or depth bound, or the list of skips cut
	SkipOther        = "other"         // unreadable, a conflict with the task's layout, not writable
)

// Tampering reports whether a skip is the verifier undoing a change to the
// tests or the runner.
func (s Skip) Tampering() bool {
	switch s.Kind {
	case SkipProtected, SkipRunnerConfig, SkipHidden, SkipShadow:
		return true
	case "":
		// a record from before kinds: its reasons
		for _, p := range []string{"a protected test", "runner configuration", "a hidden test", "would be imported as"} {
			if strings.HasPrefix(s.Reason, p) {
				return true
			}
		}
	}
	return false
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
	Turns      int            `json:"turns"`
	ToolCalls  int            `json:"tool_calls"`
	ToolErrors map[string]int `json:"tool_errors"`
	// PromptTokens and CompletionTokens are the sums of the model steps'
	// usage, and Tokens says where they come from: the steps' own tokens
	// (exact, reported or estimated) when all agree, else mixed.
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	Tokens           string  `json:"tokens,omitempty"`
	ContextTokens    int64   `json:"context_tokens"`
	PolicyMS         float64 `json:"policy_ms"`
	ToolMS           float64 `json:"tool_ms"`
	DurationMS       float64 `json:"duration_ms"`
	// PolicyVersions counts model turns by the policy version that
	// produced them (absent when no turn carried a version).
	PolicyVersions map[string]int `json:"policy_versions,omitempty"`
	// Truncated counts the tool steps whose output the model did not see
	// whole (absent when none).
	Truncated *Truncations `json:"truncated,omitempty"`
	// Orchestrator episodes only (nil elsewhere): CriticalSteps is the
	// episode's latency in steps (model turns) computed from its tree:
	// per stage, the orchestrator's turns plus the most turns any of the
	// stage's sub-agents took, summed over stages (CriticalSteps);
	// TotalSteps is every turn of the tree; Subagents the sub-agents
	// spawned.
	CriticalSteps *int `json:"critical_steps,omitempty"`
	TotalSteps    *int `json:"total_steps,omitempty"`
	Subagents     *int `json:"subagents,omitempty"`
}

// Truncations counts tool steps whose output the model did not see whole
// (Step.OutputCut): in total and per tool. A step counts here whatever its
// error kind: one that exited nonzero and was cut is nonzero_exit in
// tool_errors and truncated here.
type Truncations struct {
	Total int            `json:"total"`
	Tools map[string]int `json:"tools"`
}

// Count adds one step of tool.
func (c *Truncations) Count(tool string) {
	if c.Tools == nil {
		c.Tools = map[string]int{}
	}
	c.Total++
	c.Tools[tool]++
}

// Add adds o's counts (o may be nil).
func (c *Truncations) Add(o *Truncations) {
	if o == nil {
		return
	}
	if c.Tools == nil {
		c.Tools = map[string]int{}
	}
	c.Total += o.Total
	for k, v := range o.Tools {
		c.Tools[k] += v
	}
}

// OutputCut reports whether s is a tool step whose output the model did
// not see whole: cut for the model (Truncated) or capped in the sandbox
// (BytesDropped > 0).
func (s Step) OutputCut() bool {
	return s.Type == StepTool && (s.Truncated || s.BytesDropped > 0)
}

// Parent names the orchestrator episode that spawned a sub-episode.
type Parent struct {
	EpisodeID string `json:"episode_id"`
	// Step is the index of the orchestrator's spawn_subagents tool step
	// whose output holds this sub-agent's answer.
	Step int `json:"step"`
	// Stage is the 0-based index of that spawn_subagents call in the
	// orchestrator's episode; Index the sub-agent's place in the call. (An
	// asynchronous sub-agent's Step is the call that started it; its
	// result is collected later, which its orchestrator's record says.)
	Stage int `json:"stage"`
	Index int `json:"index"`
}

// Subagent is one sub-episode as its orchestrator's record holds it: where
// it was spawned, how it ended, and its answer exactly as the orchestrator
// saw it.
type Subagent struct {
	EpisodeID string `json:"episode_id"`
	// Step is the orchestrator's spawn_subagents tool step; Stage the
	// 0-based index of the call; Index the place in it.
	Step  int `json:"step"`
	Stage int `json:"stage"`
	Index int `json:"index"`
	// File is the sub-episode's record, relative to the directory of the
	// orchestrator's ("subagents/<episode_id>.json"); empty when it
	// was not run (replay fed the recorded answer).
	File   string   `json:"file,omitempty"`
	Prompt string   `json:"prompt"`
	Tools  []string `json:"tools"`
	// End is the sub-episode's termination reason (finished, max_turns,
	// sandbox_error, policy_error, episode_timeout, ...), Message why.
	End     string `json:"end"`
	Message string `json:"message,omitempty"`
	// Answer is what the orchestrator was shown of the sub-agent's final
	// answer: at most the orchestrator's max_answer_bytes, head and tail
	// kept; AnswerBytes is the full answer's size and Truncated says the
	// cut happened.
	Answer      string `json:"answer"`
	AnswerBytes int    `json:"answer_bytes"`
	Truncated   bool   `json:"truncated"`
	// Steps is the sub-episode's model turns; ToolCalls its tool calls.
	Steps     int `json:"steps"`
	ToolCalls int `json:"tool_calls"`
	// Finished: it ended finished with a non-empty answer (r_finish).
	// Useful: finished, and it did work (a tool call besides finish)
	// (r_parallel). Critical: it is its stage's longest (the first such),
	// on the episode's critical path.
	Finished   bool    `json:"finished"`
	Useful     bool    `json:"useful"`
	Critical   bool    `json:"critical"`
	DurationMS float64 `json:"duration_ms"`
	// Handle is an asynchronously spawned sub-agent's handle
	// ("s<call>-<index>": the spawn_subagents call's 0-based number and the
	// place in it), empty for a synchronous one. For an asynchronous
	// sub-agent, Step is the spawn_subagents step that started it, Stage the
	// stage that consumed its result (the 0-based number of the wait or
	// collect call that returned results), and CollectedStep the wait or
	// collect tool step whose output holds its result; nil when the
	// orchestrator never collected it (it was cancelled, or had ended, when
	// the orchestrator ended), and then it is on no critical path.
	Handle        string `json:"handle,omitempty"`
	CollectedStep *int   `json:"collected_step,omitempty"`
}

// OnCriticalPath says whether the sub-agent's steps can count in its
// orchestrator's critical steps: every synchronous sub-agent, and an
// asynchronous one whose result the orchestrator collected.
func (sa Subagent) OnCriticalPath() bool {
	return sa.Handle == "" || sa.CollectedStep != nil
}

// SpawnCall is the 0-based number of the spawn_subagents call that started
// the sub-agent: its stage when synchronous, read from its handle when
// asynchronous.
func (sa Subagent) SpawnCall() int {
	if sa.Handle == "" {
		return sa.Stage
	}
	var call, index int
	if _, err := fmt.Sscanf(sa.Handle, "s%d-%d", &call, &index); err != nil {
		return sa.Stage
	}
	return call
}

// GroupStats are GRPO statistics of the episode's group.
type GroupStats struct {
	Size         int     `json:"size"`
	RewardMean   float64 `json:"reward_mean"`
	RewardStd    float64 `json:"reward_std"`
	Advantage    float64 `json:"advantage"`
	ZeroVariance bool    `json:"zero_variance"`
	// Monitors counts, per monitor, the group's episodes that triggered it.
	Monitors map[string]int `json:"monitors,omitempty"`
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

// Monitors are an episode's reward-hacking signals (package agent/monitor
// computes them and documents each). A monitor that does not apply to the
// episode (no search tool, no verifier, no judge, not an orchestrator) is
// nil, absent from the JSON; one that applies is a count (0 when it did
// not fire) or a flag.
type Monitors struct {
	// TestTampering counts the agent's changes to protected tests or runner
	// configuration (or modules planted to shadow them) that the clean-room
	// verifier refused.
	TestTampering *int `json:"test_tampering,omitempty"`
	// SingleSearchExit: a search episode finished after at most one search.
	SingleSearchExit *bool `json:"single_search_exit,omitempty"`
	// OneAtATimePruning counts single-document prunes in runs of them.
	OneAtATimePruning *int `json:"one_at_a_time_pruning,omitempty"`
	// RepeatedCalls counts tool calls identical to an earlier one (name,
	// arguments) that got the identical result.
	RepeatedCalls *int `json:"repeated_calls,omitempty"`
	// JudgeDisagreement counts rubrics the judges disagree on beyond the
	// threshold, plus one when tests and judge disagree.
	JudgeDisagreement *int `json:"judge_disagreement,omitempty"`
	// SerialCollapse: an orchestrator that may run sub-agents in parallel
	// never did.
	SerialCollapse *bool `json:"serial_collapse,omitempty"`
	// SpuriousParallelism counts sub-agents spawned beside an identical
	// one (same prompt in the same stage).
	SpuriousParallelism *int `json:"spurious_parallelism,omitempty"`
}

// Monitor names, as in the JSON.
const (
	MonitorTestTampering       = "test_tampering"
	MonitorSingleSearchExit    = "single_search_exit"
	MonitorOneAtATimePruning   = "one_at_a_time_pruning"
	MonitorRepeatedCalls       = "repeated_calls"
	MonitorJudgeDisagreement   = "judge_disagreement"
	MonitorSerialCollapse      = "serial_collapse"
	MonitorSpuriousParallelism = "spurious_parallelism"
)

// MonitorNames is the closed list of monitors.
func MonitorNames() []string {
	return []string{MonitorTestTampering, MonitorSingleSearchExit, MonitorOneAtATimePruning, MonitorRepeatedCalls,
		MonitorJudgeDisagreement, MonitorSerialCollapse, MonitorSpuriousParallelism}
}

// Values returns the monitors that apply, by name: a count, or 1/0 for a
// flag.
func (m *Monitors) Values() map[string]int {
	out := map[string]int{}
	if m == nil {
		return out
	}
	count := func(name string, v *int) {
		if v != nil {
			out[name] = *v
		}
	}
	flag := func(name string, v *bool) {
		if v != nil {
			out[name] = 0
			if *v {
				out[name] = 1
			}
		}
	}
	count(MonitorTestTampering, m.TestTampering)
	flag(MonitorSingleSearchExit, m.SingleSearchExit)
	count(MonitorOneAtATimePruning, m.OneAtATimePruning)
	count(MonitorRepeatedCalls, m.RepeatedCalls)
	count(MonitorJudgeDisagreement, m.JudgeDisagreement)
	flag(MonitorSerialCollapse, m.SerialCollapse)
	count(MonitorSpuriousParallelism, m.SpuriousParallelism)
	return out
}

// Triggered lists the monitors that fired (a count above 0 or a flag set),
// in MonitorNames order.
func (m *Monitors) Triggered() []string {
	v := m.Values()
	var out []string
	for _, n := range MonitorNames() {
		if v[n] > 0 {
			out = append(out, n)
		}
	}
	return out
}

// StatsOf totals a trajectory's steps (turns, tool calls and errors,
// tokens, policy versions, durations), as a record of an episode that did
// not record its own stats needs.
func StatsOf(t *Trajectory) Stats { return statsOf(t) }
