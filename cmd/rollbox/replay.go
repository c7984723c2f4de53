package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/replay"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

func newReplayCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "replay TRAJECTORY.json [flags]",
		Short: "Re-execute a trajectory's tool calls and show where the results diverge",
		Long: `Recreate the sandbox a trajectory recorded (backend, image by digest, runtime,
limits, pinned environment, the task's files), re-execute its tool calls in
order and compare each result with the recorded one. Prints a line per step
and stops at the first divergence with a diff.

Exit status: 0 when everything matched, 1 at a divergence, 2 when the replay
cannot start (nothing has run then).`,
		Example: `  rollbox replay out/<rollout>/episodes/<episode>.json
  rollbox replay EPISODE.json --until 7 --shell
  rollbox replay EPISODE.json --until 7 --policy 'openai:http://127.0.0.1:8000/v1#model=NAME'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("want one trajectory file: rollbox replay TRAJECTORY.json [flags]")
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	until := fs.Int("until", -1, "stop after this step (a trajectory step index; default: replay everything)")
	shell := fs.Bool("shell", false, "open an interactive shell in the sandbox where the replay stops")
	policySpec := fs.String("policy", "", "go on live from --until with this policy `SPEC`: openai:BASE_URL[#model=NAME] (or scripted:FILE, replay:DIR)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	out := fs.String("out", "", "keep the replay's own trajectory in `DIR` (default: discarded)")
	base := fs.String("base", "", "resolve the task's relative workspace and index paths against `DIR` (default: the task file's directory the trajectory recorded, when it exists here; else the current directory)")
	strict := fs.Bool("strict", false, "compare outputs byte for byte (by default wall-clock durations such as pytest's \"in 0.02s\" are masked, and such a step is reported \"matched (durations differ)\")")
	liveSubagents := fs.Bool("live-subagents", false, "an orchestrator's sub-agents run again, each on its own recorded turns in a fresh sandbox (default: spawn_subagents answers with the recorded sub-agents' answers)")
	ignore := fs.StringArray("ignore", nil, "a regular expression (`RE`) whose matches are masked before comparing (repeatable)")
	cmd.RunE = func(cmd *cobra.Command, pos []string) error {
		ctx := cmd.Context()
		if *until < -1 {
			return usagef("--until %d is negative", *until)
		}
		var masks []*regexp.Regexp
		for _, s := range *ignore {
			re, err := regexp.Compile(s)
			if err != nil {
				return usagef("--ignore %q: %v", s, err)
			}
			masks = append(masks, re)
		}

		// Everything that can refuse the replay is checked before anything runs.
		tr, err := trajectory.Read(pos[0])
		if err != nil {
			if errors.Is(err, trajectory.ErrNewerSchema) {
				return usagef("%s: %v", pos[0], err)
			}
			return usagef("%v", err)
		}
		if err := checkHostPaths(tr, *base); err != nil {
			return err
		}
		task, err := replay.TaskOf(tr, *base)
		if err != nil {
			return usagef("%v", err)
		}
		if *until >= len(tr.Steps) {
			return usagef("--until %d: the trajectory has steps 0..%d", *until, len(tr.Steps)-1)
		}
		var policy agent.Policy
		var policyInfo trajectory.Policy
		if *policySpec != "" {
			if policy, policyInfo, err = openPolicy(*policySpec, []*agent.Task{task}, policyOptions{apiKey: env.cfg.openAIKey}); err != nil {
				return usagef("--policy: %v", err)
			}
		}
		indexes, err := openSearchIndexes([]*agent.Task{task})
		if err != nil {
			return usagef("%v (--base DIR: the directory of the task file the run read)", err)
		}
		defer indexes.Close()
		if err := sandbox.CheckBackend(tr.Sandbox.Backend); err != nil {
			return usagef("%s: sandbox.backend %v", pos[0], err)
		}
		backend, err := openBackend(ctx, tr.Sandbox.Backend, env.stderr, backendOptions{cfg: env.cfg})
		if err != nil {
			return fmt.Errorf("backend %s: %w", tr.Sandbox.Backend, err)
		}
		defer backend.Close()
		var image, note string
		if imgs, ok := sandbox.Find[replay.Images](backend); ok {
			image, note, err = replay.ResolveImage(ctx, imgs, task.Sandbox.Image, tr.Sandbox.ImageDigest)
			if err != nil {
				if errors.Is(err, replay.ErrImageMissing) || errors.Is(err, replay.ErrImageChanged) || errors.Is(err, sandbox.ErrInvalidSpec) {
					return usagef("%v", err)
				}
				return err
			}
		}

		dir := *out
		if dir == "" {
			if dir, err = os.MkdirTemp("", "rollbox-replay-"); err != nil {
				return err
			}
			defer os.RemoveAll(dir)
		}
		text := replay.Text{W: env.stdout, Color: env.cfg.colorOutput(env.stdout)}
		shown := tr.Sandbox.ImageDigest
		if shown == "" {
			shown = tr.Sandbox.Image
		}
		var notes []string
		if note != "" {
			notes = append(notes, note)
		}
		if tr.Task != nil && task.Workspace != nil {
			notes = append(notes, fmt.Sprintf("the workspace is copied from %s as it is now (the trajectory does not hold it)", task.WorkspacePath()))
		}
		if h := task.Hash(); tr.TaskHash != "" && h != tr.TaskHash {
			notes = append(notes, fmt.Sprintf("the recorded task hashes to %s today, not %s: this rollbox reads it differently", h[:12], tr.TaskHash[:min(12, len(tr.TaskHash))]))
		}
		if !*asJSON {
			text.Header(tr, shown, notes)
		}
		// The judges the reward asks: the answers the recording holds, then
		// the cache on disk, are asked before any judge is.
		judges := judge.NewPool(env.judgeOptions(judgeFlags{concurrency: judge.DefaultConcurrency}, task.Reward.JudgeSpecs()))
		if tr.Reward != nil {
			judge.Seed(judges.Cache(), tr.Reward.Judge)
		}
		configure := func(c *agent.Config) error {
			c.Judges = judges
			return indexes.configure(c)
		}
		opts := replay.Options{
			NewSandbox: func(ctx context.Context, name string, spec sandbox.Spec) (sandbox.Sandbox, error) {
				return backend.Create(ctx, spec)
			},
			Image: image, Dir: dir, BaseDir: *base, Until: *until, Policy: policy, PolicyInfo: policyInfo,
			Ignore: masks, Strict: *strict, Configure: configure, File: pos[0], LiveSubagents: *liveSubagents,
			KeepFinish: *shell && *until < 0 && policy == nil,
		}
		if !*asJSON {
			opts.OnStep = text.Step
		}
		if *shell && policy == nil {
			opts.AtStop = func(ctx context.Context, sb sandbox.Sandbox) error {
				return openShell(ctx, env, sb)
			}
		}
		report, err := replay.Episode(ctx, tr, opts)
		if report != nil {
			report.Notes = append(notes, report.Notes...)
			if *out == "" {
				report.Trajectory = ""
			}
			if *asJSON {
				enc := json.NewEncoder(env.stdout)
				enc.SetIndent("", "  ")
				enc.Encode(report)
			} else {
				text.Summary(report)
				if *out != "" {
					fmt.Fprintf(env.stdout, "the replay's own trajectory: %s\n", report.Trajectory)
				}
			}
		}
		if err != nil {
			if errors.Is(err, replay.ErrBadTrajectory) {
				return usagef("%v", err)
			}
			return err
		}
		if report.Diverged() {
			return &exitError{exitFailure}
		}
		return nil
	}
	return cmd
}

// checkHostPaths refuses, before anything runs, a task whose workspace or
// index is not where a replay from here resolves it, naming what was
// tried and --base.
func checkHostPaths(tr *trajectory.Trajectory, base string) error {
	var paths struct {
		Workspace *struct {
			From string `json:"from"`
		} `json:"workspace"`
		Retriever *struct {
			Index string `json:"index"`
		} `json:"retriever"`
	}
	if json.Unmarshal(tr.Task, &paths) != nil {
		return nil // TaskOf says what is wrong with it
	}
	dir := replay.BaseDir(tr, base)
	check := func(what, given string) error {
		if given == "" {
			return nil
		}
		resolved := given
		if !filepath.IsAbs(given) {
			resolved = filepath.Join(dir, given)
		}
		if abs, err := filepath.Abs(resolved); err == nil {
			resolved = abs
		}
		if _, err := os.Stat(resolved); err == nil {
			return nil
		}
		from := "the current directory"
		switch {
		case base != "":
			from = "--base " + base
		case replay.BaseDir(tr, "") != "":
			from = "the task file's directory the run recorded, " + tr.TaskDir
		case tr.TaskDir != "":
			from = "the current directory (the task file's directory the run recorded, " + tr.TaskDir + ", is not here)"
		}
		if filepath.IsAbs(given) {
			return usagef("the task's %s %s is not there: replay needs it as the run had it", what, given)
		}
		return usagef("the task's %s %q resolves against %s to %s, which is not there: pass --base DIR, the directory of the task file the run read", what, given, from, resolved)
	}
	if paths.Workspace != nil {
		if err := check("workspace", paths.Workspace.From); err != nil {
			return err
		}
	}
	if paths.Retriever != nil {
		return check("retriever.index", paths.Retriever.Index)
	}
	return nil
}

// openShell gives the user a shell in sb: a real terminal in a container
// when stdin is one, else a line shell through Exec.
func openShell(ctx context.Context, env *cliEnv, sb sandbox.Sandbox) error {
	fmt.Fprintf(env.stderr, "\nrollbox replay: opening a shell in %s (the episode's state at this point); exit to end the replay\n", sb.Info())
	c, isContainer := sandbox.Find[*docker.Container](sb)
	if !isContainer {
		return replay.Shell(ctx, sb, env.stdin, env.stdout)
	}
	in, tty := env.stdin.(*os.File)
	tty = tty && term.IsTerminal(int(in.Fd()))
	opts := docker.ShellOptions{Stdin: env.stdin, Stdout: env.stdout, TTY: tty}
	if tty {
		fd := int(in.Fd())
		if w, h, err := term.GetSize(fd); err == nil {
			opts.Width, opts.Height = uint(w), uint(h)
		}
		state, err := term.MakeRaw(fd)
		if err != nil {
			return fmt.Errorf("terminal: %w", err)
		}
		defer term.Restore(fd, state)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		resize := make(chan [2]uint, 1)
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case <-done:
					return
				case <-winch:
					if w, h, err := term.GetSize(fd); err == nil {
						select {
						case resize <- [2]uint{uint(w), uint(h)}:
						default:
						}
					}
				}
			}
		}()
		opts.Resize = resize
	}
	code, err := c.Shell(ctx, opts)
	if err == nil && code != 0 {
		fmt.Fprintf(env.stderr, "rollbox replay: the shell exited %d\n", code)
	}
	return err
}

// colorOutput reports whether w is a terminal that wants colour.
func (c config) colorOutput(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && !c.noColor && term.IsTerminal(int(f.Fd()))
}
