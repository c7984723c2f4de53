package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

func newRunCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run --tasks FILE --policy SPEC [flags]",
		Short: "Run every task of a task file (× group) and write trajectories",
		Long: `Run every task of a task file (JSONL, one task a line; docs/tasks.md) --group
times, --concurrency episodes at once, each in a fresh sandbox, and write one
trajectory per episode to OUT/episodes/<episode id>.json and OUT/summary.json.
Progress goes to stderr.

OUT (--out, default out/<rollout id>) is the run's own directory: one that
holds anything already (another run above all) is refused, so runs are never
mixed or overwritten.

Exit status: 0 when every episode ran to a recorded end, whatever its reward;
1 for a runtime failure, or when no episode could be scored (summary.json's
reward_mean is null then); 2 for bad input (nothing is started); 130 or 143
when SIGINT or SIGTERM stopped the run (summary.json says interrupted: true,
with the planned and started counts).

A run stopped by a signal or killed (SIGKILL, the OOM killer, a reboot) is
continued by --resume OUT with the same task file: the episodes it recorded
are kept, those that were running become interrupted records (their policy
calls were spent; they are not run again), the rest run, and summary.json
covers them all. The policy may be given anew (another server).`,
		Example: `  rollbox run --tasks examples/coding/tasks.jsonl --policy scripted:examples/coding/policy.jsonl --group 2
  rollbox run --tasks tasks.jsonl --policy 'openai:http://127.0.0.1:8000/v1#model=Qwen3-8B' --group 8 --concurrency 64
  rollbox run --resume out/r20260101T000000-0123456789ab --tasks tasks.jsonl --policy 'openai:http://127.0.0.1:8000/v1#model=Qwen3-8B'`,
		Args: noArgs,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	tasksFile := fs.String("tasks", "", "task `FILE` (JSONL, one task a line; docs/tasks.md)")
	policySpec := fs.String("policy", "", "the policy `SPEC`: scripted:FILE.jsonl | openai:BASE_URL[#model=NAME[&mode=tokens]] | replay:DIR (docs/policies.md)")
	backendName := fs.String("backend", "", "backend for tasks that name none: wasm (default), docker or containerd")
	group := fs.Int("group", 1, "episodes per task (GRPO group size)")
	concurrency := fs.Int("concurrency", 4, "episodes in flight at once")
	forkSpares := addForkSparesFlag(fs)
	out := fs.String("out", "", "output `DIR` (default out/<rollout id>)")
	resume := fs.String("resume", "", "continue the run in `DIR` (the --out of a run a signal or a kill stopped) with the same --tasks file and --group: its episodes' journals are kept as interrupted records, the episodes it never started run now, and summary.json covers them all")
	var temperature optionalFloat
	fs.Var(&temperature, "temperature", "sampling temperature sent to an openai policy (default: the server's)")
	maxTokens := fs.Int64("max-tokens", 0, "max tokens per model turn sent to an openai policy")
	auditLog := fs.String("audit-log", "", "append every sandbox call to this hash-chained log `FILE` (default $ROLLBOX_AUDIT_LOG)")
	policyRetries := fs.Int("policy-retries", 0, "retries of a failed openai policy call (429, 5xx, timeouts) before the episode ends policy_error; 0 = the default 5, -1 = none")
	policyTimeout := fs.Duration("policy-timeout", 0, "timeout of one openai policy call (default 10m)")
	trainStep := fs.Int64("train-step", 0, "the trainer's step the episodes are for: a parl reward anneals its λ by it")
	var jf judgeFlags
	jf.add(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		if *tasksFile == "" {
			return usagef("--tasks FILE is required")
		}
		if *policySpec == "" {
			return usagef("--policy is required: scripted:FILE.jsonl | openai:BASE_URL[#model=NAME[&mode=tokens]] | replay:DIR")
		}
		// claim is the run's output directory: a resumed run's (marker set)
		// now, a new run's once its flags are checked.
		var claim *outDir
		var marker *runMarker
		if *resume != "" {
			if *out != "" {
				return usagef("--resume %s and --out %s contradict each other: a resumed run writes to its own directory", *resume, *out)
			}
			var err error
			if claim, marker, err = resumeOutDir(*resume); err != nil {
				return err
			}
			defer claim.unlock()
			for name, recorded := range map[string]string{"group": strconv.Itoa(marker.Group), "backend": marker.Backend} {
				if f := cmd.Flags().Lookup(name); f.Changed && f.Value.String() != recorded {
					return usagef("--%s %s: the run in %s has --%s %s; a resumed run keeps it", name, f.Value, *resume, name, recorded)
				}
			}
			*group, *backendName, *out = marker.Group, marker.Backend, *resume
			if !cmd.Flags().Changed("concurrency") && marker.Concurrency > 0 {
				*concurrency = marker.Concurrency
			}
		}
		if *group < 1 || *group > 4096 {
			return usagef("--group %d is outside 1..4096", *group)
		}
		if *concurrency < 1 || *concurrency > 100000 {
			return usagef("--concurrency %d is outside 1..100000", *concurrency)
		}
		if err := checkForkSpares(*forkSpares); err != nil {
			return err
		}
		if *backendName == "" {
			*backendName = defaultBackend
		}
		if err := sandbox.CheckBackend(*backendName); err != nil {
			return usagef("--backend %v", err)
		}
		tasks, err := agent.LoadTasks(*tasksFile, knownTool)
		if err != nil {
			return usagef("%v", err)
		}
		policy, info, err := openPolicy(*policySpec, tasks, policyOptions{retries: *policyRetries, timeout: *policyTimeout, apiKey: env.cfg.openAIKey})
		if err != nil {
			return usagef("--policy: %v", err)
		}
		subPolicies, err := subagentPolicies(tasks, policyOptions{retries: *policyRetries, timeout: *policyTimeout, apiKey: env.cfg.openAIKey})
		if err != nil {
			return usagef("--tasks %s: %v", *tasksFile, err)
		}
		if *trainStep < 0 {
			return usagef("--train-step %d is negative", *trainStep)
		}
		if jf.concurrency < 1 {
			return usagef("--judge-concurrency %d is not positive", jf.concurrency)
		}
		for _, t := range tasks {
			if err := agent.CheckJudges(t, info); err != nil {
				return usagef("--tasks %s: task %q: %v", *tasksFile, t.ID, err)
			}
		}
		indexes, err := openSearchIndexes(tasks)
		if err != nil {
			return usagef("%v", err)
		}
		defer indexes.Close()
		var sampling agent.Sampling
		if temperature.v != nil {
			if *temperature.v < 0 {
				return usagef("--temperature %v is negative", *temperature.v)
			}
			sampling.Temperature = temperature.v
		}
		if *maxTokens > 0 {
			sampling.MaxTokens = maxTokens
		}
		total := len(tasks) * *group
		var rolloutID string
		var before *runtime.BatchRecord
		if marker != nil {
			rolloutID = marker.RolloutID
			if marker.TasksHash != "" && marker.TasksHash != tasksHash(tasks) {
				return usagef("--tasks %s: not the tasks the run in %s began with (%s): resume with that file, unchanged", *tasksFile, *out, marker.Tasks)
			}
			if before, err = runtime.RecoverBatch(*out, rolloutID, tasks, *group); err != nil {
				return usagef("--resume %s: %v", *out, err)
			}
			if err := claim.markResumed(marker); err != nil {
				return err
			}
			fmt.Fprintf(env.stderr, "rollbox run: resuming %s in %s: %d of %d episode(s) recorded (%d journal(s) of running episodes kept as interrupted records), %d to run\n",
				rolloutID, *out, len(before.Episodes), total, before.Recovered, total-len(before.Episodes))
		} else {
			rolloutID = runtime.NewID("r")
			if *out == "" {
				*out = filepath.Join("out", rolloutID)
			}
			claim, err = claimOutDir(*out, runMarker{RolloutID: rolloutID, StartedAt: time.Now().UTC(), Tasks: absPath(*tasksFile), TasksHash: tasksHash(tasks),
				Policy: info.Kind + ":" + info.Endpoint, Group: *group, Concurrency: *concurrency, Backend: *backendName, Version: versionString()})
			if err != nil {
				return err
			}
			defer claim.unlock()
		}
		backends := newBackendSet(env.stderr, env.cfg)
		backends.opts.auditLog = *auditLog
		backends.opts.forkSpares = *forkSpares
		defer backends.Close()
		// The backends the tasks need open now, before any episode starts:
		// a first-use build or compile is the runtime's, not an episode's
		// (its duration and timeouts never count it), and an engine that is
		// not there fails the run before it starts.
		for _, name := range backendsOf(tasks, *backendName) {
			if _, err := backends.get(ctx, name); err != nil {
				claim.release()
				if ctx.Err() != nil {
					return interrupted(env, ctx, err)
				}
				return err
			}
		}

		prog := newProgress(env.stderr, total)
		defer prog.stop()
		if before != nil {
			prog.resumed(before.Episodes)
		}
		fmt.Fprintf(env.stderr, "rollbox run: %d task(s) × %d = %d episode(s), concurrency %d, default backend %s, policy %s → %s\n",
			len(tasks), *group, total, *concurrency, *backendName, info.Kind, *out)
		sum, err := runtime.RunBatch(ctx, runtime.BatchConfig{
			Tasks: tasks, Group: *group, Concurrency: *concurrency, OutDir: *out,
			Backend: *backendName, NewSandbox: backends.create,
			Policy: policy, PolicyInfo: info, Sampling: sampling, RolloutID: rolloutID,
			OnEpisode: prog.episode, OnStep: prog.step, ConfigureEpisode: prog.counting(indexes.configure),
			Judges:         judge.NewPool(env.judgeOptions(jf, judgeSpecs(tasks))),
			SubagentPolicy: subPolicies, TrainStep: *trainStep, Resume: before,
		})
		prog.stop()
		if sum == nil {
			return err
		}
		fmt.Fprintf(env.stderr, "rollbox run: %d episode(s) in %.1fs: reward mean %s over %d scored, pass rate %s; ends %s; tool errors %s; truncated %s\n",
			sum.Episodes, sum.WallTimeS, fmtMean(sum.RewardMean, 3), sum.Scored, fmtMean(sum.PassRate, 2), fmtCounts(sum.Ends), fmtCounts(sum.ToolErrors),
			fmtTruncated(sum.Truncated))
		if len(sum.Monitors) > 0 || sum.Judge != nil {
			line := "rollbox run: monitors " + fmtCounts(sum.Monitors)
			if j := sum.Judge; j != nil {
				line += fmt.Sprintf("; judges: %d answer(s), %d from the cache, %d unscored episode(s), %.0f ms an episode on average", j.Requests, j.CacheHits, j.Unscored, j.MeanMS)
			}
			fmt.Fprintln(env.stderr, line)
		}
		if p := sum.Parl; p != nil {
			spur := "n/a"
			if p.SpuriousParallelismRate != nil {
				spur = fmt.Sprintf("%.2f", *p.SpuriousParallelismRate)
			}
			fmt.Fprintf(env.stderr, "rollbox run: orchestrators: %d episode(s), %d sub-agent(s); serial collapse %.2f, spurious parallelism %s; critical steps %.1f of %.1f on average\n",
				p.Episodes, p.Subagents, p.SerialCollapseRate, spur, p.CriticalStepsMean, p.TotalStepsMean)
		}
		fmt.Fprintf(env.stderr, "rollbox run: wrote %s and %s\n", filepath.Join(*out, "episodes")+string(filepath.Separator), filepath.Join(*out, "summary.json"))
		switch {
		case sum.Interrupted:
			fmt.Fprintf(env.stderr, "rollbox run: %s: %d of %d planned episode(s) started, %d recorded (summary.json says interrupted: true); rollbox run --resume %s --tasks %s --policy ... continues it\n",
				sum.Message, sum.Started, sum.Planned, sum.Episodes, *out, *tasksFile)
			return interrupted(env, ctx, err)
		case err != nil:
			return err
		case sum.Scored == 0:
			return fmt.Errorf("no episode could be scored (ends %s): reward_mean is null; see the episodes' termination messages", fmtCounts(sum.Ends))
		}
		return nil
	}
	return cmd
}

