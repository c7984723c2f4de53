package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

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

// newAuditCmd is `rollbox audit [flags]` (probe a sandbox configuration)
// and `rollbox audit verify-log FILE` (check an audit log's chain).
func newAuditCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit [flags]",
		Short: "Prove a sandbox configuration's isolation with probes; verify-log checks an audit log",
		Long: `Run the isolation probes (` + strings.Join(audit.Names(), ", ") + `)
in a sandbox of the given configuration and report each with its evidence.
A spec that loosens isolation (--network bridge) is named LOOSENED and fails the
probes it opens. SECURITY.md describes every probe.

Exit status: 0 when every probe passed, 1 when one failed, 2 for bad input.`,
		Example: `  rollbox audit --json
  rollbox audit --runtime runsc
  rollbox audit --backend containerd --runtime runsc
  rollbox audit --backend wasm
  rollbox audit --tasks examples/coding/docker-tasks.jsonl --task fix-add-pytest
  rollbox audit verify-log audit.jsonl`,
		Args: noArgs,
	}
	cmd.AddCommand(newVerifyLogCmd(env))
	fs := cmd.Flags()
	fs.SortFlags = false
	backendName := fs.String("backend", "docker", "sandbox backend: docker, containerd or wasm")
	runtimeName := fs.String("runtime", "", "OCI runtime for docker and containerd: runc (default) or runsc (gVisor)")
	image := fs.String("image", "", "image `NAME`: a recipe name (base, python) or docker:NAME:TAG (default base)")
	network := fs.String("network", "", "network: none (default) or bridge, which loosens isolation and fails the network probes")
	tasksFile := fs.String("tasks", "", "audit the sandbox a task of this task `FILE` asks for (with --task)")
	taskID := fs.String("task", "", "the task's `ID` in --tasks")
	probes := fs.StringSlice("probes", nil, "run only these probes, comma-separated `NAMES` (default every probe)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	auditLog := fs.String("audit-log", "", "append the audit sandbox's calls to this hash-chained log `FILE` (default $ROLLBOX_AUDIT_LOG)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
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
			if !flagChanged(fs, "backend") {
				*backendName = task.Sandbox.Backend
				if *backendName == "" {
					*backendName = defaultBackend
				}
			}
		}
		if flagChanged(fs, "runtime") {
			spec.Runtime = *runtimeName
		}
		if flagChanged(fs, "image") {
			spec.Image = *image
		}
		if flagChanged(fs, "network") {
			spec.Network = *network
		}
		if err := sandbox.CheckBackend(*backendName); err != nil {
			return usagef("--backend %v", err)
		}
		for _, name := range *probes {
			if !slices.Contains(audit.Names(), name) {
				return usagef("--probes: %q is not a probe (%s)", name, strings.Join(audit.Names(), ", "))
			}
		}
		switch *backendName {
		case sandbox.BackendDocker, sandbox.BackendContainerd:
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
		opts := audit.Options{Progress: env.stderr, Only: *probes}
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
	return cmd
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

// newVerifyLogCmd is `rollbox audit verify-log FILE... [--json]`.
func newVerifyLogCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "verify-log FILE... [--json]",
		Short: "Check an audit log's hash chain; names the first edited, deleted or inserted line",
		Long: `Check the hash chain of an audit log written with --audit-log (or
$ROLLBOX_AUDIT_LOG, or rollbox serve's DATA/audit.jsonl): one JSON line per
sandbox create, exec, file write and close, each sealing the one before. Exit
status 1 names the first line that was edited, deleted or inserted.

A log rotated by size (rollbox serve's) is several files: give them oldest
first (FILE.2 FILE.1 FILE); each must then start with a rotate record that
seals the end of the one before it, so a cut or edited end is found too.`,
		Example: `  rollbox audit verify-log audit.jsonl
  rollbox audit verify-log data/audit.jsonl.2 data/audit.jsonl.1 data/audit.jsonl`,
	}
	asJSON := cmd.Flags().Bool("json", false, "print the result as JSON")
	cmd.RunE = func(cmd *cobra.Command, pos []string) error {
		if len(pos) == 0 {
			return usagef("verify-log takes the log's files, oldest first: rollbox audit verify-log FILE...")
		}
		for _, p := range pos {
			if _, err := os.Stat(p); err != nil {
				return usagef("%v", err)
			}
		}
		sums, err := auditlog.VerifyFiles(pos)
		var ve *auditlog.VerifyError
		var fe *auditlog.FileError
		if err != nil && !errors.As(err, &ve) {
			return err
		}
		bad := ""
		if errors.As(err, &fe) {
			bad = fe.Path
		}
		total := auditlog.Total(sums)
		if *asJSON {
			name := pos[len(pos)-1]
			if bad != "" {
				name = bad
			}
			out := map[string]any{"file": name, "ok": err == nil, "lines": total.Lines, "head": total.Head}
			if len(pos) > 1 {
				out["files"] = pos
			}
			if ve != nil {
				out["bad_line"], out["reason"] = ve.Line, ve.Reason
			} else {
				out["sandboxes"], out["execs"], out["writes"], out["episodes"] = total.Sandbox, total.Execs, total.Writes, len(total.EpisodeIDs)
			}
			b, _ := json.MarshalIndent(out, "", "  ")
			fmt.Fprintln(env.stdout, string(b))
		} else if ve == nil {
			fmt.Fprintf(env.stdout, "%s: ok: %d lines (%d sandboxes, %d execs, %d writes, %d episodes) from %s to %s; head %s\n",
				strings.Join(pos, " "), total.Lines, total.Sandbox, total.Execs, total.Writes, len(total.EpisodeIDs),
				total.First.Format("2006-01-02T15:04:05Z"), total.Last.Format("2006-01-02T15:04:05Z"), orDash(total.Head))
		}
		if ve != nil {
			fmt.Fprintf(env.stderr, "rollbox audit verify-log: %s: %v (the %d lines before it verify)\n", bad, ve, sums[len(sums)-1].Lines)
			return &exitError{exitFailure}
		}
		return nil
	}
	return cmd
}
