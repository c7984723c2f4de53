package replay_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// A forked episode's record holds the parent's steps and then its own; its
// replay recreates the prefix (the parent's steps, in a fresh sandbox) and
// then its own steps, and matches.
func TestAReplayOfAForkedEpisodeReplaysThePrefixThenItsOwnSteps(t *testing.T) {
	tasks, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(fixTask), " ")), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	sess, err := agent.Open(ctx, agent.Config{Task: tasks[0], EpisodeID: "p.fix-add.0", RolloutID: "p", Dir: dir,
		Backend: "wasm", NewSandbox: wasmFactory(t), PolicyInfo: trajectory.Policy{Kind: "env"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Cancel(context.Background(), trajectory.EndCancelled, "test over")
	// The prefix: the tests fail, then the fix.
	for _, turn := range []agent.Turn{fixTurns[0], fixTurns[3]} {
		if _, _, err := sess.Step(ctx, turn); err != nil {
			t.Fatal(err)
		}
	}
	kids, err := sess.Fork(ctx, []string{"p.fix-add.0.f0", "p.fix-add.0.f1"})
	if err != nil {
		t.Fatal(err)
	}
	// Child 0 runs the tests and finishes; child 1 undoes the fix.
	for i, own := range [][]agent.Turn{
		{fixTurns[4], fixTurns[5]},
		{call("edit", `{"path": "calc.py", "old_string": "a + b", "new_string": "a * b"}`), fixTurns[5]},
	} {
		for _, turn := range own {
			if _, _, err := kids[i].Step(ctx, turn); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := kids[i].Finish(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []float64{1, 0} {
		tr, err := trajectory.Read(filepath.Join(dir, "p.fix-add.0.f"+string(rune('0'+i))+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if tr.ForkedFrom == nil || tr.ForkedFrom.EpisodeID != "p.fix-add.0" || tr.ForkedFrom.Step != 4 || len(tr.Steps) != 8 {
			t.Fatalf("child %d: forked_from %+v, %d steps", i, tr.ForkedFrom, len(tr.Steps))
		}
		if v, ok := tr.Value(); !ok || v != want {
			t.Errorf("child %d's reward %v %v, want %v", i, v, ok, want)
		}
		r := replayOf(t, tr)
		if r.Diverged() {
			t.Fatalf("child %d's replay diverged at step %d: %+v", i, r.Divergence.Index, r.Divergence.Diffs)
		}
		if len(r.Steps) != 8 || r.Replayed == nil || r.Replayed.Reward == nil || *r.Replayed.Reward != want {
			t.Errorf("child %d's replay: stop %q, %d steps, end %+v", i, r.Stop, len(r.Steps), r.Replayed)
		}
	}
	// The parent goes on from the prefix, its record its own.
	if _, _, err := sess.Step(ctx, fixTurns[4]); err != nil {
		t.Fatal(err)
	}
	if tr := sess.Trajectory(); len(tr.Steps) != 6 || tr.ForkedFrom != nil {
		t.Errorf("the parent: %d steps, forked_from %+v", len(tr.Steps), tr.ForkedFrom)
	}
}
