package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/retriever"
)

// newIndexCmd is `rollbox index build|info|search`.
func newIndexCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "index",
		Short: "Build, inspect or query a search index",
		Long: `Build a bleve search index from a corpus (JSONL, {"id", "title", "text", ...} a
line), show what an index holds, or query it as the search tool does. A search
task names its index with "retriever": {"index": "DIR"} (docs/tasks.md).`,
		RunE: groupRunE,
	}
	cmd.AddCommand(newIndexBuildCmd(env), newIndexInfoCmd(env), newIndexSearchCmd(env))
	return cmd
}

func newIndexBuildCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "build --corpus FILE.jsonl --out DIR [flags]",
		Short:   "Build an index from a corpus",
		Example: `  rollbox index build --corpus examples/search/corpus.jsonl --out /tmp/index`,
		Args:    noArgs,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	corpus := fs.String("corpus", "", "corpus `FILE` (JSONL: {\"id\", \"title\", \"text\", ...metadata} a line)")
	out := fs.String("out", "", "create the index in `DIR` (must not exist, or be empty)")
	chunkTokens := fs.Int("chunk-tokens", 0, "split documents into chunks of about N tokens, ids <id>#<n> (0: whole documents)")
	batch := fs.Int("batch-size", retriever.DefaultBatchSize, "documents indexed per batch")
	boost := fs.Float64("title-boost", retriever.DefaultTitleBoost, "weight of title matches over text matches")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		switch {
		case *corpus == "" || *out == "":
			return usagef("--corpus FILE and --out DIR are required")
		case *chunkTokens < 0 || *chunkTokens > 1<<20:
			return usagef("--chunk-tokens %d is outside 0..%d", *chunkTokens, 1<<20)
		case *batch < 1:
			return usagef("--batch-size %d must be at least 1", *batch)
		case *boost <= 0:
			return usagef("--title-boost %v must be positive", *boost)
		}
		if _, err := os.Stat(*corpus); err != nil {
			return usagef("--corpus: %v", err)
		}
		bar := newBuildProgress(env.stderr)
		info, err := retriever.BuildFile(ctx, *out, *corpus, retriever.BuildOptions{
			ChunkTokens: *chunkTokens, BatchSize: *batch, TitleBoost: *boost, Progress: bar.update,
		})
		bar.finish()
		if err != nil {
			if errors.Is(err, retriever.ErrBadCorpus) || errors.Is(err, retriever.ErrExists) {
				return usagef("%v", err)
			}
			return err
		}
		units := ""
		if info.ChunkTokens > 0 {
			units = fmt.Sprintf(" in %d chunks of ≤%d tokens", info.Units, info.ChunkTokens)
		}
		fmt.Fprintf(env.stdout, "built %s: %d documents%s, %.1f MB of corpus in %.1fs (%.0f docs/s), scoring %s, title boost %g\n",
			*out, info.Docs, units, float64(info.CorpusBytes)/1e6, info.BuildSeconds, float64(info.Docs)/max(info.BuildSeconds, 1e-9), info.Scoring, info.TitleBoost)
		return nil
	}
	return cmd
}

func newIndexInfoCmd(env *cliEnv) *cobra.Command {
	return &cobra.Command{
		Use:   "info DIR",
		Short: "Show what an index holds (documents, chunking, scoring) as JSON",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("want one index directory: rollbox index info DIR")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return runIndexInfo(env, args) },
	}
}

func runIndexInfo(env *cliEnv, args []string) error {
	ix, err := retriever.Open(args[0], retriever.OpenOptions{})
	if err != nil {
		if errors.Is(err, retriever.ErrNotIndex) {
			return usagef("%v", err)
		}
		return err
	}
	defer ix.Close()
	b, _ := json.MarshalIndent(ix.Info(), "", "  ")
	fmt.Fprintf(env.stdout, "%s\n", b)
	return nil
}

// filterFlags collects repeated --filter FIELD=VALUE.
type filterFlags map[string]string

