package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// SubagentLeftovers lists what a stopped process left of its
// orchestrators' sub-episodes in dir (an episodes directory), for
// RecoverSubagents: list it, and the orchestrators' journals, before any
// new episode starts in dir.
func SubagentLeftovers(dir string) (*trajectory.Leftovers, error) {
	return trajectory.FindLeftovers(filepath.Join(dir, SubagentsDir))
}

// RecoverSubagents accounts for the sub-episodes a stopped process left in
// dir (an episodes directory: orchestrators' journals in it, their
// sub-episodes under dir/subagents), before the orchestrators' own journals
// are recovered (orchestrators.Recover): of the orchestrators whose
// journals are listed in orchestrators, with their sub-episodes' journals
// listed in subs (SubagentLeftovers), never another's:
//
//   - every sub-episode journal becomes its record, interrupted like its
//     parent, with the steps it had recorded;
//   - every sub-episode whose orchestrator's journal does not list it
//     (a synchronous call's sub-agents are listed when the call returns,
//     an asynchronous one's when collected) is appended to that journal as
//     the record shows it ended, so the recovered orchestrator names every
//     one of its sub-episodes and counts them in its stats.
//
// It is idempotent: a crash in the middle is finished by the next call. It
// returns the ids of the sub-episodes it added to their orchestrators.
func RecoverSubagents(dir string, orchestrators, subs *trajectory.Leftovers) (added []string, err error) {
	subDir := filepath.Join(dir, SubagentsDir)
	if _, err := os.Stat(subDir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var errs []error
	if _, _, err := subs.Recover(); err != nil {
		errs = append(errs, err)
	}
	left := make(map[string]bool, len(orchestrators.Journals))
	for _, p := range orchestrators.Journals {
		left[p] = true
	}
	records, err := filepath.Glob(filepath.Join(subDir, "*.json"))
	if err != nil {
		return nil, err
	}
	children := map[string][]string{} // orchestrator journal → its sub-episodes' records
	for _, p := range records {
		id := strings.TrimSuffix(filepath.Base(p), ".json")
		i := strings.LastIndex(id, ".s")
		if i <= 0 {
			continue
		}
		partial := filepath.Join(dir, id[:i]+trajectory.PartialSuffix)
		if !left[partial] {
			continue // ended, or an orchestrator of this process's
		}
		if _, err := os.Stat(partial); err == nil {
			children[partial] = append(children[partial], p)
		}
	}
	for partial, paths := range children {
		ids, err := recoverChildren(partial, paths)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", partial, err))
		}
		added = append(added, ids...)
	}
	slices.Sort(added)
	return added, errors.Join(errs...)
}

// recoverChildren appends to an orchestrator's journal the sub-episodes
// (records at paths) it does not list.
func recoverChildren(partial string, paths []string) ([]string, error) {
	parent, err := trajectory.Recover(partial)
	if err != nil {
		return nil, err
	}
	listed := map[string]bool{}
	nextStage := 0 // an asynchronous orchestrator's stages so far
	for _, sa := range parent.Subagents {
		listed[sa.EpisodeID] = true
		if sa.CollectedStep != nil {
			nextStage = max(nextStage, sa.Stage+1)
		}
	}
	var task struct {
		Orchestrator *Orchestrator `json:"orchestrator"`
	}
	json.Unmarshal(parent.Task, &task)
	o := Orchestrator{}
	if task.Orchestrator != nil {
		o = *task.Orchestrator
	}
	o.withDefaults()
	var missing []trajectory.Subagent
	for _, p := range paths {
		tr, err := trajectory.Read(p)
		if err != nil {
			return nil, err
		}
		if tr.Parent == nil || tr.Parent.EpisodeID != parent.EpisodeID || listed[tr.EpisodeID] {
			continue
		}
		var st struct {
			Prompt string   `json:"prompt"`
			Tools  []string `json:"tools"`
		}
		json.Unmarshal(tr.Task, &st)
		if st.Tools == nil {
			st.Tools = []string{}
		}
		sa := trajectory.Subagent{EpisodeID: tr.EpisodeID, Step: tr.Parent.Step, Stage: tr.Parent.Stage, Index: tr.Parent.Index,
			File: filepath.ToSlash(filepath.Join(SubagentsDir, tr.EpisodeID+".json")), Prompt: st.Prompt, Tools: st.Tools,
			DurationMS: tr.Stats.DurationMS}
		summarizeSubagent(&sa, tr, o.MaxAnswerBytes)
		if sa.End != trajectory.EndInterrupted {
			sa.Message = strings.TrimPrefix(sa.Message+"; its orchestrator stopped before it was given this result", "; ")
		}
		if o.Async {
			// Never collected: on no critical path, in the stage after the
			// last one collected (as an orchestrator ending leaves it).
			sa.Handle = fmt.Sprintf("s%d-%d", tr.Parent.Stage, tr.Parent.Index)
			sa.Stage = nextStage
		}
		missing = append(missing, sa)
	}
	if len(missing) == 0 {
		return nil, nil
	}
	slices.SortFunc(missing, func(a, b trajectory.Subagent) int {
		if a.Stage != b.Stage {
			return a.Stage - b.Stage
		}
		return a.Index - b.Index
	})
	if !o.Async {
		// A synchronous stage's longest sub-agent is on the critical path
		// (unless the journal already names one of the stage's).
		critical := map[int]bool{}
		for _, sa := range parent.Subagents {
			critical[sa.Stage] = critical[sa.Stage] || sa.Critical
		}
		for i := range missing {
			stage := missing[i].Stage
			if critical[stage] {
				continue
			}
			longest := i
			for j := range missing {
				if missing[j].Stage == stage && missing[j].Steps > missing[longest].Steps {
					longest = j
				}
			}
			missing[longest].Critical, critical[stage] = true, true
		}
	}
	if err := trajectory.AppendSubagents(partial, missing); err != nil {
		return nil, err
	}
	ids := make([]string, len(missing))
	for i, sa := range missing {
		ids[i] = sa.EpisodeID
	}
	return ids, nil
}
