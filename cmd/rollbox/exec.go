package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rollbox/rollbox/sandbox"
)

// exitSandboxFailed is rollbox exec's status when the sandbox itself failed.
const exitSandboxFailed = 125

func newExecCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec [flags] [--] CMD [ARGS...]",
		Short: "Run one command in a fresh hardened sandbox",
		Long: `Run one command in a fresh sandbox with the default hardened spec and remove
the sandbox. The command's stdout and stderr pass through and its exit status
is rollbox's (125 when the sandbox itself failed, 2 for bad input).

Flags come before the command; everything from the first word that is not a
flag (or after --) is the command. The WASM backend (the default) has sh with
the usual utilities, python and js built in; --image, --runtime and --network
bridge are the Docker backend's and are refused there.`,
		Example: `  rollbox exec -- sh -c 'echo hi | wc -c'
  rollbox exec -- python -c 'print(1+1)'
  rollbox exec --backend docker --image python -- python3 -c 'print(1)'
  rollbox exec --backend docker --runtime runsc -- uname -a`,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.SetInterspersed(false)
	backendName := fs.String("backend", defaultBackend, "sandbox backend: wasm, docker or containerd")
	image := fs.String("image", "", "docker image `NAME`: a recipe name (base, python) or docker:NAME:TAG (default base)")
	runtimeName := fs.String("runtime", "", "OCI runtime for docker and containerd: runc (default) or runsc (gVisor)")
	network := fs.String("network", sandbox.NetworkNone, "network: none, or bridge on docker (loosens isolation)")
	timeout := fs.Duration("timeout", 0, "wall-clock limit of the command (default: the spec's)")
	memory := fs.Int("memory", 0, "memory limit in MB (default 512)")
	auditLog := fs.String("audit-log", "", "append every sandbox call to this hash-chained log `FILE` (default $ROLLBOX_AUDIT_LOG)")
	cmd.RunE = func(cmd *cobra.Command, argv []string) error {
		ctx := cmd.Context()
		if len(argv) == 0 {
			return usagef("no command given: rollbox exec [flags] -- CMD ARGS...")
		}
		spec := sandbox.Spec{Image: *image, Runtime: *runtimeName, Network: *network}
		spec.Limits.MemoryMB = *memory
		if err := spec.Validate(); err != nil {
			return usagef("%v", err)
		}
		if err := sandbox.CheckBackend(*backendName); err != nil {
			return usagef("--backend %v", err)
		}
		if *backendName == sandbox.BackendWASM {
			if err := refuseDockerOnlyFlags(fs, spec); err != nil {
				return err
			}
		}
		opts := backendOptions{auditLog: *auditLog, cfg: env.cfg}
		if *backendName == sandbox.BackendWASM && (argv[0] == "python" || argv[0] == "js") {
			opts.warm = argv[:1] // built and compiled with the progress line, not inside the command's time
		}
		backend, err := openBackend(ctx, *backendName, env.stderr, opts)
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
	return cmd
}

// refuseDockerOnlyFlags refuses, on the WASM backend, the flags only the
// Docker backend has: ignoring them would run something else than asked
// (gpython for --image python, no gVisor for --runtime runsc).
func refuseDockerOnlyFlags(fs *pflag.FlagSet, spec sandbox.Spec) error {
	switch {
	case flagChanged(fs, "image"):
		return usagef("--image %s: the wasm backend has no images (sh, python and js are built in); use --backend docker for a container image", spec.Image)
	case flagChanged(fs, "runtime"):
		return usagef("--runtime %s: the wasm backend has no OCI runtime (it runs WASI modules in this process); use --backend docker", spec.Runtime)
	case spec.Network != "" && spec.Network != sandbox.NetworkNone:
		return usagef("--network %s: the wasm backend has no network at all; use --backend docker", spec.Network)
	}
	return nil
}
