package runtime

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/parquet-go/parquet-go"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// ExportRow is one episode as a flat row, the Parquet export's schema:
// identity, outcome and statistics as columns, the nested parts (reward
// components, tool errors, the conversation, the steps) as JSON strings.
type ExportRow struct {
	EpisodeID   string `parquet:"episode_id" json:"episode_id"`
	RolloutID   string `parquet:"rollout_id" json:"rollout_id"`
	GroupID     string `parquet:"group_id" json:"group_id"`
	GroupIndex  int32  `parquet:"group_index" json:"group_index"`
	TaskID      string `parquet:"task_id" json:"task_id"`
	TaskHash    string `parquet:"task_hash" json:"task_hash"`
	Seed        int64  `parquet:"seed" json:"seed"`
	Backend     string `parquet:"backend" json:"backend"`
	Image       string `parquet:"image" json:"image"`
	ImageDigest string `parquet:"image_digest" json:"image_digest"`
	PolicyModel string `parquet:"policy_model" json:"policy_model"`
	// Termination is the reason; TerminationMessage says more.
	Termination        string `parquet:"termination" json:"termination"`
	TerminationMessage string `parquet:"termination_message" json:"termination_message"`
	// Scored is false for infrastructure ends (no reward: RewardTotal null).
	Scored           bool     `parquet:"scored" json:"scored"`
	RewardTotal      *float64 `parquet:"reward_total,optional" json:"reward_total"`
	RewardComponents string   `parquet:"reward_components" json:"reward_components"` // JSON object
	// Group statistics (null until the group completes).
	GroupSize        *int32   `parquet:"group_size,optional" json:"group_size"`
	GroupRewardMean  *float64 `parquet:"group_reward_mean,optional" json:"group_reward_mean"`
	Advantage        *float64 `parquet:"advantage,optional" json:"advantage"`
	ZeroVariance     *bool    `parquet:"zero_variance,optional" json:"zero_variance"`
	Turns            int32    `parquet:"turns" json:"turns"`
	ToolCalls        int32    `parquet:"tool_calls" json:"tool_calls"`
	ToolErrors       string   `parquet:"tool_errors" json:"tool_errors"` // JSON object kind → count
	PromptTokens     int64    `parquet:"prompt_tokens" json:"prompt_tokens"`
	CompletionTokens int64    `parquet:"completion_tokens" json:"completion_tokens"`
	DurationMS       float64  `parquet:"duration_ms" json:"duration_ms"`
	StartedAtUnixMS  int64    `parquet:"started_at_unix_ms" json:"started_at_unix_ms"`
	Answer           *string  `parquet:"answer,optional" json:"answer"`
	Messages         string   `parquet:"messages" json:"messages"` // JSON array of chat messages
	Steps            string   `parquet:"steps" json:"steps"`       // JSON array of the trajectory's steps
	TrajectorySchema string   `parquet:"trajectory_schema" json:"trajectory_schema"`
	// Source is rollout, env, production or an importer's label;
	// PolicyVersion the version that produced the episode (an imported
	// episode's deployment's, else its turns' when they all agree).
	Source        string `parquet:"source" json:"source"`
	PolicyVersion string `parquet:"policy_version" json:"policy_version"`
	// OutcomeStatus is pending or scored for an imported episode (empty
	// otherwise); Signals its outcome signals (JSON array), Redactions
	// what was redacted at import (JSON array).
	OutcomeStatus string `parquet:"outcome_status" json:"outcome_status"`
	Signals       string `parquet:"signals" json:"signals"`
	Redactions    string `parquet:"redactions" json:"redactions"`
}

// exportMessage is a chat message of the export's messages column.
type exportMessage struct {
	Role       string                `json:"role"`
	Content    string                `json:"content"`
	ToolCalls  []trajectory.ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string                `json:"tool_call_id,omitempty"`
	Name       string                `json:"name,omitempty"`
}

// RowOf flattens a trajectory.
func RowOf(t *trajectory.Trajectory) ExportRow {
	row := ExportRow{EpisodeID: t.EpisodeID, RolloutID: t.RolloutID, GroupID: t.GroupID, GroupIndex: int32(t.GroupIndex),
		TaskID: t.TaskID, TaskHash: t.TaskHash, Seed: t.Seed, Backend: t.Sandbox.Backend, Image: t.Sandbox.Image,
		ImageDigest: t.Sandbox.ImageDigest, PolicyModel: t.Policy.Model, Turns: int32(t.Stats.Turns),
		ToolCalls: int32(t.Stats.ToolCalls), PromptTokens: t.Stats.PromptTokens, CompletionTokens: t.Stats.CompletionTokens,
		DurationMS: t.Stats.DurationMS, StartedAtUnixMS: t.StartedAt.UnixMilli(), TrajectorySchema: t.Schema,
		RewardComponents: "{}", ToolErrors: "{}", Source: trajectory.SourceOf(t), Signals: "[]", Redactions: "[]"}
	if t.Import != nil {
		row.PolicyVersion = t.Import.PolicyVersion
	} else if len(t.Stats.PolicyVersions) == 1 {
		for v := range t.Stats.PolicyVersions {
			row.PolicyVersion = v
		}
	}
	if o := t.Outcomes; o != nil {
		row.OutcomeStatus = o.Status
		b, _ := json.Marshal(o.Signals)
		row.Signals = string(b)
	}
	if len(t.Redactions) > 0 {
		b, _ := json.Marshal(t.Redactions)
		row.Redactions = string(b)
	}
	if t.Termination != nil {
		row.Termination, row.TerminationMessage, row.Answer = t.Termination.Reason, t.Termination.Message, t.Termination.Answer
	}
	if v, ok := t.Value(); ok {
		row.Scored = true
		row.RewardTotal = &v
	}
	if t.Reward != nil {
		if b, err := json.Marshal(t.Reward.Components); err == nil && t.Reward.Components != nil {
			row.RewardComponents = string(b)
		}
	}
	if len(t.Stats.ToolErrors) > 0 {
		b, _ := json.Marshal(t.Stats.ToolErrors)
		row.ToolErrors = string(b)
	}
	if g := t.Group; g != nil {
		size, mean, adv, zv := int32(g.Size), g.RewardMean, g.Advantage, g.ZeroVariance
		row.GroupSize, row.GroupRewardMean, row.Advantage, row.ZeroVariance = &size, &mean, &adv, &zv
	}
	b, _ := json.Marshal(Messages(t))
	row.Messages = string(b)
	b, _ = json.Marshal(t.Steps)
	row.Steps = string(b)
	return row
}

