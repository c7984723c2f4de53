package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/rollbox/rollbox/runtime"
)

// runExport is `rollbox export`: the trajectories of a `rollbox run --out`
// directory or a `rollbox serve --data` directory as one JSONL or Parquet
// file for a training pipeline, with GRPO group statistics attached to the
// episodes of complete groups. It reads the files only, so it works while
// the service runs.
func runExport(ctx context.Context, env *cliEnv, args []string) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	from := fs.String("from", "", "a rollbox run --out directory or a rollbox serve --data directory (or its episodes/ directory)")
	rollout := fs.String("rollout", "", "only this rollout's episodes")
	format := fs.String("format", "jsonl", "jsonl or parquet")
	out := fs.String("out", "", "output file (default: stdout for jsonl)")
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	switch {
	case fs.NArg() > 0:
		return usagef("unexpected arguments: %v", fs.Args())
	case *from == "":
		return usagef("--from DIR is required")
	case *format != "jsonl" && *format != "parquet":
		return usagef("--format %q is not one of jsonl, parquet", *format)
	case *format == "parquet" && *out == "":
		return usagef("--format parquet needs --out FILE")
	}
	dir := *from
	if st, err := os.Stat(filepath.Join(dir, "episodes")); err == nil && st.IsDir() {
		dir = filepath.Join(dir, "episodes")
	}
	ts, err := runtime.LoadEpisodes(dir, *rollout)
	if err != nil {
		return usagef("--from: %v", err)
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
	if *format == "jsonl" {
		err = runtime.WriteJSONL(w, ts)
	} else {
		rows := make([]runtime.ExportRow, len(ts))
		for i, t := range ts {
			rows[i] = runtime.RowOf(t)
		}
		err = runtime.WriteParquet(w, rows)
	}
	if err != nil {
		return err
	}
	if f, ok := w.(*os.File); ok && f != os.Stdout {
		if err := f.Close(); err != nil {
			return err
		}
	}
	fmt.Fprintf(env.stderr, "rollbox export: %d episode(s) from %s as %s\n", len(ts), dir, *format)
	return nil
}