// backendsOf lists the backends the tasks run on, def for those that name
// none.
func backendsOf(tasks []*agent.Task, def string) []string {
	var names []string
	for _, t := range tasks {
		n := t.Sandbox.Backend
		if n == "" {
			n = def
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// interrupted is what a command stopped by a signal returns: the status
// shells expect (130 for SIGINT, 143 for SIGTERM), or err when no signal
// stopped it (a cancelled context in a test).
func interrupted(env *cliEnv, ctx context.Context, err error) error {
	if env.signal != nil {
		if s := env.signal(); s != nil {
			return &exitError{128 + signalNumber(s)}
		}
	}
	if err == nil {
		err = context.Cause(ctx)
	}
	return err
}

// fmtMean prints a mean that may be null.
func fmtMean(v *float64, digits int) string {
	if v == nil {
		return "null"
	}
	return strconv.FormatFloat(*v, 'f', digits, 64)
}

// absPath is p made absolute (p when that fails).
func absPath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// optionalFloat is a float flag that may be left unset (nil).
type optionalFloat struct{ v *float64 }

func (f *optionalFloat) String() string {
	if f.v == nil {
		return ""
	}
	return strconv.FormatFloat(*f.v, 'g', -1, 64)
}

func (f *optionalFloat) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return err
	}
	f.v = &v
	return nil
}

func (f *optionalFloat) Type() string { return "float" }

// knownTool validates a task's tool names: the builtins and the retrieval
// tools (a task naming those needs a retriever, which validation checks).
func knownTool(name string) bool { return tools.Known(name) }

// fmtTruncated is "0", or the total and the count per tool: "4 (bash=4)".
func fmtTruncated(t trajectory.Truncations) string {
	if t.Total == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", t.Total, fmtCounts(t.Tools))
}

func fmtCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

// backendSet opens backends on first use and shares them across episodes.
// A backend that failed to open is not remembered: the next caller tries
// again (the service adds a back-off and health reporting on top). Each
// backend opens on its own: one whose engine hangs holds up only the
// callers that need it, and they may give up (their context).
type backendSet struct {
	progress io.Writer
	opts     backendOptions
	mu       sync.Mutex
	open     map[string]sandbox.Backend
	opening  map[string]chan struct{} // one token per backend: who holds it opens it
	closed   bool
	// beforeOpen, if set, runs before the named backend first opens
	// (serve's clean-up of the containers a crashed service left, deferred
	// until docker is used). Until it returns nil the backend does not open;
	// it runs again for the next caller if it failed.
	beforeOpen map[string]func(context.Context) error
}

// newBackendSet opens backends for episodes: the WASM guests are built and
// compiled when the backend opens, not inside an episode's first command,
// where a first-use compile (seconds) would count against the model's
// exec timeout.
func newBackendSet(progress io.Writer, cfg config) *backendSet {
	return &backendSet{progress: progress, open: map[string]sandbox.Backend{}, opening: map[string]chan struct{}{},
		opts: backendOptions{cfg: cfg, warm: []string{"python", "js"}}}
}

func (b *backendSet) get(ctx context.Context, name string) (sandbox.Backend, error) {
	b.mu.Lock()
	if be, ok := b.open[name]; ok {
		b.mu.Unlock()
		return be, nil
	}
	token := b.opening[name]
	if token == nil {
		token = make(chan struct{}, 1)
		b.opening[name] = token
	}
	b.mu.Unlock()
	select {
	case token <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("backend %s: waiting for it to open: %w", name, ctx.Err())
	}
	defer func() { <-token }()
	b.mu.Lock()
	be, ok := b.open[name]
	before := b.beforeOpen[name]
	closed := b.closed
	b.mu.Unlock()
	switch {
	case ok:
		return be, nil
	case closed:
		return nil, fmt.Errorf("backend %s: %w", name, errBackendsClosed)
	}
	if before != nil {
		if err := before(ctx); err != nil {
			return nil, fmt.Errorf("backend %s: %w", name, err)
		}
		b.mu.Lock()
		delete(b.beforeOpen, name)
		b.mu.Unlock()
	}
	be, err := openBackend(ctx, name, b.progress, b.opts)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", name, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed { // closed while it opened: nobody else will close it
		be.Close()
		return nil, fmt.Errorf("backend %s: %w", name, errBackendsClosed)
	}
	b.open[name] = be
	return be, nil
}

