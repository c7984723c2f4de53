package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// exitSandboxFailed is rollbox exec's status when the sandbox itself failed.
const exitSandboxFailed = 125

func runExec(ctx context.Context, env *cliEnv, args []string) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	backendName := fs.String("backend", defaultBackend, "sandbox backend: wasm or docker")
	image := fs.String("image", "", "image: a recipe name (base, python) or docker:NAME:TAG")
	runtimeName := fs.String("runtime", "", "OCI runtime for docker: runc or runsc")
	network := fs.String("network", sandbox.NetworkNone, "network: none (default) or bridge (loosens isolation)")
	timeout := fs.Duration("timeout", 0, "wall-clock limit of the command (default: the spec's)")
	memory := fs.Int("memory", 0, "memory limit in MB (default 512)")
	auditLog := fs.String("audit-log", "", "append every sandbox call to this hash-chained log (default $ROLLBOX_AUDIT_LOG)")
	flagArgs, argv, found := splitDashDash(args)
	if err := fs.Parse(flagArgs); err != nil {
		return usagef("%v", err)
	}
	if !found {
		argv = fs.Args()
	} else if fs.NArg() > 0 {
		return usagef("unexpected arguments before --: %v", fs.Args())
	}
	if len(argv) == 0 {
		return usagef("no command given: rollbox exec [flags] -- CMD ARGS...")
	}
	spec := sandbox.Spec{Image: *image, Runtime: *runtimeName, Network: *network}
	spec.Limits.MemoryMB = *memory
	if err := spec.Validate(); err != nil {
		return usagef("%v", err)
	}
	backend, err := openBackend(ctx, *backendName, env.stderr, backendOptions{auditLog: *auditLog, cfg: env.cfg})
	if err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			return err
		}
		fmt.Fprintf(env.stderr, "rollbox exec: %v\n", err)
		return &exitError{exitSandboxFailed}
	}
	defer backend.Close()
	sb, err := backend.Create(ctx, spec)
	if err != nil {
		fmt.Fprintf(env.stderr, "rollbox exec: %v\n", err)
		if errors.Is(err, sandbox.ErrInvalidSpec) {
			return &exitError{exitBadInput}
		}
		return &exitError{exitSandboxFailed}
	}
	defer sb.Close()
	var stdin []byte
	if env.stdin != nil && !isTerminal(env.stdin) {
		stdin, _ = io.ReadAll(io.LimitReader(env.stdin, sandbox.MaxFileBytes))
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: argv, Stdin: stdin, Timeout: *timeout})
	if err != nil {
		fmt.Fprintf(env.stderr, "rollbox exec: %v\n", err)
		return &exitError{exitSandboxFailed}
	}
	env.stdout.Write(res.Stdout)
	env.stderr.Write(res.Stderr)
	if res.StdoutDropped > 0 || res.StderrDropped > 0 {
		fmt.Fprintf(env.stderr, "rollbox exec: output capped: %d stdout and %d stderr bytes dropped\n", res.StdoutDropped, res.StderrDropped)
	}
	switch {
	case res.TimedOut:
		fmt.Fprintf(env.stderr, "rollbox exec: timed out after %v\n", res.Duration.Round(time.Millisecond))
	case res.OOMKilled:
		fmt.Fprintln(env.stderr, "rollbox exec: out of memory")
	case res.Trap != "":
		fmt.Fprintf(env.stderr, "rollbox exec: trap: %s\n", res.Trap)
	}
	if res.ExitCode != 0 {
		return &exitError{res.ExitCode}
	}
	return nil
}
