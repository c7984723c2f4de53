package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/internal/audit"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/auditlog"
)

// Probe programs, built from images/probe.
var (
	probeTarget     = images.Target{Package: "images/probe", GOOS: "linux", GOARCH: "amd64", Name: "probe"}
	probeWASITarget = images.Target{Package: "images/probe", GOOS: "wasip1", GOARCH: "wasm", Name: "probe.wasm"}
)

// runAudit is `rollbox audit [flags]` (probe a sandbox configuration) and
// `rollbox audit verify-log FILE` (check an audit log's chain).
func runAudit(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) > 0 && args[0] == "verify-log" {
		return runVerifyLog(env, args[1:])
	}
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	backendName := fs.String("backend", "docker", "sandbox backend: docker or wasm")
	runtimeName := fs.String("runtime", "", "OCI runtime for docker: runc (default) or runsc")
	image := fs.String("image", "", "image: a recipe name (base, python) or docker:NAME:TAG (default base)")
	network := fs.String("network", "", "network: none (default) or bridge, which loosens isolation and fails the network probes")
	tasksFile := fs.String("tasks", "", "audit the sandbox a task asks for (with --task)")
	taskID := fs.String("task", "", "the task's id in --tasks")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	auditLog := fs.String("audit-log", "", "append the audit sandbox's calls to this hash-chained log (default $ROLLBOX_AUDIT_LOG)")
	fs.Usage = func() {
		fmt.Fprintf(env.stderr, "usage: rollbox audit [--backend docker|wasm] [--runtime runc|runsc] [--image NAME] [--network none|bridge] [--tasks FILE --task ID] [--json]\n       rollbox audit verify-log FILE [--json]\n\nprobes, in order: %s\n\n", strings.Join(audit.Names(), " "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v (verify-log comes first: rollbox audit verify-log FILE)", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var spec sandbox.Spec
	if (*tasksFile == "") != (*taskID == "") {
		return usagef("--tasks and --task go together")
	}
	if *tasksFile != "" {
		tasks, err := agent.LoadTasks(*tasksFile, knownTool)
		if err != nil {
			return usagef("%v", err)
		}
		var task *agent.Task
		for _, t := range tasks {
			if t.ID == *taskID {
				task = t
			}
		}
		if task == nil {
			return usagef("--task %q is not in %s", *taskID, *tasksFile)
		}
		spec = task.SandboxSpec()
		if !set["backend"] {
			*backendName = task.Sandbox.Backend
			if *backendName == "" {
				*backendName = defaultBackend
			}
		}
	}
	if set["runtime"] {
		spec.Runtime = *runtimeName
	}
	if set["image"] {
		spec.Image = *image
	}
	if set["network"] {
		spec.Network = *network
	}
	if err := sandbox.CheckBackend(*backendName); err != nil {
		return usagef("--backend %v", err)
	}
	switch *backendName {
	case sandbox.BackendDocker:
		if spec.Image == "" {
			spec.Image = "base"
		}
	case sandbox.BackendWASM:
		if spec.Runtime != "" {
			return usagef("--runtime %q: the wasm backend has no OCI runtime (it runs WASI modules in this process)", spec.Runtime)
		}
	}
	if err := spec.Validate(); err != nil {
		var fe *sandbox.FieldError
		if errors.As(err, &fe) {
			return usagef("--%s: %s", strings.TrimPrefix(fe.Field, "limits."), fe.Message)
		}
		return usagef("%v", err)
	}
	if l := spec.Loosened(); len(l) > 0 {
		fmt.Fprintf(env.stderr, "rollbox audit: WARNING: this spec loosens isolation: %s\n", strings.Join(l, ", "))
	}

	builder := env.cfg.builder(env.stderr)
	opts := audit.Options{Progress: env.stderr}
	var err error
	if *backendName == sandbox.BackendWASM {
		opts.ProbeWASI, err = builder.Build(ctx, probeWASITarget)
	} else {
		opts.ProbeLinux, err = builder.Build(ctx, probeTarget)
	}
	if err != nil {
		return fmt.Errorf("building the probe program: %w", err)
	}
	backend, err := openBackend(ctx, *backendName, env.stderr, backendOptions{auditLog: *auditLog, cfg: env.cfg})
	if err != nil {
		return err
	}
	defer backend.Close()
	rep, err := audit.Run(ctx, backend, spec, opts)
	if err != nil {
		if errors.Is(err, sandbox.ErrInvalidSpec) {
			return usagef("%v", err)
		}
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printReport(env.stdout, rep)
	}
	if !rep.Pass {
		fmt.Fprintf(env.stderr, "rollbox audit: %d of %d probes failed\n", rep.Failed, len(rep.Probes))
		return &exitError{exitFailure}
	}
	return nil
}

// printReport writes the report as a table.
func printReport(w io.Writer, rep *audit.Report) {
	info := rep.Sandbox
	fmt.Fprintf(w, "rollbox audit: %s backend", rep.Backend)
	if info.Runtime != "" {
		fmt.Fprintf(w, ", runtime %s", info.Runtime)
	}
	fmt.Fprintf(w, ", image %s, network %s, limits cpus %.2g memory %d MB pids %d disk %d MB tmp %d MB output %d B\n",
		orDash(info.Image), rep.Spec.Network, rep.Spec.Limits.CPUs, rep.Spec.Limits.MemoryMB, rep.Spec.Limits.PIDs,
		rep.Spec.Limits.DiskMB, rep.Spec.Limits.TmpMB, rep.Spec.Limits.OutputBytes)
	if len(rep.Loosened) > 0 {
		fmt.Fprintf(w, "LOOSENED: %s\n", strings.Join(rep.Loosened, ", "))
	} else {
		fmt.Fprintln(w, "loosened: nothing (the hardened default)")
	}
	fmt.Fprintln(w)
	for _, p := range rep.Probes {
		fmt.Fprintf(w, "%-18s %-4s %s\n", p.Name, p.Status, oneLine(p.Evidence, 200))
	}
	fmt.Fprintf(w, "\n%d passed, %d failed, %d not applicable in %.1fs\n", rep.Passed, rep.Failed, rep.NA, rep.DurationS)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// runVerifyLog is `rollbox audit verify-log FILE [--json]`.
func runVerifyLog(env *cliEnv, args []string) error {
	fs := flag.NewFlagSet("audit verify-log", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	asJSON := fs.Bool("json", false, "print the result as JSON")
	flags, pos := splitPositional(args)
	if err := fs.Parse(flags); err != nil {
		return usagef("%v", err)
	}
	pos = append(pos, fs.Args()...)
	if len(pos) != 1 {
		return usagef("verify-log takes one file: rollbox audit verify-log FILE")
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return usagef("%v", err)
	}
	defer f.Close()
	sum, err := auditlog.Verify(f)
	var ve *auditlog.VerifyError
	if err != nil && !errors.As(err, &ve) {
		return err
	}
	if *asJSON {
		out := map[string]any{"file": pos[0], "ok": err == nil, "lines": sum.Lines, "head": sum.Head}
		if ve != nil {
			out["bad_line"], out["reason"] = ve.Line, ve.Reason
		} else {
			out["sandboxes"], out["execs"], out["writes"], out["episodes"] = sum.Sandbox, sum.Execs, sum.Writes, sum.Episodes
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Fprintln(env.stdout, string(b))
	} else if ve == nil {
		fmt.Fprintf(env.stdout, "%s: ok: %d lines (%d sandboxes, %d execs, %d writes, %d episodes) from %s to %s; head %s\n",
			pos[0], sum.Lines, sum.Sandbox, sum.Execs, sum.Writes, sum.Episodes,
			sum.First.Format("2006-01-02T15:04:05Z"), sum.Last.Format("2006-01-02T15:04:05Z"), orDash(sum.Head))
	}
	if ve != nil {
		fmt.Fprintf(env.stderr, "rollbox audit verify-log: %s: %v (the %d lines before it verify)\n", pos[0], ve, sum.Lines)
		return &exitError{exitFailure}
	}
	return nil
}

// splitPositional separates flags from positional words so a file may come
// before or after them.
func splitPositional(args []string) (flags, pos []string) {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			flags = append(flags, a)
		} else {
			pos = append(pos, a)
		}
	}
	return flags, pos
}