var errBackendsClosed = errors.New("closed: the command is stopping")

func (b *backendSet) create(ctx context.Context, name string, spec sandbox.Spec) (sandbox.Sandbox, error) {
	be, err := b.get(ctx, name)
	if err != nil {
		return nil, errors.Join(err, sandbox.ErrEngineUnavailable)
	}
	return be.Create(ctx, spec)
}

func (b *backendSet) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	var errs []error
	for _, be := range b.open {
		errs = append(errs, be.Close())
	}
	return errors.Join(errs...)
}

// progress draws a bar on a terminal, or a line per episode otherwise.
type progress struct {
	w        io.Writer
	tty      bool
	total    int
	start    time.Time
	turns    atomic.Int64
	tools    atomic.Int64
	started  atomic.Int64 // episodes begun (running = started - done)
	toolErrs atomic.Int64
	mu       sync.Mutex
	done     int
	scored   int
	rewards  float64
	ends     map[string]int
	stopOnce sync.Once
	quit     chan struct{}
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, start: time.Now(), ends: map[string]int{}, quit: make(chan struct{})}
	if f, ok := w.(*os.File); ok && isTerminal(f) {
		p.tty = true
		go p.tick()
	}
	return p
}

func (p *progress) tick() {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
			p.draw()
		}
	}
}

