package runtime_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// A resumed batch runs only the episodes the earlier process did not
// record; a group with a prefix runs the prefix anew for them, numbered
// after the earlier run's (whose record stays as it was). Records that are
// not the batch's are refused by name.
func TestAResumedBatchRunsOnlyWhatWasNotRecordedAndNumbersItsPrefixAfter(t *testing.T) {
	be := wasmtest.Backend(t)
	scripted := `{"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo once >> /work/log.txt"}}]}]}`
	tasks, err := agent.ReadTasks(strings.NewReader(strings.Join(strings.Fields(fmt.Sprintf(prefixTask, scripted)), " ")), filepath.Join(t.TempDir(), "tasks.jsonl"), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	var made atomic.Int64
	run := func(id string, resume *runtime.BatchRecord) *runtime.Summary {
		t.Helper()
		sum, err := runtime.RunBatch(context.Background(), runtime.BatchConfig{Tasks: tasks, OutDir: out, Backend: "wasm", Group: 4, RolloutID: id,
			NewSandbox: func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
				made.Add(1)
				return be.Create(ctx, spec)
			},
			Policy: countLines, PolicyInfo: trajectory.Policy{Kind: "test"}, Resume: resume})
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	sum := run("", nil)
	id, gid := sum.RolloutID, sum.RolloutID+".pre"
	// What a process killed before episodes 2 and 3 started leaves.
	kept, _ := trajectory.Read(filepath.Join(out, "episodes", gid+".0.json"))
	for _, i := range []int{2, 3} {
		os.Remove(filepath.Join(out, "episodes", fmt.Sprintf("%s.%d.json", gid, i)))
	}
	os.Remove(filepath.Join(out, "summary.json"))
	prefixBefore, _ := os.ReadFile(filepath.Join(out, "prefixes", gid+".prefix.json"))

	rec, err := runtime.RecoverBatch(out, id, tasks, 4)
	if err != nil || len(rec.Episodes) != 2 || rec.PrefixRuns[gid] != 1 {
		t.Fatalf("recovered %+v, %v", rec, err)
	}
	made.Store(0)
	sum = run(id, rec)
	if made.Load() != 1 || sum.Episodes != 4 || sum.Scored != 4 || sum.RewardMean == nil || *sum.RewardMean != 1 {
		t.Fatalf("resumed: %d sandboxes made (want the new prefix's 1), summary %+v", made.Load(), sum)
	}
	if again, _ := trajectory.Read(filepath.Join(out, "episodes", gid+".0.json")); again.StartedAt != kept.StartedAt {
		t.Errorf("episode 0 ran again")
	}
	for _, i := range []int{2, 3} {
		tr, err := trajectory.Read(filepath.Join(out, "episodes", fmt.Sprintf("%s.%d.json", gid, i)))
		if err != nil || tr.ForkedFrom == nil || tr.ForkedFrom.EpisodeID != gid+".prefix.2" {
			t.Errorf("episode %d: %v forked from %+v", i, err, tr)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(out, "prefixes", gid+".prefix.json")); string(b) != string(prefixBefore) {
		t.Errorf("the earlier prefix's record was written over")
	}
	if pre, err := trajectory.Read(filepath.Join(out, "prefixes", gid+".prefix.2.json")); err != nil || !strings.Contains(pre.Termination.Message, "prefix done: 2 episodes") {
		t.Errorf("the resumed prefix's record: %v %+v", err, pre)
	}

	// Another batch's record in the directory.
	kept.RolloutID, kept.EpisodeID = "r-other", "r-other.pre.0"
	if err := trajectory.WriteFile(filepath.Join(out, "episodes", "r-other.pre.0.json"), kept); err != nil {
		t.Fatal(err)
	}
	if _, err := runtime.RecoverBatch(out, id, tasks, 4); err == nil || !strings.Contains(err.Error(), "r-other.pre.0.json is of rollout r-other") {
		t.Errorf("a record of another rollout: %v", err)
	}
}
