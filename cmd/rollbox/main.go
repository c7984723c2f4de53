// Command rollbox is the one binary of Rollbox: it runs rollouts, serves the
// rollout API, executes commands in sandboxes, replays and inspects
// trajectories, audits isolation and builds images.
//
// The command line is github.com/spf13/cobra's: GNU-style --flags anywhere
// among the arguments (up to a `--`), help on stdout (`rollbox help CMD`,
// `CMD --help`), `rollbox --version`, `rollbox completion bash|zsh|fish`.
// Exit status: 0 ok, 1 a runtime failure, 2 bad input (nothing was
// started); `rollbox exec` passes its command's status through.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// version is set by -ldflags "-X main.version=..." in release builds.
var version = "dev"

// Exit codes shared by every command.
const (
	exitOK       = 0
	exitFailure  = 1 // a runtime failure
	exitBadInput = 2 // bad flags or input; nothing was started
)

// usageError marks bad input: the command exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// exitError carries a specific exit status (rollbox exec passes the
// command's through; an interrupted run exits 128+signal).
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// cliEnv is what a command may touch of the outside world.
type cliEnv struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// getenv reads the environment (os.Getenv when nil), once, into cfg
	// when the command starts.
	getenv func(string) string
	cfg    config
	// signal is the signal that cancelled the command's context, when one
	// did (main's signal handler sets it); nil otherwise.
	signal func() os.Signal
	// stopNotice, when set, is what main's signal handler says a signal
	// does; a command that stops otherwise than by recording its episodes
	// interrupted (the default notice) stores its own.
	stopNotice *atomic.Pointer[string]
	// self makes a command that runs this program with args in a child
	// process (rollbox serve's health responder, rollbox bench's fake
	// policy); exec of os.Executable when nil. Tests point it at their
	// TestMain.
	self func(args ...string) (*exec.Cmd, error)
	// ownProcess is set when the process is the command's own (main, a
	// test's child process), not a test's: only then may rollbox serve
	// execute its image again in place (--recycle-above).
	ownProcess bool
	// args are the command's arguments (run's).
	args []string
}

// command runs this program with args in a child process (see self).
func (env *cliEnv) command(args ...string) (*exec.Cmd, error) {
	if env.self != nil {
		return env.self(args...)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return exec.Command(exe, args...), nil
}

// Command groups, in the order `rollbox --help` lists them.
var commandGroups = []*cobra.Group{
	{ID: "episodes", Title: "Run episodes and look at what they did:"},
	{ID: "sandboxes", Title: "Sandboxes, images and isolation:"},
	{ID: "service", Title: "The rollout service:"},
	{ID: "search", Title: "Search indexes:"},
}

// newRoot builds the command tree for one invocation.
func newRoot(env *cliEnv) *cobra.Command {
	root := &cobra.Command{
		Use:   "rollbox",
		Short: "A rollout sandbox runtime for RL agents",
		Long: `Rollbox runs agent episodes, each in its own isolated sandbox (a WASM instance,
embedded, or a container on the local Docker engine or containerd), and records
every episode as a trajectory with its reward.

  rollbox run --tasks examples/coding/tasks.jsonl --policy scripted:examples/coding/policy.jsonl
  rollbox inspect out/<rollout id>/episodes/<episode id>.json

Docs: README.md and docs/ in the repository.`,
		Version:       versionString(),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetVersionTemplate("rollbox {{.Version}}\n")
	root.SetIn(env.stdin)
	root.SetOut(env.stdout)
	root.SetErr(env.stderr)
	root.SetFlagErrorFunc(flagError)
	root.AddGroup(commandGroups...)
	for _, c := range []*cobra.Command{
		newRunCmd(env), newReplayCmd(env), newInspectCmd(env), newExportCmd(env), newRescoreCmd(env), newTasksCmd(env),
	} {
		c.GroupID = "episodes"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{newExecCmd(env), newAuditCmd(env), newImagesCmd(env), newGCCmd(env)} {
		c.GroupID = "sandboxes"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{newServeCmd(env), newWorkerCmd(env), newImportCmd(env), newBenchCmd(env)} {
		c.GroupID = "service"
		root.AddCommand(c)
	}
	root.AddCommand(newServeHealthCmd(env), newFakePolicyCmd(env))
	ix := newIndexCmd(env)
	ix.GroupID = "search"
	root.AddCommand(ix)
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(env.stdout, "rollbox %s\n", versionString())
			return nil
		},
	})
	return root
}

func main() {
	var notice atomic.Pointer[string]
	ctx, sig, stop := withSignals(context.Background(), os.Stderr, &notice)
	defer stop()
	env := &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, signal: sig, stopNotice: &notice, ownProcess: true}
	os.Exit(run(ctx, env, os.Args[1:]))
}