func (p *progress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	const width = 30
	filled := 0
	if p.total > 0 {
		filled = width * p.done / p.total
	}
	mean := 0.0
	if p.scored > 0 {
		mean = p.rewards / float64(p.scored)
	}
	el := time.Since(p.start).Seconds()
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d done  %d running  reward mean %.3f  %.1f turns/s  tool errors %d/%d  %.0fs ",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.done, p.total, max(p.started.Load()-int64(p.done), 0),
		mean, float64(p.turns.Load())/max(el, 0.001), p.toolErrs.Load(), p.tools.Load(), el)
}

func (p *progress) step(s trajectory.Step) {
	if s.Type == trajectory.StepModel {
		p.turns.Add(1)
	} else {
		p.tools.Add(1)
		if s.ErrorKind != nil {
			p.toolErrs.Add(1)
		}
	}
}

// counting wraps runtime.BatchConfig.ConfigureEpisode to count episodes
// as they begin, for the running count of the summary line.
func (p *progress) counting(configure func(*agent.Config) error) func(*agent.Config) error {
	return func(c *agent.Config) error {
		p.started.Add(1)
		return configure(c)
	}
}

func (p *progress) episode(t *trajectory.Trajectory, done, total int) {
	p.mu.Lock()
	p.done = done
	p.count(t)
	p.mu.Unlock()
	reason := "?"
	if t.Termination != nil {
		reason = t.Termination.Reason
	}
	if p.tty {
		return
	}
	rw := "reward -"
	if v, ok := t.Value(); ok {
		rw = fmt.Sprintf("reward %.3f", v)
	} else if t.Reward != nil {
		rw = "reward - (" + t.Reward.ErrorKind + ")"
	}
	msg := ""
	if t.Termination != nil && t.Termination.Reason != trajectory.EndFinished && t.Termination.Message != "" {
		msg = "  (" + oneLine(t.Termination.Message, 120) + ")"
	}
	fmt.Fprintf(p.w, "[%d/%d] %s  %s  %s  turns %d  tool errors %d%s\n", done, total, t.EpisodeID, reason, rw,
		t.Stats.Turns, sumCounts(t.Stats.ToolErrors), msg)
}

// count adds t's end and reward to the totals, under p.mu.
func (p *progress) count(t *trajectory.Trajectory) {
	if v, ok := t.Value(); ok {
		p.scored++
		p.rewards += v
	}
	reason := "?"
	if t.Termination != nil {
		reason = t.Termination.Reason
	}
	p.ends[reason]++
}

// resumed counts the episodes an earlier process of a resumed run recorded.
func (p *progress) resumed(ts map[string]*trajectory.Trajectory) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range ts {
		p.count(t)
	}
	p.done += len(ts)
	p.started.Add(int64(len(ts)))
}

func (p *progress) stop() {
	p.stopOnce.Do(func() {
		close(p.quit)
		if p.tty {
			p.draw()
			fmt.Fprintln(p.w)
		}
	})
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
