package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

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
	from := fs.String("from", "", "`DIR`: a rollbox run --out directory or a rollbox serve --data directory (or its episodes/ directory)")
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
		dir := *from
		if st, err := os.Stat(filepath.Join(dir, "episodes")); err == nil && st.IsDir() {
			dir = filepath.Join(dir, "episodes")
		}
		ts, skipped, err := runtime.LoadEpisodes(dir, *rollout)
		if err != nil {
			return usagef("--from: %v", err)
		}
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
		fmt.Fprintf(env.stderr, "rollbox export: %d episode(s) from %s as %s", len(ts), dir, *format)
		if len(skipped) > 0 {
			fmt.Fprintf(env.stderr, "; %d unreadable record(s) skipped", len(skipped))
		}
		fmt.Fprintln(env.stderr)
		return nil
	}
	return cmd
}
