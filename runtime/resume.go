package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// BatchRecord is what an earlier process of a batch (a `rollbox run` that
// was killed or stopped) left recorded in its output directory: RunBatch
// counts these episodes in its summary and does not run them again.
type BatchRecord struct {
	// Episodes are the records by episode id, the journals of episodes that
	// were running finalized as interrupted (the policy's tokens were
	// spent: running them again would be another sample).
	Episodes map[string]*trajectory.Trajectory
	// Recovered counts the journals finalized, Dropped lists the episodes
	// whose journal held nothing (no header: they had not begun).
	Recovered int
	Dropped   []string
	// PrefixRuns is, per group id, how many times an earlier process ran
	// the group's prefix: a new run of it is numbered after them.
	PrefixRuns map[string]int
}

// RecoverBatch finalizes what an earlier process of batch rolloutID left in
// outDir (journals become records, interrupted unless they had ended;
// sub-agents' and prefixes' too) and reads every record, checked against
// the batch's plan: each must be of rolloutID, of one of tasks (unchanged
// since: the same task hash) and within group. A record that does not fit
// is an error naming it: the directory holds another batch, or the task
// file changed, and mixing them would make the group statistics lie.
// No other process may write to outDir meanwhile (the caller holds it).
func RecoverBatch(outDir, rolloutID string, tasks []*agent.Task, group int) (*BatchRecord, error) {
	dir := filepath.Join(outDir, "episodes")
	rec := &BatchRecord{Episodes: map[string]*trajectory.Trajectory{}, PrefixRuns: map[string]int{}}
	left, err := findLeftovers(dir)
	if err != nil {
		return nil, err
	}
	// Sub-episodes first: an interrupted orchestrator's record then names
	// every one of its sub-episodes.
	if _, err := agent.RecoverSubagents(dir, left.journals, left.subagents); err != nil {
		return nil, fmt.Errorf("recovering sub-agents' journals in %s: %w", dir, err)
	}
	recovered, dropped, err := left.journals.Recover()
	if err != nil {
		return nil, fmt.Errorf("recovering the journals in %s: %w", dir, err)
	}
	rec.Recovered, rec.Dropped = len(recovered), dropped
	prefixes := filepath.Join(outDir, "prefixes")
	if _, _, err := trajectory.RecoverDir(prefixes); err != nil {
		return nil, fmt.Errorf("recovering the prefixes' journals in %s: %w", prefixes, err)
	}

	byID := map[string]*agent.Task{}
	for _, t := range tasks {
		byID[t.ID] = t
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		t, err := trajectory.Read(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		task := byID[t.TaskID]
		switch {
		case t.RolloutID != rolloutID:
			return nil, fmt.Errorf("%s is of rollout %s, not %s", p, t.RolloutID, rolloutID)
		case task == nil:
			return nil, fmt.Errorf("%s is of task %q, which the task file no longer has", p, t.TaskID)
		case t.TaskHash != task.Hash():
			return nil, fmt.Errorf("%s: task %q changed since its episodes ran (task hash %.12s then, %.12s now); resume with the task file the run began with",
				p, t.TaskID, t.TaskHash, task.Hash())
		case t.GroupIndex < 0 || t.GroupIndex >= group || t.EpisodeID != episodeID(rolloutID, t.TaskID, t.GroupIndex):
			return nil, fmt.Errorf("%s: episode %s is not one of the run's %d per task", p, t.EpisodeID, group)
		}
		rec.Episodes[t.EpisodeID] = t
	}

	entries, err = os.ReadDir(prefixes)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		i := strings.LastIndex(name, ".prefix")
		if i < 0 {
			continue
		}
		group, n, runs := name[:i], name[i+len(".prefix"):], 1
		if n != "" {
			var err error
			if runs, err = strconv.Atoi(strings.TrimPrefix(n, ".")); err != nil || !strings.HasPrefix(n, ".") {
				continue
			}
		}
		rec.PrefixRuns[group] = max(rec.PrefixRuns[group], runs)
	}
	return rec, nil
}

// recorded is episode id's record, nil when none (or r is nil).
func (r *BatchRecord) recorded(id string) *trajectory.Trajectory {
	if r == nil {
		return nil
	}
	return r.Episodes[id]
}