// Messages rebuilds the conversation from a trajectory: the task's system
// prompt when it set one, the user prompt, then each model turn and each
// tool result as the model saw it. Context edits made later (pruning,
// truncation to fit the budget) are in the trajectory's context events,
// not applied here.
func Messages(t *trajectory.Trajectory) []exportMessage {
	var task struct {
		Prompt string `json:"prompt"`
		System string `json:"system"`
	}
	json.Unmarshal(t.Task, &task)
	var out []exportMessage
	if task.System != "" {
		out = append(out, exportMessage{Role: "system", Content: task.System})
	}
	out = append(out, exportMessage{Role: "user", Content: task.Prompt})
	for _, s := range t.Steps {
		switch s.Type {
		case trajectory.StepModel:
			out = append(out, exportMessage{Role: "assistant", Content: s.Content, ToolCalls: s.ToolCalls})
		case trajectory.StepTool:
			out = append(out, exportMessage{Role: "tool", Content: s.Output, ToolCallID: s.CallID, Name: s.Name})
		case trajectory.StepUser:
			role := "user"
			if s.Name != "" {
				role = s.Name // a system or developer message within an imported conversation
			}
			out = append(out, exportMessage{Role: role, Content: s.Content})
		}
	}
	return out
}

// WriteParquet writes rows as one Parquet file (zstd-compressed).
func WriteParquet(w io.Writer, rows []ExportRow) error {
	pw := parquet.NewGenericWriter[ExportRow](w, parquet.Compression(&parquet.Zstd))
	if _, err := pw.Write(rows); err != nil {
		return fmt.Errorf("parquet: %w", err)
	}
	if err := pw.Close(); err != nil {
		return fmt.Errorf("parquet: %w", err)
	}
	return nil
}

// ReadParquet reads an export back.
func ReadParquet(r io.ReaderAt, size int64) ([]ExportRow, error) {
	return parquet.Read[ExportRow](r, size)
}

// WriteJSONL writes trajectories one a line.
func WriteJSONL(w io.Writer, ts []*trajectory.Trajectory) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, t := range ts {
		if err := enc.Encode(t); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// LoadEpisodes reads the trajectories in dir (DIR/episodes of a rollbox run
// or of the service's data directory), those of rolloutID when it is set,
// and attaches GRPO group statistics to the episodes of every complete
// group (all of a group's episodes are in the directory). Journals of
// episodes in flight are skipped; so are records that cannot be read
// (damaged, or written by a newer schema): each is named in skipped
// ("path: why") instead of failing the whole export.
func LoadEpisodes(dir, rolloutID string) (ts []*trajectory.Trajectory, skipped []string, err error) {
	pattern := "*.json"
	if rolloutID != "" {
		pattern = rolloutID + ".*.json"
	}
	paths, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		return nil, nil, err
	}
	var out []*trajectory.Trajectory
	for _, p := range paths {
		if strings.HasSuffix(p, ".tmp") {
			continue
		}
		t, err := trajectory.Read(p)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		if rolloutID != "" && t.RolloutID != rolloutID {
			continue
		}
		out = append(out, t)
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GroupID != out[j].GroupID {
			return out[i].GroupID < out[j].GroupID
		}
		return out[i].GroupIndex < out[j].GroupIndex
	})
	AttachGroupStats(out)
	return out, skipped, nil
}

// AttachGroupStats sets Group on every trajectory whose group is all
// present (GroupIndex 0..n-1 with n the number of episodes of that group),
// with the service's statistics: mean over scored episodes, advantage =
// reward − mean (0 for an unscored episode), zero-variance flagged.
func AttachGroupStats(ts []*trajectory.Trajectory) {
	groups := map[string][]*trajectory.Trajectory{}
	for _, t := range ts {
		groups[t.GroupID] = append(groups[t.GroupID], t)
	}
	for _, g := range groups {
		st := GroupStatistics(g)
		for _, t := range g {
			gs := &trajectory.GroupStats{Size: len(g), RewardMean: st.RewardMean, RewardStd: st.RewardStd, ZeroVariance: st.ZeroVariance, Monitors: st.Monitors}
			if v, ok := t.Value(); ok {
				gs.Advantage = v - st.RewardMean
			}
			if t.Group == nil {
				t.Group = gs
			}
		}
	}
}
