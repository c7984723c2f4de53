package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
)

// newRescoreCmd is `rollbox rescore --rubrics FILE RUN_DIR`: a new reward
// (judge rubrics and judges, or any reward over what the run recorded)
// applied to recorded episodes without running them again.
func newRescoreCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rescore --rubrics FILE RUN_DIR",
		Short: "Apply new rubrics and judges to a recorded run, without running it again",
		Long: `Apply a new reward to every recorded episode of a run (a rollbox run --out
directory, a rollbox serve --data directory, or a directory of trajectories)
without running anything again: the iterate-on-the-reward loop.

FILE holds a reward object, typically a judge ({"type": "judge", "rubrics":
[...], "judges": [...]}) or a composite of the recorded tests and a judge, or
{"reward": {...}, "monitors": {...}} to change the monitors' thresholds and
penalties too. Judges are shown what the episode recorded (its answer,
transcript, tool outputs and the workspace diff its reward read); a tests part
takes the score the episode recorded for the same command; exact, regex and
fbeta parts recompute from the recorded answer and ids. Answers the record
already holds, or the judge cache ($ROLLBOX_CACHE/judge) has, are not asked
again. Episodes that ended for the infrastructure's reasons stay unscored.

The new records are written beside the old ones, never over them:
RUN_DIR/rescores/<id>/episodes/<episode id>.json, with summary.json and the
spec applied (spec.json). Exit status 0 when every episode was rescored
(whatever its new reward), 2 for bad input (nothing is written), 1 otherwise.`,
		Example: `  rollbox rescore --rubrics judge.json out/<rollout id>
  rollbox inspect --serve out/<rollout id>/rescores/<rescore id>`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("want one run directory: rollbox rescore --rubrics FILE RUN_DIR (got %d arguments)", len(args))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	rubrics := fs.String("rubrics", "", "the reward to apply: a JSON `FILE` (a judge reward, any reward, or {\"reward\", \"monitors\"}; docs/judges.md)")
	concurrency := fs.Int("concurrency", 8, "episodes rescored at once")
	id := fs.String("id", "", "name of the rescore (default a fresh id): RUN_DIR/rescores/`ID`/")
	var jf judgeFlags
	jf.add(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		runDir := args[0]
		switch {
		case *rubrics == "":
			return usagef("--rubrics FILE is required")
		case *concurrency < 1 || *concurrency > 10000:
			return usagef("--concurrency %d is outside 1..10000", *concurrency)
		case jf.concurrency < 1:
			return usagef("--judge-concurrency %d is not positive", jf.concurrency)
		}
		if st, err := os.Stat(runDir); err != nil || !st.IsDir() {
			return usagef("RUN_DIR %s: not a directory", runDir)
		}
		b, err := os.ReadFile(*rubrics)
		if err != nil {
			return usagef("--rubrics: %v", err)
		}
		spec, err := runtime.ParseRescoreSpec(b)
		if err != nil {
			return usagef("--rubrics %s: %v", *rubrics, err)
		}
		if *id != "" {
			if _, err := os.Stat(filepath.Join(runDir, "rescores", *id)); err == nil {
				return usagef("--id %s: %s exists (a rescore never writes over another)", *id, filepath.Join(runDir, "rescores", *id))
			}
		}
		pool := judge.NewPool(env.judgeOptions(jf, specJudges(&spec.Reward)))
		res, err := runtime.Rescore(cmd.Context(), runtime.RescoreConfig{RunDir: runDir, Spec: spec, SpecJSON: b, ID: *id,
			Judges: pool, Concurrency: *concurrency,
			OnEpisode: func(t *trajectory.Trajectory, done, total int) {
				rw := "unscored"
				if v, ok := t.Value(); ok {
					rw = fmt.Sprintf("%.3f", v)
				} else if t.Reward != nil {
					rw += " (" + t.Reward.ErrorKind + ")"
				}
				prev := "unscored"
				if p := t.Rescore.Previous; p != nil {
					prev = fmt.Sprintf("%.3f", *p)
				}
				fmt.Fprintf(env.stderr, "[%d/%d] %s  %s -> %s\n", done, total, t.EpisodeID, prev, rw)
			}})
		if res == nil {
			if err != nil {
				return usagef("%v", err)
			}
			return nil
		}
		b4, now := res.Before, res.Summary
		fmt.Fprintf(env.stderr, "rollbox rescore: %d episode(s): reward mean %s over %d scored -> %s over %d scored; monitors %s\n",
			res.Episodes, fmtMean(b4.RewardMean, 3), b4.Scored, fmtMean(now.RewardMean, 3), now.Scored, fmtCounts(now.Monitors))
		if j := now.Judge; j != nil {
			fmt.Fprintf(env.stderr, "rollbox rescore: judges: %d answer(s), %d from the cache, %d unscored episode(s), %.0f ms an episode on average\n",
				j.Requests, j.CacheHits, j.Unscored, j.MeanMS)
		}
		fmt.Fprintf(env.stderr, "rollbox rescore: wrote %s/episodes/ and %s/summary.json (the old records are unchanged)\n", res.Dir, res.Dir)
		fmt.Fprintln(env.stdout, res.Dir)
		return err
	}
	return cmd
}
