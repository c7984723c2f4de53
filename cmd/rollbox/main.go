// Command rollbox is the one binary of Rollbox: it runs rollouts, serves the
// rollout API, executes commands in sandboxes, replays and inspects
// trajectories, audits isolation and builds images.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
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
// command's through).
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

type command struct {
	summary string
	run     func(ctx context.Context, env *cliEnv, args []string) error
}

// cliEnv is what a command may touch of the outside world.
type cliEnv struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// getenv reads the environment (os.Getenv when nil), once, into cfg
	// when the command starts.
	getenv func(string) string
	cfg    config
}

func commands() map[string]command {
	return map[string]command{
		"version": {"print the version", runVersion},
		"exec":    {"run one command in a fresh hardened sandbox", runExec},
		"images":  {"build the images (container recipes base, python; wasm guests; the guest agent) or list them (rollbox images build [NAME...] | list)", runImages},
		"gc":      {"remove what crashed rollbox processes left: containers, mounts, temp dirs, leases", runGC},
		"audit":   {"prove a sandbox configuration's isolation with probes; verify-log checks an audit log", runAudit},
		"index":   {"build, inspect or query a search index (rollbox index build --corpus FILE --out DIR)", runIndex},
		"run":     {"run every task of a task file (× group) and write trajectories", runRun},
		"inspect": {"show a trajectory in the terminal, or serve a run's episodes as a web page (rollbox inspect FILE | --serve DIR)", runInspect},
		"replay":  {"re-execute a trajectory's tool calls and show where the results diverge (rollbox replay FILE [--until N] [--shell])", runReplay},
		"serve":   {"serve the rollout HTTP API (rollbox serve [--addr 127.0.0.1:7070] [--data DIR])", runServe},
		"export":  {"write trajectories as one JSONL or Parquet file (rollbox export --from DIR [--rollout ID] --format parquet --out FILE)", runExport},
		"bench":   {"load-test the rollout service against a fake policy (rollbox bench --episodes N --turns M --latency D)", runBench},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr}
	os.Exit(run(ctx, env, os.Args[1:]))
}

func run(ctx context.Context, env *cliEnv, args []string) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.stderr, cmds)
		if len(args) == 0 {
			return exitBadInput
		}
		return exitOK
	}
	c, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(env.stderr, "rollbox: unknown command %q\n", args[0])
		usage(env.stderr, cmds)
		return exitBadInput
	}
	getenv := env.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	env.cfg = readConfig(getenv)
	err := c.run(ctx, env, args[1:])
	var ue *usageError
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(env.stderr, "rollbox %s: %v\n", args[0], err)
		return exitBadInput
	default:
		fmt.Fprintf(env.stderr, "rollbox %s: %v\n", args[0], err)
		return exitFailure
	}
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: rollbox COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nrun 'rollbox COMMAND -h' for a command's flags")
}

func runVersion(ctx context.Context, env *cliEnv, args []string) error {
	fmt.Fprintf(env.stdout, "rollbox %s\n", version)
	return nil
}

// splitDashDash returns the flags before "--" and the words after it.
func splitDashDash(args []string) (flags, rest []string, found bool) {
	for i, a := range args {
		if a == "--" {
			return args[:i], args[i+1:], true
		}
	}
	return args, nil, false
}
