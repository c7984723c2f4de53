package main

import (
	"fmt"
	"path/filepath"
	"sort"
	"sync"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/internal/cluster"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/tools"
)

// searchIndexes holds the indexes a run's search tasks name: each opened
// once, read-only, and shared by every episode that uses it.
type searchIndexes struct {
	mu   sync.Mutex
	open map[string]*retriever.Index
}

// openSearchIndexes opens every distinct index the tasks name. An index
// that cannot be opened names the first task that wants it.
func openSearchIndexes(tasks []*agent.Task) (*searchIndexes, error) {
	s := &searchIndexes{open: map[string]*retriever.Index{}}
	for _, t := range tasks {
		if t.Retriever == nil {
			continue
		}
		key := indexKey(t.IndexPath())
		if _, ok := s.open[key]; ok {
			continue
		}
		ix, err := retriever.Open(t.IndexPath(), retriever.OpenOptions{})
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("task %q: retriever.index: %w", t.ID, err)
		}
		s.open[key] = ix
	}
	return s, nil
}

func indexKey(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return filepath.Clean(p)
}

// configure is runtime.BatchConfig.ConfigureEpisode: a search task's
// episode gets search, read and prune over its shared index and a context
// ledger of its own, with the task's document budget.
func (s *searchIndexes) configure(cfg *agent.Config) error {
	t := cfg.Task
	if t.Retriever == nil {
		return nil
	}
	s.mu.Lock()
	ix := s.open[indexKey(t.IndexPath())]
	s.mu.Unlock()
	if ix == nil {
		return fmt.Errorf("task %q: index %s was not opened", t.ID, t.IndexPath())
	}
	extra := tools.SearchTools(ix, tools.SearchOptions{MaxDocBytes: t.Limits.MaxToolOutputBytes})
	if cfg.ExtraTools == nil {
		cfg.ExtraTools = map[string]tools.Tool{}
	}
	for n, tool := range extra {
		cfg.ExtraTools[n] = tool
	}
	budget := t.ContextTokens()
	prev := cfg.ToolEnv
	cfg.ToolEnv = func(env *tools.Env) error {
		if prev != nil {
			if err := prev(env); err != nil {
				return err
			}
		}
		tools.WithLedger(env, retriever.NewLedger(budget))
		return nil
	}
	return nil
}

// identity is runtime.Options.SearchIndex: the identity of the index a
// search task names, as opened here.
func (s *searchIndexes) identity(t *agent.Task) (string, error) {
	s.mu.Lock()
	ix := s.open[indexKey(t.IndexPath())]
	s.mu.Unlock()
	if ix == nil {
		return "", fmt.Errorf("task %q: index %s was not opened", t.ID, t.IndexPath())
	}
	return indexIdentity(ix), nil
}

func indexIdentity(ix *retriever.Index) string {
	in := ix.Info()
	return cluster.IndexIdentity(in.CorpusSHA256, in.Units, in.ChunkTokens, in.Scoring)
}

// configureWorker is runtime.WorkerOptions.ConfigureEpisode: a search
// task's index is opened at its first episode here (the path the
// coordinator's host resolved, from the task file's directory) and must
// have the identity want, the coordinator's; then configure.
func (s *searchIndexes) configureWorker(cfg *agent.Config, want string) error {
	t := cfg.Task
	if t.Retriever == nil {
		return nil
	}
	path := t.IndexPath()
	key := indexKey(path)
	s.mu.Lock()
	ix := s.open[key]
	if ix == nil {
		var err error
		if ix, err = retriever.Open(path, retriever.OpenOptions{}); err != nil {
			s.mu.Unlock()
			return fmt.Errorf("task %q: retriever.index %s: %w", t.ID, path, err)
		}
		s.open[key] = ix
	}
	s.mu.Unlock()
	if got := indexIdentity(ix); want != "" && got != want {
		return fmt.Errorf("task %q: the index at %s is not the coordinator's: here %s, on the coordinator %s", t.ID, path, got, want)
	}
	return s.configure(cfg)
}

// Close closes every index.
func (s *searchIndexes) Close() error {
	keys := make([]string, 0, len(s.open))
	for k := range s.open {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var first error
	for _, k := range keys {
		if err := s.open[k].Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
