package runtime

import (
	"fmt"
	"log/slog"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/sandbox"
)

// plan is what every episode of a task asks for, computed once when its
// rollout (or `rollbox run`) is admitted: the backend, and the sandbox spec —
// agent.EpisodeSpec of the task and its sandbox pins, a pure function of
// them — with the spec's key in the backend's warm pool. The episode's
// session asks for exactly that spec; the scheduler sizes the warm pools by
// it and never learns a spec back.
type plan struct {
	task    *agent.Task
	backend string
	spec    sandbox.Spec
	// specKey is spec.Key() when the backend keeps a warm pool, else "".
	specKey string
}

func newPlan(t *agent.Task, defaultBackend string, warm map[string]int) *plan {
	p := &plan{task: t, backend: t.Sandbox.Backend, spec: agent.EpisodeSpec(t, agent.SandboxPins(t))}
	if p.backend == "" {
		p.backend = defaultBackend
	}
	if warm[p.backend] > 0 {
		p.specKey = p.spec.Key()
	}
	return p
}

// episodeID names episode index of task taskID in a rollout (or a run).
func episodeID(rolloutID, taskID string, index int) string {
	return fmt.Sprintf("%s.%s.%d", rolloutID, taskID, index)
}

// groupID names the GRPO group of a task's episodes in a rollout.
func groupID(rolloutID, taskID string) string { return rolloutID + "." + taskID }

// config is the agent.Config of episode index of the plan's task, recorded
// in dir; the caller adds the policy, the sandbox factory and its hooks.
func (p *plan) config(rolloutID string, index int, dir string) agent.Config {
	return agent.Config{Task: p.task, EpisodeID: episodeID(rolloutID, p.task.ID, index), RolloutID: rolloutID,
		GroupID: groupID(rolloutID, p.task.ID), GroupIndex: index, Seed: int64(index), Dir: dir, Backend: p.backend}
}

// openRetry is how `rollbox run` and the service (rollout and environment
// mode alike) retry an episode whose open failed for the infrastructure's
// sake before the policy was asked anything: attempts in all, the failed
// attempts' records in dir, each retry logged and passed to counted.
func openRetry(attempts int, dir string, log *slog.Logger, episode string, counted func(*agent.OpenError)) agent.Retry {
	return agent.Retry{Attempts: attempts, Dir: dir, OnRetry: func(attempt int, err *agent.OpenError) {
		if log != nil {
			log.Warn("infrastructure failure before the first policy call; retrying", "episode", episode,
				"attempt", attempt, "stage", err.Stage, "reason", err.Error())
		}
		if counted != nil {
			counted(err)
		}
	}}
}
