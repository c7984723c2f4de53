package runtime

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// SegmentRow is one token segment of a token-mode episode, the layout
// verl/OpenRLHF-style trainers read (export layout "segments"): the ids the
// model saw and sampled as one sequence, a loss mask (1 on sampled ids),
// the sampled ids' logprobs aligned with the ids, and the episode's reward
// and GRPO advantage (every segment of an episode carries the episode's).
// prompt_length splits input_ids into verl's prompts and responses:
// input_ids[:prompt_length] holds no sampled id.
type SegmentRow struct {
	EpisodeID  string `parquet:"episode_id" json:"episode_id"`
	RolloutID  string `parquet:"rollout_id" json:"rollout_id"`
	GroupID    string `parquet:"group_id" json:"group_id"`
	GroupIndex int32  `parquet:"group_index" json:"group_index"`
	TaskID     string `parquet:"task_id" json:"task_id"`
	// Segment is the segment's index in the episode, Segments how many the
	// episode has; StartTurn and EndTurn its first and last model turns;
	// Reason why it starts (start, pruned, context_truncated, template).
	Segment   int32   `parquet:"segment" json:"segment"`
	Segments  int32   `parquet:"segments" json:"segments"`
	StartTurn int32   `parquet:"start_turn" json:"start_turn"`
	EndTurn   int32   `parquet:"end_turn" json:"end_turn"`
	Reason    string  `parquet:"reason" json:"reason"`
	InputIDs  []int64 `parquet:"input_ids,list" json:"input_ids"`
	LossMask  []int32 `parquet:"loss_mask,list" json:"loss_mask"`
	// Logprobs has one entry per input id: the sampled id's log
	// probability under mask 1, 0 elsewhere. LogprobsComplete is false when
	// the server sent none for some turn (those entries are 0 too).
	Logprobs         []float64 `parquet:"logprobs,list" json:"logprobs"`
	LogprobsComplete bool      `parquet:"logprobs_complete" json:"logprobs_complete"`
	PromptLength     int32     `parquet:"prompt_length" json:"prompt_length"`
	// Reward is the episode's (null when unscored: never train on it);
	// Advantage its GRPO advantage once its group is complete.
	Scored      bool     `parquet:"scored" json:"scored"`
	Reward      *float64 `parquet:"reward,optional" json:"reward"`
	Advantage   *float64 `parquet:"advantage,optional" json:"advantage"`
	Termination string   `parquet:"termination" json:"termination"`
	// PolicyVersion is the version of the segment's first turn;
	// PolicyVersions one entry per turn of the segment.
	PolicyVersion  string   `parquet:"policy_version" json:"policy_version"`
	PolicyVersions []string `parquet:"policy_versions,list" json:"policy_versions"`
	// The tokenizer the ids belong to, for the trainer to check its own.
	TokenizerModel       string `parquet:"tokenizer_model" json:"tokenizer_model"`
	TokenizerRevision    string `parquet:"tokenizer_revision" json:"tokenizer_revision"`
	TokenizerFingerprint string `parquet:"tokenizer_fingerprint" json:"tokenizer_fingerprint"`
	TrajectorySchema     string `parquet:"trajectory_schema" json:"trajectory_schema"`
	// Source is rollout, env, production or an importer's label.
	Source string `parquet:"source" json:"source"`
}

// SegmentRowsOf flattens a token-mode trajectory into one row per
// segment; a chat-mode trajectory has none.
func SegmentRowsOf(t *trajectory.Trajectory) []SegmentRow {
	segs := t.Segments
	if segs == nil {
		segs, _ = trajectory.BuildSegments(t.Steps)
	}
	rows := make([]SegmentRow, 0, len(segs))
	for k, seg := range segs {
		row := SegmentRow{EpisodeID: t.EpisodeID, RolloutID: t.RolloutID, GroupID: t.GroupID, GroupIndex: int32(t.GroupIndex),
			TaskID: t.TaskID, Segment: int32(k), Segments: int32(len(segs)), StartTurn: int32(seg.StartTurn), EndTurn: int32(seg.EndTurn),
			Reason: seg.Reason, InputIDs: seg.Ids, LossMask: make([]int32, len(seg.LossMask)), Logprobs: make([]float64, len(seg.Ids)),
			LogprobsComplete: true, PromptLength: int32(len(seg.Ids)), PolicyVersions: []string{}, TrajectorySchema: t.Schema,
			Source: trajectory.SourceOf(t)}
		first := true
		for i, m := range seg.LossMask {
			row.LossMask[i] = int32(m)
			if m == 1 && first {
				row.PromptLength, first = int32(i), false
			}
		}
		pos := 0
		for _, s := range t.Steps {
			if s.Type != trajectory.StepModel || s.Segment == nil || *s.Segment != k {
				continue
			}
			if len(row.PolicyVersions) == 0 {
				row.PolicyVersion = s.PolicyVersion
			}
			row.PolicyVersions = append(row.PolicyVersions, s.PolicyVersion)
			pos += len(s.PromptIDs) + len(s.PromptDeltaIDs)
			var lps []float64
			if s.LogprobsAbsent || json.Unmarshal(s.Logprobs, &lps) != nil || len(lps) != len(s.CompletionIDs) {
				row.LogprobsComplete = false
				lps = nil
			}
			for j := range s.CompletionIDs {
				if lps != nil && pos+j < len(row.Logprobs) {
					row.Logprobs[pos+j] = lps[j]
				}
			}
			pos += len(s.CompletionIDs)
		}
		if t.Termination != nil {
			row.Termination = t.Termination.Reason
		}
		if v, ok := t.Value(); ok {
			row.Scored, row.Reward = true, &v
			if t.Group != nil {
				a := t.Group.Advantage
				row.Advantage = &a
			}
		}
		if tok := t.Policy.Tokenizer; tok != nil {
			row.TokenizerModel, row.TokenizerRevision, row.TokenizerFingerprint = tok.Model, tok.Revision, tok.Fingerprint
		}
		rows = append(rows, row)
	}
	return rows
}

// WriteSegmentsParquet writes segment rows as one Parquet file
// (zstd-compressed; lists as Parquet LIST columns).
func WriteSegmentsParquet(w io.Writer, rows []SegmentRow) error {
	pw := parquet.NewGenericWriter[SegmentRow](w, parquet.Compression(&parquet.Zstd))
	if _, err := pw.Write(rows); err != nil {
		return fmt.Errorf("parquet: %w", err)
	}
	if err := pw.Close(); err != nil {
		return fmt.Errorf("parquet: %w", err)
	}
	return nil
}

// WriteSegmentsJSONL writes segment rows one a line.
func WriteSegmentsJSONL(w io.Writer, rows []SegmentRow) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range rows {
		if err := enc.Encode(&rows[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Export layouts.
const (
	LayoutEpisodes = "episodes"
	LayoutSegments = "segments"
)

// WriteExport writes trajectories in format (jsonl, parquet) and layout
// (episodes: one trajectory or ExportRow each; segments: one SegmentRow
// per token segment).
func WriteExport(w io.Writer, ts []*trajectory.Trajectory, format, layout string) error {
	if layout == LayoutSegments {
		var rows []SegmentRow
		for _, t := range ts {
			rows = append(rows, SegmentRowsOf(t)...)
		}
		if format == "parquet" {
			return WriteSegmentsParquet(w, rows)
		}
		return WriteSegmentsJSONL(w, rows)
	}
	if format == "parquet" {
		rows := make([]ExportRow, len(ts))
		for i, t := range ts {
			rows[i] = RowOf(t)
		}
		return WriteParquet(w, rows)
	}
	return WriteJSONL(w, ts)
}