// withSignals returns a context that SIGINT or SIGTERM cancels, and the
// signal that did (nil before one came). It says on stderr what the
// signal does: notice's text when set, else that the episodes in flight are
// recorded interrupted. A second signal exits at once with 128+its number.
func withSignals(parent context.Context, stderr io.Writer, notice *atomic.Pointer[string]) (context.Context, func() os.Signal, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var got os.Signal
	received := make(chan struct{})
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		got = s
		close(received)
		say := "stopping; the episodes in flight are recorded interrupted (a second signal stops at once)"
		if n := notice.Load(); n != nil {
			say = *n
		}
		fmt.Fprintf(stderr, "\nrollbox: %s: %s\n", signalName(s), say)
		cancel(&agent.StopCause{Reason: trajectory.EndInterrupted, Message: "interrupted by " + signalName(s)})
		if s, ok = <-sigs; ok {
			os.Exit(128 + signalNumber(s))
		}
	}()
	which := func() os.Signal {
		select {
		case <-received:
			return got
		default:
			return nil
		}
	}
	return ctx, which, func() { signal.Stop(sigs); close(sigs); cancel(nil) }
}

// signalName is SIGINT, SIGTERM, ... for s.
func signalName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

// signalNumber is s's number (SIGINT 2, SIGTERM 15).
func signalNumber(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 0
}

// run executes one command line and returns the process's exit status.
func run(ctx context.Context, env *cliEnv, args []string) int {
	getenv := env.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	env.cfg = readConfig(getenv)
	env.args = args
	root := newRoot(env)
	root.SetArgs(args)
	// started is set once a command's own code runs: any error before it
	// (an unknown command or flag, a missing argument) is bad input.
	started := false
	root.PersistentPreRun = func(*cobra.Command, []string) { started = true }
	cmd, err := root.ExecuteContextC(ctx)
	var ue *usageError
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue) || !started:
		fmt.Fprintf(env.stderr, "%s: %v\n", cmd.CommandPath(), err)
		if !strings.Contains(err.Error(), "--help") {
			fmt.Fprintf(env.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		return exitBadInput
	default:
		fmt.Fprintf(env.stderr, "%s: %v\n", cmd.CommandPath(), err)
		return exitFailure
	}
}

// singleDashLong matches pflag's error for a Go-style single-dash long flag
// (-tasks), which it reads as the shorthands -t -a -s ...
var singleDashLong = regexp.MustCompile(`in -([A-Za-z][-A-Za-z0-9]+)`)

// flagError turns a flag parsing error into bad input, and points a
// single-dash long flag at its two-dash spelling.
func flagError(c *cobra.Command, err error) error {
	if m := singleDashLong.FindStringSubmatch(err.Error()); m != nil {
		name, _, _ := strings.Cut(m[1], "=")
		if c.Flags().Lookup(name) != nil {
			return usagef("-%s: long flags take two dashes: --%s", m[1], name)
		}
	}
	return usagef("%v", err)
}

// noArgs is cobra.NoArgs with a message that names the words.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected arguments: %s", strings.Join(args, " "))
	}
	return nil
}

// groupRunE is the RunE of a command that only holds subcommands (images,
// index): without arguments it prints its help; an unknown subcommand is
// bad input with cobra's suggestions.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return usagef("%s (commands: %s)", msg, strings.Join(names, ", "))
}

// versionString is the version and, for a build from a checkout (`go
// install ./cmd/rollbox`), the commit it was built from.
func versionString() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	parts := []string{bi.GoVersion}
	if rev != "" {
		c := "commit " + rev[:min(12, len(rev))]
		if modified == "true" {
			c += " with local changes"
		}
		parts = append(parts, c)
	}
	return fmt.Sprintf("%s (%s)", v, strings.Join(parts, ", "))
}

// flagChanged reports whether the user set the flag name on the command
// line.
func flagChanged(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && f.Changed
}
