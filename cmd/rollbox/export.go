package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
)

// newExportCmd is `rollbox export`: the trajectories of a `rollbox run --out`
// directory or a `rollbox serve --data` directory as one JSONL or Parquet
// file for a training pipeline, with GRPO group statistics attached to the
// episodes of complete groups. It reads the files only, so it works while
// the service runs.
func newExportCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export --from DIR [flags]",
		Short: "Write trajectories as one JSONL or Parquet file",
		Long: `Write the trajectories of a rollbox run --out directory, or of a rollbox serve
--data directory, as one JSONL or Parquet file for a training pipeline, with
GRPO group statistics attached to the episodes of complete groups. It reads the
files only, so it works while the service runs.`,
		Example: `  rollbox export --from out/<rollout id> --format jsonl --out run.jsonl
  rollbox export --from rollbox-data --rollout <rollout id> --format parquet --out rollout.parquet`,
		Args: noArgs,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	from := fs.String("from", "", "`DIR`: a rollbox run --out directory, a directory of them (out/), or a rollbox serve --data directory (or an episodes/ directory)")
	rollout := fs.String("rollout", "", "only this rollout's episodes (`ID`)")
	format := fs.String("format", "jsonl", "jsonl or parquet")
	layout := fs.String("layout", "episodes", "episodes (one row per episode) or segments (one row per token segment of token-mode episodes: input_ids, loss_mask, logprobs, reward, advantage, policy_version)")
	out := fs.String("out", "", "output `FILE` (default: stdout for jsonl)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		switch {
		case *from == "":
			return usagef("--from DIR is required")
		case *format != "jsonl" && *format != "parquet":
			return usagef("--format %q is not one of jsonl, parquet", *format)
		case *layout != runtime.LayoutEpisodes && *layout != runtime.LayoutSegments:
			return usagef("--layout %q is not one of episodes, segments", *layout)
		case *format == "parquet" && *out == "":
			return usagef("--format parquet needs --out FILE")
		}
		var ts []*trajectory.Trajectory
		var skipped []string
		unended := 0 // journals: episodes running now, or left by a killed run
		for _, dir := range episodeDirs(*from) {
			got, sk, err := runtime.LoadEpisodes(dir, *rollout)
			if err != nil {
				return usagef("--from: %v", err)
			}
			ts, skipped = append(ts, got...), append(skipped, sk...)
			journals, _ := filepath.Glob(filepath.Join(dir, "*"+trajectory.PartialSuffix))
			for _, j := range journals {
				if *rollout == "" || strings.HasPrefix(filepath.Base(j), *rollout+".") {
					unended++
				}
			}
		}
		sort.SliceStable(ts, func(i, j int) bool { return ts[i].RolloutID < ts[j].RolloutID })
		for _, sk := range skipped {
			fmt.Fprintf(env.stderr, "rollbox export: skipped an unreadable record: %s\n", sk)
		}
		var w io.Writer = env.stdout
		if *out != "" {
			f, err := os.Create(*out)
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		if err := runtime.WriteExport(w, ts, *format, *layout); err != nil {
			return err
		}
		if f, ok := w.(*os.File); ok && f != os.Stdout {
			if err := f.Close(); err != nil {
				return err
			}
		}
		fmt.Fprintf(env.stderr, "rollbox export: %d episode(s) of %s from %s as %s", len(ts), runCounts(ts), *from, *format)
		if len(skipped) > 0 {
			fmt.Fprintf(env.stderr, "; %d unreadable record(s) skipped", len(skipped))
		}
		if unended > 0 {
			fmt.Fprintf(env.stderr, "; %d episode(s) not ended, not exported (journals of episodes running now, or of a killed run: rollbox run --resume finalizes and continues it)", unended)
		}
		fmt.Fprintln(env.stderr)
		return nil
	}
	return cmd
}

// episodeDirs lists the directories of trajectories under dir: dir/episodes
// (a run's or a service's), else each dir/*/episodes (a directory of runs,
// out/) and dir itself.
func episodeDirs(dir string) []string {
	isDir := func(p string) bool { st, err := os.Stat(p); return err == nil && st.IsDir() }
	if isDir(filepath.Join(dir, "episodes")) {
		return []string{filepath.Join(dir, "episodes")}
	}
	dirs := []string{dir}
	subs, _ := filepath.Glob(filepath.Join(dir, "*", "episodes"))
	sort.Strings(subs)
	for _, s := range subs {
		if isDir(s) {
			dirs = append(dirs, s)
		}
	}
	return dirs
}

// runCounts says how many episodes of which runs ts holds: "2 runs (r-a:
// 12, r-b: 12)".
func runCounts(ts []*trajectory.Trajectory) string {
	n := map[string]int{}
	var ids []string
	for _, t := range ts {
		if n[t.RolloutID] == 0 {
			ids = append(ids, t.RolloutID)
		}
		n[t.RolloutID]++
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%s: %d", id, n[id])
	}
	return fmt.Sprintf("%d run(s) (%s)", len(ids), strings.Join(parts, ", "))
}
