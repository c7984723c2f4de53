package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// runParl runs the examples/parl task with one of its orchestrator
// policies and returns the orchestrator's record and the run's directory.
func runParl(t *testing.T, policy string, args ...string) (*trajectory.Trajectory, string) {
	t.Helper()
	out := t.TempDir()
	code, _, stderr := rollbox(t, append([]string{"run", "--tasks", "../../examples/parl/tasks.jsonl",
		"--policy", "scripted:../../examples/parl/policy-" + policy + ".jsonl", "--out", out}, args...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	files, _ := filepath.Glob(filepath.Join(out, "episodes", "*.json"))
	if len(files) != 1 {
		t.Fatalf("%d orchestrator records (sub-episodes are not episodes of the run): %v", len(files), files)
	}
	b, _ := os.ReadFile(files[0])
	if err := trajectory.Validate(b); err != nil {
		t.Fatal(err)
	}
	tr, err := trajectory.Read(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return tr, out
}

// The example's three orchestrators on the same task: the same right answer
// (r_perf 1), told apart by the auxiliary rewards, the critical steps and
// the monitors; sub-agents run within --concurrency 1 (the orchestrator
// gives its slot back while it waits, or this would never end).
func TestTheParlExampleTellsGoodDecompositionFromSerialCollapseAndSpuriousParallelism(t *testing.T) {
	type want struct {
		components               map[string]float64
		total                    float64
		critical, steps, spawned int
		collapse                 bool
		spurious                 int
		ends                     []string
	}
	cases := map[string]want{
		"parallel": {components: map[string]float64{"r_perf": 1, "r_parallel": 1, "r_finish": 1, "lambda_parallel": 0.3, "lambda_finish": 0.2},
			total: 1.5, critical: 2 + 3, steps: 2 + 3*3, spawned: 3, ends: []string{"finished", "finished", "finished"}},
		"serial": {components: map[string]float64{"r_perf": 1, "r_parallel": 0, "r_finish": 0, "lambda_parallel": 0.3, "lambda_finish": 0.2},
			total: 1, critical: 7, steps: 7, collapse: true},
		"spurious": {components: map[string]float64{"r_perf": 1, "r_parallel": 1, "r_finish": 0.6, "lambda_parallel": 0.3, "lambda_finish": 0.2},
			total: 1 + 0.3 + 0.2*0.6, critical: 2 + 3, steps: 2 + 3*3 + 1, spawned: 5, spurious: 2,
			ends: []string{"finished", "finished", "finished", "finished", "policy_error"}},
	}
	for name, w := range cases {
		t.Run(name, func(t *testing.T) {
			tr, out := runParl(t, name, "--concurrency", "1")
			if tr.Termination.Reason != trajectory.EndFinished || tr.Reward == nil || tr.Reward.Total == nil {
				t.Fatalf("end %+v reward %+v", tr.Termination, tr.Reward)
			}
			if *tr.Reward.Total != w.total {
				t.Errorf("reward %v, want %v (%v)", *tr.Reward.Total, w.total, tr.Reward.Components)
			}
			for k, v := range w.components {
				if got, ok := tr.Reward.Components[k]; !ok || got != v {
					t.Errorf("component %s = %v, want %v", k, got, v)
				}
			}
			st := tr.Stats
			if st.CriticalSteps == nil || *st.CriticalSteps != w.critical || *st.TotalSteps != w.steps || *st.Subagents != w.spawned {
				t.Errorf("critical %v total %v subagents %v, want %d %d %d", st.CriticalSteps, st.TotalSteps, st.Subagents, w.critical, w.steps, w.spawned)
			}
			if got := trajectoryCritical(tr); got != w.critical {
				t.Errorf("critical steps from the tree %d, want %d", got, w.critical)
			}
			m := tr.Monitors
			if m == nil || m.SerialCollapse == nil || *m.SerialCollapse != w.collapse || *m.SpuriousParallelism != w.spurious {
				t.Errorf("monitors %+v, want collapse %v spurious %d", m, w.collapse, w.spurious)
			}
			if len(tr.Subagents) != len(w.ends) {
				t.Fatalf("%d sub-agents recorded, want %d", len(tr.Subagents), len(w.ends))
			}
			var spawn trajectory.Step
			for _, s := range tr.Steps {
				if s.Name == "spawn_subagents" {
					spawn = s
				}
			}
			for i, sa := range tr.Subagents {
				if sa.End != w.ends[i] || sa.Stage != 0 || sa.Index != i || sa.Step != spawn.Index {
					t.Errorf("sub-agent %d: %+v", i, sa)
				}
				// Its answer in the orchestrator's record is what the
				// orchestrator saw.
				if !strings.Contains(spawn.Output, `"answer":"`+sa.Answer+`"`) {
					t.Errorf("sub-agent %d's answer %q is not in the spawn output %s", i, sa.Answer, spawn.Output)
				}
				b, err := os.ReadFile(filepath.Join(out, "episodes", sa.File))
				if err != nil {
					t.Fatalf("sub-episode record: %v", err)
				}
				if err := trajectory.Validate(b); err != nil {
					t.Fatal(err)
				}
				var sub trajectory.Trajectory
				json.Unmarshal(b, &sub)
				if sub.Parent == nil || sub.Parent.EpisodeID != tr.EpisodeID || sub.Parent.Step != spawn.Index || sub.Parent.Index != i {
					t.Errorf("sub-episode %s parent %+v", sa.EpisodeID, sub.Parent)
				}
				if sub.Reward != nil {
					t.Errorf("a frozen sub-agent was rewarded: %+v", sub.Reward)
				}
				if sub.Stats.Turns != sa.Steps || sub.Termination.Reason != sa.End {
					t.Errorf("sub-episode %s: %d turns %s, the orchestrator recorded %d %s", sa.EpisodeID, sub.Stats.Turns, sub.Termination.Reason, sa.Steps, sa.End)
				}
			}
			s := readSummary(t, out)
			if s.Episodes != 1 || s.Parl == nil || s.Parl.Episodes != 1 || s.Parl.Subagents != w.spawned {
				t.Fatalf("summary %+v parl %+v", s, s.Parl)
			}
			if collapsed := w.spawned <= 1; (s.Parl.SerialCollapseRate == 1) != collapsed {
				t.Errorf("serial collapse rate %v", s.Parl.SerialCollapseRate)
			}
			if w.spawned > 0 && *s.Parl.SpuriousParallelismRate != float64(w.spurious)/float64(w.spawned) {
				t.Errorf("spurious parallelism rate %v", *s.Parl.SpuriousParallelismRate)
			}
		})
	}
}

// trajectoryCritical recomputes the critical steps from the record alone.
func trajectoryCritical(tr *trajectory.Trajectory) int {
	turns := 0
	for _, s := range tr.Steps {
		if s.Type == trajectory.StepModel {
			turns++
		}
	}
	most := map[int]int{}
	for _, sa := range tr.Subagents {
		most[sa.Stage] = max(most[sa.Stage], sa.Steps)
	}
	for _, m := range most {
		turns += m
	}
	return turns
}

// The λ anneal linearly to 0 over the example's 1000 train steps: the
// rollout's --train-step is what they are evaluated at.
func TestTheParlRewardAnnealsAtTheRunsTrainStep(t *testing.T) {
	for _, tt := range []struct {
		step          string
		lp, lf, total float64
	}{{"250", 0.225, 0.15, 1.375}, {"1000", 0, 0, 1}} {
		tr, _ := runParl(t, "parallel", "--train-step", tt.step)
		c := tr.Reward.Components
		if c["lambda_parallel"] != tt.lp || c["lambda_finish"] != tt.lf || *tr.Reward.Total != tt.total || c["train_step"] != mustFloat(tt.step) {
			t.Errorf("train step %s: total %v components %v", tt.step, *tr.Reward.Total, c)
		}
	}
}

func mustFloat(s string) float64 {
	var f float64
	json.Unmarshal([]byte(s), &f)
	return f
}

// Replay re-executes the orchestrator's calls and by default answers its
// spawn_subagents calls with the recorded sub-agents (nothing is run for
// them); --live-subagents runs each again on its own recorded turns. Either
// way the orchestrator sees what it saw, and scores the same.
func TestAnOrchestratorEpisodeReplaysWithRecordedOrLiveSubagents(t *testing.T) {
	tr, out := runParl(t, "spurious")
	file, _ := filepath.Glob(filepath.Join(out, "episodes", "*.json"))
	for _, live := range []bool{false, true} {
		dir := t.TempDir()
		args := []string{"replay", file[0], "--json", "--out", dir}
		if live {
			args = append(args, "--live-subagents")
		}
		code, stdout, stderr := rollbox(t, args...)
		var rep struct {
			Divergence *json.RawMessage
			Stop       string
			Recorded   struct{ Reward *float64 }
			Replayed   struct{ Reward *float64 }
			Trajectory string
		}
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil || code != 0 {
			t.Fatalf("live %v: exit %d %v: %s %s", live, code, err, stdout, stderr)
		}
		if rep.Divergence != nil || rep.Replayed.Reward == nil || *rep.Replayed.Reward != *tr.Reward.Total {
			t.Errorf("live %v: %s", live, stdout)
		}
		again, err := trajectory.Read(rep.Trajectory)
		if err != nil {
			t.Fatal(err)
		}
		subs, _ := filepath.Glob(filepath.Join(dir, "subagents", "*.json"))
		if len(again.Subagents) != 5 || (len(subs) == 5) != live || (again.Subagents[0].File != "") != live {
			t.Errorf("live %v: %d sub-agents, %d sub-episode records, file %q", live, len(again.Subagents), len(subs), again.Subagents[0].File)
		}
		if *again.Stats.CriticalSteps != *tr.Stats.CriticalSteps {
			t.Errorf("live %v: critical steps %d, recorded %d", live, *again.Stats.CriticalSteps, *tr.Stats.CriticalSteps)
		}
	}
}
