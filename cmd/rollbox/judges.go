package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/reward"
)

// judgeFlags are the judge pool's flags of run, serve and rescore.
type judgeFlags struct {
	concurrency int
	noCache     bool
	cacheDir    string // default $ROLLBOX_CACHE/judge
}

// add registers the flags on cmd.
func (f *judgeFlags) add(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.IntVar(&f.concurrency, "judge-concurrency", judge.DefaultConcurrency, "judge requests in flight per judge endpoint, over every episode (a judge's max_concurrency wins)")
	fs.StringVar(&f.cacheDir, "judge-cache", "", "keep judge answers in `DIR` (default $ROLLBOX_CACHE/judge), so a replay or a rescore asks nothing again")
	fs.BoolVar(&f.noCache, "no-judge-cache", false, "keep judge answers in memory only")
}

// judgeOptions configures the judge pool of a command: a bound per judge
// endpoint, a cache in memory and on disk ($ROLLBOX_CACHE/judge, so a
// replay or a rescore in another process asks nothing again), and the keys
// the specs' api_key_env name, read from the environment here, once.
func (e *cliEnv) judgeOptions(f judgeFlags, specs []judge.Spec) judge.Options {
	mem := judge.NewMemoryCache(100000)
	o := judge.Options{Concurrency: f.concurrency, Cache: mem}
	dir := f.cacheDir
	if dir == "" && e.cfg.cacheDir != "" {
		dir = filepath.Join(e.cfg.cacheDir, "judge")
	}
	if !f.noCache && dir != "" {
		if os.MkdirAll(dir, 0o755) == nil {
			o.Cache = judge.Tiered(mem, judge.DirCache{Dir: dir})
		}
	}
	keys := map[string]string{}
	getenv := e.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	for _, s := range specs {
		for _, name := range s.APIKeyEnvs() {
			keys[name] = getenv(name)
		}
	}
	o.APIKey = func(name string) string { return keys[name] }
	return o
}

// judgeSpecs lists the judge rewards of the tasks.
func judgeSpecs(tasks []*agent.Task) []judge.Spec {
	var out []judge.Spec
	for _, t := range tasks {
		out = append(out, t.Reward.JudgeSpecs()...)
	}
	return out
}

// specJudges lists the judge rewards of one reward spec.
func specJudges(s *reward.Spec) []judge.Spec { return s.JudgeSpecs() }
