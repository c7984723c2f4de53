package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// Recovery is what Open found of a previous process.
type Recovery struct {
	// Interrupted are episodes that were in flight or queued, now recorded
	// as interrupted.
	Interrupted []string
	// RecordErrors are episodes whose record could not be written during the
	// recovery (a full disk): indexed record_error.
	RecordErrors []string
	// Rollouts were running and are now "interrupted" (or "done" when all
	// their episodes had in fact ended).
	Rollouts []string
	// DroppedJournals are journals with nothing in them (the disk filled as
	// their episode began), removed.
	DroppedJournals []string
	// Subagents are sub-episodes of interrupted orchestrators that their
	// journals did not name yet (the call that ran them had not returned,
	// or they were not collected), now named in their orchestrators'
	// records; every sub-episode journal is recorded interrupted.
	Subagents []string
	// UnindexedImports are records of imported episodes written by a
	// process that stopped before it indexed them (never acknowledged),
	// removed: a resend of their lines stores them again.
	UnindexedImports []string
	// Resumed are a cluster coordinator's rollouts dispatched again to
	// its workers (not interrupted).
	Resumed []string
	// Took is how long the recovery took (the service listened meanwhile).
	Took time.Duration
}

// unfinishedRollouts lists the rollouts a previous process had not ended.
func (st *store) unfinishedRollouts() ([]*rolloutRecord, error) {
	all, err := st.rollouts()
	if err != nil {
		return nil, err
	}
	var out []*rolloutRecord
	for _, r := range all {
		if r.EndedAt == nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// outcome is the part of a trajectory document the index keeps.
type outcome struct {
	Schema      string                  `json:"schema"`
	Termination *trajectory.Termination `json:"termination"`
	Reward      *trajectory.Reward      `json:"reward"`
	Stats       struct {
		ToolErrors map[string]int          `json:"tool_errors"`
		Truncated  *trajectory.Truncations `json:"truncated"`
	} `json:"stats"`
}

// readOutcome reads how an episode ended from its record, without keeping
// its steps.
func readOutcome(path string) (*outcome, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var o outcome
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if o.Schema != trajectory.Schema || o.Termination == nil {
		return nil, fmt.Errorf("%s: not an ended %s record", path, trajectory.Schema)
	}
	return &o, nil
}

// leftovers are the journals and half-written records a previous process
// left, listed when the service opens: the recovery touches those only,
// never the files of the episodes this process starts while it recovers.
type leftovers struct {
	journals, subagents *trajectory.Leftovers
}

// findLeftovers lists them in the episodes directory dir.
func findLeftovers(dir string) (*leftovers, error) {
	j, err := trajectory.FindLeftovers(dir)
	if err != nil {
		return nil, err
	}
	sub, err := agent.SubagentLeftovers(dir)
	if err != nil {
		return nil, err
	}
	return &leftovers{journals: j, subagents: sub}, nil
}

// recover finalises what a previous process left (left), in bulk: every journal
// becomes a record (interrupted unless it had ended) in one pass made
// durable by one file-system sync; every episode of an unfinished rollout
// that never started is recorded interrupted the same way; then the index
// learns all of it in one transaction. It is idempotent: a crash in the
// middle is recovered by the next start. The service listens meanwhile.
func (s *Server) recover(unfinished []*rolloutRecord, left *leftovers) (*Recovery, error) {
	start := time.Now()
	rec := &Recovery{}
	// Sub-episodes first: each interrupted orchestrator's journal then
	// names all of its sub-episodes when it becomes a record.
	subs, err := agent.RecoverSubagents(s.st.episodesDir, left.journals, left.subagents)
	if err != nil {
		s.log.Error("some sub-episodes could not be recovered", "err", err)
	}
	rec.Subagents = subs
	_, dropped, err := left.journals.Recover()
	if err != nil {
		// A journal that cannot be read is left where it is; its episode
		// is recorded below as the index knows it.
		s.log.Error("some journals could not be recovered", "err", err)
	}
	rec.DroppedJournals = dropped
	if rec.UnindexedImports, err = s.removeUnindexedImports(); err != nil {
		s.log.Error("removing the records of imports a previous process did not index", "err", err)
	}

	now := time.Now().UTC()
	var changed []*episodeRecord
	var write []*trajectory.Trajectory
	var writeFor []*episodeRecord
	type rolloutEnd struct {
		r   *rolloutRecord
		eps []*episodeRecord
	}
	var ends []rolloutEnd
	unstarted := unstartedRecords{}
	for _, r := range unfinished {
		if err := s.ctx.Err(); err != nil {
			return nil, fmt.Errorf("stopped while recovering: %w", context.Cause(s.ctx))
		}
		eps, err := s.st.rolloutEpisodes(r.ID)
		if err != nil {
			return nil, err
		}
		tasks := map[int]*agent.Task{}
		taskOf := func(i int) *agent.Task {
			if t := tasks[i]; t != nil {
				return t
			}
			t := &agent.Task{}
			if i < len(r.Tasks) {
				json.Unmarshal(r.Tasks[i], t)
			}
			tasks[i] = t
			return t
		}
		seq := 0
		for _, e := range eps {
			seq = max(seq, e.Seq)
		}
		var mine []*episodeRecord
		for _, e := range eps {
			if e.State == episodeDone {
				continue
			}
			seq++
			e.State, e.Seq, e.EndedAt = episodeDone, seq, &now
			mine = append(mine, e)
			changed = append(changed, e)
			if o, err := readOutcome(s.st.trajectoryPath(e.ID)); err == nil {
				setOutcome(e, o)
				continue
			}
			t := unstarted.record(e, taskOf(e.TaskIndex), r.Backend, r.Policy, trajectory.EndInterrupted,
				"the service stopped before this episode started")
			e.Reason = trajectory.EndInterrupted
			write = append(write, t)
			writeFor = append(writeFor, e)
		}
		ends = append(ends, rolloutEnd{r, mine})
	}
	for i, err := range trajectory.WriteFiles(s.st.episodesDir, write) {
		if err != nil {
			e := writeFor[i]
			e.Reason, e.Message = trajectory.EndRecordError, "the record of this episode, which never started, could not be written at recovery: "+err.Error()
			rec.RecordErrors = append(rec.RecordErrors, e.ID)
		}
	}
	var rollouts []*rolloutRecord
	for _, re := range ends {
		r := re.r
		interrupted := 0
		for _, e := range re.eps {
			if e.Reason == trajectory.EndInterrupted {
				interrupted++
				rec.Interrupted = append(rec.Interrupted, e.ID)
			}
		}
		switch {
		case r.State == RolloutCancelled:
		case interrupted > 0:
			r.State = RolloutInterrupted
			r.Message = fmt.Sprintf("the service stopped with %d episode(s) of this rollout unfinished; they are recorded as interrupted", interrupted)
		default:
			r.State = RolloutDone
		}
		r.EndedAt = &now
		rollouts = append(rollouts, r)
		rec.Rollouts = append(rec.Rollouts, r.ID)
	}

	envs, err := s.st.openEnvEpisodes()
	if err != nil {
		return nil, err
	}
	for _, e := range envs {
		e.State, e.EndedAt, e.Reason = episodeDone, &now, trajectory.EndInterrupted
		if o, err := readOutcome(s.st.trajectoryPath(e.ID)); err == nil {
			setOutcome(e, o)
		}
		if e.Reason == trajectory.EndInterrupted {
			rec.Interrupted = append(rec.Interrupted, e.ID)
		}
		changed = append(changed, e)
	}
	if err := s.st.putEnds(changed, rollouts...); err != nil {
		return nil, fmt.Errorf("indexing what was recovered: %w", err)
	}
	s.metrics.Recovered.Add(float64(len(rec.Interrupted)))
	rec.Took = time.Since(start)
	if len(changed) > 0 || len(dropped) > 0 || len(rec.UnindexedImports) > 0 {
		s.log.Warn("recovered from a previous process", "episodes_interrupted", len(rec.Interrupted), "record_errors", len(rec.RecordErrors),
			"rollouts", len(rec.Rollouts), "empty_journals_removed", len(dropped), "unindexed_imports_removed", len(rec.UnindexedImports), "took", rec.Took)
	}
	return rec, nil
}

// setOutcome copies a record's outcome into its index entry.
func setOutcome(e *episodeRecord, o *outcome) {
	e.Reason = o.Termination.Reason
	e.Reward = nil
	if v, ok := o.Reward.Value(); ok {
		e.Reward = &v
	}
	if len(o.Stats.ToolErrors) > 0 {
		e.ToolErrors = o.Stats.ToolErrors
	}
	e.Truncated = o.Stats.Truncated
}

// unstartedTrajectory is the record of an episode that never started,
// ended for reason: what a Writer would have written for it.
func unstartedTrajectory(rec *episodeRecord, task *agent.Task, backend string, pol trajectory.Policy, reason, message string) *trajectory.Trajectory {
	return unstartedRecords{}.record(rec, task, backend, pol, reason, message)
}

// unstartedRecords makes the records of many episodes that never started
// (a cancellation, a recovery): each task's JSON and hash are made once, not
// once an episode (4,096 episodes of one task took 0.4 s, 1.7-4.5 s under
// -race, before the first record was written).
type unstartedRecords map[*agent.Task]taskFacts

type taskFacts struct {
	json json.RawMessage
	hash string
}

func (u unstartedRecords) record(rec *episodeRecord, task *agent.Task, backend string, pol trajectory.Policy, reason, message string) *trajectory.Trajectory {
	f, ok := u[task]
	if !ok {
		b, _ := json.Marshal(task)
		sum := sha256.Sum256(b) // as task.Hash()
		f = taskFacts{json: b, hash: hex.EncodeToString(sum[:])}
		if u != nil {
			u[task] = f
		}
	}
	if task.Sandbox.Backend != "" {
		backend = task.Sandbox.Backend
	}
	now := time.Now().UTC()
	return &trajectory.Trajectory{Schema: trajectory.Schema, EpisodeID: rec.ID, RolloutID: rec.RolloutID, GroupID: rec.GroupID,
		GroupIndex: rec.GroupIndex, TaskID: task.ID, TaskHash: f.hash, Seed: int64(rec.GroupIndex), Task: f.json,
		StartedAt: now, EndedAt: &now, Sandbox: trajectory.Sandbox{Backend: backend}, Policy: pol,
		Pinned:        map[string]string{"seed": strconv.Itoa(rec.GroupIndex), "episode_id": rec.ID},
		Steps:         []trajectory.Step{},
		ContextEvents: []trajectory.ContextEvent{},
		Termination:   &trajectory.Termination{Reason: reason, Message: message, Step: -1},
		Stats:         trajectory.Stats{ToolErrors: map[string]int{}}}
}
