// Package replay redoes recorded episodes. Policy replays the assistant
// turns recorded in trajectories: `rollbox run --policy replay:DIR` re-runs
// a recorded run's decisions against fresh sandboxes. Episode recreates one
// episode's sandbox (image by digest, limits, pinned environment, seeded
// files), re-executes its tool calls through the same session code, and
// reports the first step whose result differs from the recording, with a
// unified diff; `rollbox replay` prints it, opens a Shell where it stopped,
// or lets a live policy go on from there.
package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// Policy replays recorded turns, keyed by task id and group index.
type Policy struct {
	turns map[string][]agent.Turn // task id "#" group index → turns
}

// FromTrajectories builds a policy from recorded episodes.
func FromTrajectories(ts []*trajectory.Trajectory) *Policy {
	p := &Policy{turns: map[string][]agent.Turn{}}
	for _, t := range ts {
		p.turns[key(t.TaskID, t.GroupIndex)] = Turns(t)
	}
	return p
}

// Load reads every trajectory in dir (or dir/episodes).
func Load(dir string) (*Policy, error) {
	if st, err := os.Stat(filepath.Join(dir, "episodes")); err == nil && st.IsDir() {
		dir = filepath.Join(dir, "episodes")
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("replay: no trajectories (*.json) in %s", dir)
	}
	var ts []*trajectory.Trajectory
	for _, f := range files {
		t, err := trajectory.Read(f)
		if err != nil {
			return nil, fmt.Errorf("replay: %s: %w", f, err)
		}
		ts = append(ts, t)
	}
	return FromTrajectories(ts), nil
}

// Turns extracts the model turns of a trajectory, in order.
func Turns(t *trajectory.Trajectory) []agent.Turn {
	var out []agent.Turn
	for _, s := range t.Steps {
		if s.Type != trajectory.StepModel {
			continue
		}
		turn := agent.Turn{Content: s.Content, FinishReason: s.FinishReason, Model: s.Model, ToolCallsFromText: s.ToolCallsFromText}
		for _, c := range s.ToolCalls {
			turn.ToolCalls = append(turn.ToolCalls, agent.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
		if s.Usage != nil && !s.Usage.Estimated {
			turn.Usage = &agent.Usage{PromptTokens: s.Usage.PromptTokens, CompletionTokens: s.Usage.CompletionTokens, TotalTokens: s.Usage.TotalTokens}
		}
		turn.PromptTokenIDs, turn.CompletionTokenIDs = s.PromptTokenIDs, s.CompletionTokenIDs
		if len(s.Logprobs) > 0 {
			json.Unmarshal(s.Logprobs, &turn.Logprobs)
		}
		out = append(out, turn)
	}
	return out
}

func key(task string, index int) string { return fmt.Sprintf("%s#%d", task, index) }

// Next returns the recorded turn. The group index is read from the episode
// id's last dot-separated field (as rollbox run names episodes), else 0.
func (p *Policy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	idx := 0
	if i := strings.LastIndexByte(req.EpisodeID, '.'); i >= 0 {
		fmt.Sscanf(req.EpisodeID[i+1:], "%d", &idx)
	}
	turns, ok := p.turns[key(req.TaskID, idx)]
	if !ok {
		turns, ok = p.turns[key(req.TaskID, 0)]
	}
	if !ok {
		return agent.Turn{}, fmt.Errorf("replay: no recorded episode for task %q: %w", req.TaskID, agent.ErrPolicy)
	}
	if req.Turn >= len(turns) {
		return agent.Turn{}, fmt.Errorf("replay: task %q recorded %d turns, asked for turn %d: %w", req.TaskID, len(turns), req.Turn+1, agent.ErrPolicy)
	}
	return turns[req.Turn], nil
}