func (f filterFlags) String() string { return fmt.Sprint(map[string]string(f)) }
func (f filterFlags) Type() string   { return "FIELD=VALUE" }
func (f filterFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want FIELD=VALUE", s)
	}
	f[k] = v
	return nil
}

func newIndexSearchCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "search --index DIR [flags] QUERY...",
		Short: "Query an index as the search tool does",
		Long: `Query an index as an episode's search tool does (BM25, titles boosted) and print
the hits with their scores and snippets. Flags may come anywhere; words after
-- are the query even when they start with a dash.`,
		Example: `  rollbox index search --index /tmp/index http port --k 3
  rollbox index search --index /tmp/index --filter lang=en -- -v flag`,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	dir := fs.String("index", "", "the index `DIR`")
	k := fs.IntP("k", "k", retriever.DefaultK, "number of results")
	filters := filterFlags{}
	fs.Var(filters, "filter", "exact metadata match FIELD=VALUE (repeatable)")
	cmd.RunE = func(cmd *cobra.Command, query []string) error {
		ctx := cmd.Context()
		if *dir == "" || len(query) == 0 {
			return usagef("want --index DIR and a query: rollbox index search --index DIR [--k N] [--filter F=V] QUERY...")
		}
		ix, err := retriever.Open(*dir, retriever.OpenOptions{})
		if err != nil {
			if errors.Is(err, retriever.ErrNotIndex) {
				return usagef("%v", err)
			}
			return err
		}
		defer ix.Close()
		res, err := ix.Search(ctx, retriever.Query{Text: strings.Join(query, " "), K: *k, Filters: filters})
		if err != nil {
			if errors.Is(err, retriever.ErrInvalidQuery) {
				return usagef("%v", err)
			}
			return err
		}
		fmt.Fprintf(env.stdout, "%d of %d matching\n", len(res.Hits), res.Total)
		for i, h := range res.Hits {
			fmt.Fprintf(env.stdout, "%2d. %-40s %7.3f  %s\n    %s\n", i+1, h.ID, h.Score, h.Title, h.Snippet)
		}
		return nil
	}
	return cmd
}

// buildProgress draws a bar on a terminal, or a line every few seconds
// otherwise.
type buildProgress struct {
	w    io.Writer
	tty  bool
	mu   sync.Mutex
	last time.Time
	drew bool
}

func newBuildProgress(w io.Writer) *buildProgress {
	f, ok := w.(*os.File)
	return &buildProgress{w: w, tty: ok && isTerminal(f)}
}

func (b *buildProgress) update(p retriever.BuildProgress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	every := 5 * time.Second
	if b.tty {
		every = 100 * time.Millisecond
	}
	if !p.Done && !p.Merging && time.Since(b.last) < every {
		return
	}
	b.last = time.Now()
	rate := float64(p.Docs) / max(p.Elapsed.Seconds(), 1e-9)
	state := ""
	switch {
	case p.Merging:
		state = "  merging segments…"
	case p.Done:
		state = "  done"
	}
	if !b.tty {
		if p.Done {
			return // the summary line says it
		}
		fmt.Fprintf(b.w, "rollbox index build: %d docs (%d indexed), %s, %.0f docs/s, %.0fs%s\n",
			p.Docs, p.Units, fmtFraction(p.Bytes, p.TotalBytes), rate, p.Elapsed.Seconds(), state)
		return
	}
	const width = 30
	filled := 0
	if p.TotalBytes > 0 {
		filled = int(min(int64(width), int64(width)*p.Bytes/p.TotalBytes))
	}
	fmt.Fprintf(b.w, "\r[%s%s] %s  %d docs  %.0f docs/s  %.0fs%s ",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), fmtFraction(p.Bytes, p.TotalBytes), p.Docs, rate, p.Elapsed.Seconds(), state)
	b.drew = true
}

func (b *buildProgress) finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tty && b.drew {
		fmt.Fprintln(b.w)
	}
}

func fmtFraction(n, total int64) string {
	if total <= 0 {
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%.1f/%.1f MB (%d%%)", float64(n)/1e6, float64(total)/1e6, 100*n/total)
}
