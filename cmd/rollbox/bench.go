package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/internal/loadgen"
	"github.com/rollbox/rollbox/sandbox"
)

// newBenchCmd is `rollbox bench`: a load generator for the rollout service.
// It starts the fake OpenAI-compatible policy server (latency configurable)
// in this process and `rollbox serve` as a child process (so the service's
// peak RSS is its own), then either
//
//	--mode rollout:  one rollout of N episodes × M turns (M-1 bash calls of
//	                 `true`, then finish), streamed back; reports completion,
//	                 throughput, the runtime's overhead per turn (p50/p99) and
//	                 the service's peak RSS (VmHWM);
//	--mode env-step: one environment-mode episode stepped with bash `true`
//	                 over HTTP, side by side with `docker exec` of the same
//	                 command in the same container (docker backend).
func newBenchCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Load-test the rollout service against a fake policy",
		Long: `Start a fake OpenAI-compatible policy (--latency per call) and rollbox serve as a
child process, submit one rollout of --episodes × --turns (bash true each turn,
finish last), read it back as a stream and report completion, throughput, the
runtime's overhead per turn (p50/p99) and the service's peak RSS. --mode
env-step times environment-mode steps over HTTP beside docker exec of the same
command in the same container.`,
		Example: `  rollbox bench --episodes 1000 --turns 10 --latency 200ms
  rollbox bench --backend docker --mode env-step --steps 200`,
		Args: noArgs,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	mode := fs.String("mode", "rollout", "rollout or env-step")
	backend := fs.String("backend", "wasm", "wasm or docker")
	image := fs.String("image", "base", "docker image of the episodes (docker backend)")
	episodes := fs.Int("episodes", 1000, "episodes in the rollout (a multiple of --group)")
	group := fs.Int("group", 10, "group size")
	turns := fs.Int("turns", 10, "model turns per episode: turns-1 bash calls of `true`, then finish")
	latency := fs.Duration("latency", 200*time.Millisecond, "fake policy latency per call")
	jitter := fs.Duration("jitter", 0, "extra random fake policy latency in [0, jitter)")
	policyConc := fs.Int("policy-concurrency", 1024, "service: policy calls in flight per endpoint")
	warm := fs.Int("warm", 16, "service: warm docker sandboxes per spec")
	steps := fs.Int("steps", 200, "env-step: timed steps (and as many docker execs)")
	url := fs.String("url", "", "bench a running service at this `URL` instead of starting one (its peak RSS is read from /metrics)")
	asJSON := fs.Bool("json", false, "print the results as JSON instead of the text report")
	keep := fs.String("data", "", "the service's data `DIR` (default: a temporary one, removed)")
	serveProfile := fs.String("serve-cpuprofile", "", "have the service write a CPU profile to this `FILE`")
	schedule := fs.String("schedule", "", "the rollout's schedule: groups or episodes (default: the service's, groups when --group > 1)")
	compare := fs.Bool("compare-schedules", false, "run the rollout twice on the same service, schedule episodes then groups, and compare when the first complete group arrives")
	settle := fs.Duration("settle", 0, "after the rollout, watch the service's resident memory for this long (does it give memory back?)")
	baseline := fs.String("baseline-exe", "", "also run the same rollout on a service started from this rollbox `FILE` (an older build), first, and compare /healthz and memory side by side")
	profileDir := fs.String("serve-profiles", "", "have the service serve Go's profiles (--debug-addr) and save its goroutine and heap profiles and an execution trace into `DIR` (DIR/baseline and DIR/this-build with --baseline-exe)")
	profileAt := fs.Duration("serve-profiles-at", 20*time.Second, "with --serve-profiles: when to take them, after the submission")
	traceFor := fs.Duration("serve-trace-for", 5*time.Second, "with --serve-profiles: the execution trace's length (0: no trace)")
	serveExe := fs.String("serve-exe", "", "start the service from this `FILE` (an executable taking rollbox serve's arguments: a wrapper may set limits) instead of this binary")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		switch {
		case *mode != "rollout" && *mode != "env-step":
			return usagef("--mode %q is not one of rollout, env-step", *mode)
		case sandbox.CheckBackend(*backend) != nil:
			return usagef("--backend %v", sandbox.CheckBackend(*backend))
		case *turns < 1 || *episodes < 1 || *group < 1 || *episodes%*group != 0:
			return usagef("--episodes must be a positive multiple of --group, --turns at least 1")
		case *mode == "env-step" && *backend != sandbox.BackendDocker:
			return usagef("--mode env-step compares with docker exec: use --backend docker")
		case *schedule != "" && *schedule != "groups" && *schedule != "episodes":
			return usagef("--schedule %q is not one of groups, episodes", *schedule)
		case *compare && (*schedule != "" || *mode != "rollout"):
			return usagef("--compare-schedules runs both schedules of a rollout: drop --schedule, use --mode rollout")
		case *baseline != "" && (*url != "" || *compare || *mode != "rollout"):
			return usagef("--baseline-exe starts a service of each build for one rollout: drop --url and --compare-schedules, use --mode rollout")
		}

		policyURL, stopPolicy, err := startFakePolicy(env, *latency, *jitter, *turns-1)
		if err != nil {
			// This binary cannot run it (a test binary): in this process.
			fmt.Fprintf(env.stderr, "rollbox bench: the fake policy runs in this process (%v)\n", err)
			pol, err := fakepolicy.Start(fakepolicy.Config{Latency: *latency, Jitter: *jitter, Responder: fakepolicy.BashThenFinish(*turns - 1)})
			if err != nil {
				return err
			}
			policyURL, stopPolicy = pol.URL(), func() { pol.Close() }
		}
		defer stopPolicy()

		exe := *serveExe
		if exe == "" {
			if exe, err = os.Executable(); err != nil {
				return err
			}
		}
		// startService starts rollbox serve from bin on a data directory of
		// its own (under --data, in a sub-directory name when given).
		startService := func(bin, name string) (*loadgen.Service, func(), error) {
			dir := *keep
			switch {
			case dir == "":
				var err error
				if dir, err = os.MkdirTemp("", "rollbox-bench-"); err != nil {
					return nil, nil, err
				}
			case name != "":
				dir = filepath.Join(dir, name)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return nil, nil, fmt.Errorf("--data: %w", err)
				}
			}
			maxRunning := max(*episodes, 1)
			flags := []string{
				"--max-running", strconv.Itoa(maxRunning), "--max-queued", strconv.Itoa(max(*episodes, 1)),
				"--docker-concurrency", strconv.Itoa(maxRunning), "--policy-concurrency", strconv.Itoa(*policyConc),
				"--warm", strconv.Itoa(*warm), "--log-level", "info", "--cpuprofile", *serveProfile, "--health-addr", "127.0.0.1:0",
			}
			if *profileDir != "" {
				flags = append(flags, "--debug-addr", "127.0.0.1:0")
			}
			svc, err := loadgen.StartService(ctx, bin, dir, flags)
			if err != nil {
				if *keep == "" {
					os.RemoveAll(dir)
				}
				return nil, nil, err
			}
			return svc, func() {
				svc.Stop()
				if *keep == "" {
					os.RemoveAll(dir)
				}
			}, nil
		}
		cfg := loadgen.RolloutConfig{Backend: *backend, Image: *image, Episodes: *episodes, Group: *group, Turns: *turns,
			PolicyURL: policyURL, Latency: *latency, Progress: env.stderr, Schedule: *schedule, Settle: *settle,
			ProfileDir: *profileDir, ProfileAt: *profileAt, TraceFor: *traceFor}
		if *baseline != "" {
			var cmp loadgen.BuildComparison
			for _, b := range []struct{ name, bin string }{{"baseline", *baseline}, {"this build", exe}} {
				svc, stop, serr := startService(b.bin, strings.ReplaceAll(b.name, " ", "-"))
				if serr != nil {
					return fmt.Errorf("%s (%s): %w", b.name, b.bin, serr)
				}
				fmt.Fprintf(env.stderr, "rollbox bench: %s: service %s from %s\n", b.name, svc.URL, b.bin)
				cfg.Service = svc
				if *profileDir != "" {
					cfg.ProfileDir = filepath.Join(*profileDir, strings.ReplaceAll(b.name, " ", "-"))
				}
				r, rerr := loadgen.Rollout(ctx, svc.URL, cfg)
				stop()
				if rerr != nil {
					err = errors.Join(err, fmt.Errorf("%s: %w", b.name, rerr))
				}
				if r != nil {
					cmp.Names, cmp.Runs = append(cmp.Names, b.name+" "+b.bin), append(cmp.Runs, r)
				}
			}
			if *asJSON {
				enc := json.NewEncoder(env.stdout)
				enc.SetIndent("", "  ")
				return errors.Join(err, enc.Encode(&cmp))
			}
			cmp.Report(env.stdout)
			return err
		}

		base := *url
		var svc *loadgen.Service
		if base == "" {
			var stop func()
			if svc, stop, err = startService(exe, ""); err != nil {
				return err
			}
			defer stop()
			base = svc.URL
		}
		fmt.Fprintf(env.stderr, "rollbox bench: service %s, fake policy %s (latency %s)\n", base, policyURL, *latency)

		var res interface{ Report(io.Writer) }
		switch *mode {
		case "rollout":
			cfg.Service = svc
			if *compare {
				var cmp loadgen.ScheduleComparison
				for _, sch := range []string{"episodes", "groups"} {
					cfg.Schedule = sch
					r, rerr := loadgen.Rollout(ctx, base, cfg)
					if rerr != nil {
						err = errors.Join(err, fmt.Errorf("schedule %s: %w", sch, rerr))
					}
					if r != nil {
						cmp.Runs = append(cmp.Runs, r)
					}
				}
				res = &cmp
				break
			}
			var r *loadgen.RolloutResult
			r, err = loadgen.Rollout(ctx, base, cfg)
			if r != nil {
				res = r
			}
		case "env-step":
			var r *loadgen.EnvStepResult
			if r, err = loadgen.EnvStep(ctx, base, *image, *steps); r != nil {
				res = r
			}
		}
		switch {
		case res != nil && *asJSON:
			enc := json.NewEncoder(env.stdout)
			enc.SetIndent("", "  ")
			if jerr := enc.Encode(res); jerr != nil {
				return errors.Join(err, jerr)
			}
		case res != nil:
			res.Report(env.stdout)
		}
		return err
	}
	return cmd
}

// newFakePolicyCmd is the hidden `rollbox fakepolicy`: rollbox bench's fake
// OpenAI-compatible policy in a process of its own, so that neither its CPU
// nor its goroutines are counted against the service or the bench's own
// probes. It prints "fakepolicy listening on URL" and serves until its
// standard input ends.
func newFakePolicyCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{Use: "fakepolicy", Short: "rollbox bench's fake policy server (run by it)", Hidden: true, Args: noArgs}
	latency := cmd.Flags().Duration("latency", 0, "added to every call")
	jitter := cmd.Flags().Duration("jitter", 0, "extra random latency in [0, jitter)")
	bashCalls := cmd.Flags().Int("bash-calls", 0, "bash calls of `true` before finish")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		pol, err := fakepolicy.Start(fakepolicy.Config{Latency: *latency, Jitter: *jitter, Responder: fakepolicy.BashThenFinish(*bashCalls)})
		if err != nil {
			return err
		}
		defer pol.Close()
		fmt.Fprintf(env.stdout, "fakepolicy listening on %s\n", pol.URL())
		io.Copy(io.Discard, env.stdin)
		return nil
	}
	return cmd
}

// startFakePolicy runs `rollbox fakepolicy` as a child process and returns
// its base URL and how to stop it.
func startFakePolicy(env *cliEnv, latency, jitter time.Duration, bashCalls int) (string, func(), error) {
	cmd, in, out, err := startChild(env, "fakepolicy", "--latency", latency.String(), "--jitter", jitter.String(), "--bash-calls", strconv.Itoa(bashCalls))
	if err != nil {
		return "", nil, err
	}
	stop := func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	started := make(chan string, 1)
	go func() {
		defer close(started)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "fakepolicy listening on "); ok {
				started <- u
				io.Copy(io.Discard, out)
				return
			}
		}
	}()
	select {
	case u, ok := <-started:
		if ok {
			return u, stop, nil
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
	}
	stop()
	return "", nil, fmt.Errorf("the fake policy (%s fakepolicy) did not start", cmd.Path)
}

// startChild starts a hidden rollbox command as a child that dies with this
// process, its stderr ours, and returns its stdin and stdout.
func startChild(env *cliEnv, args ...string) (*exec.Cmd, io.WriteCloser, io.ReadCloser, error) {
	cmd, err := env.command(args...)
	if err != nil {
		return nil, nil, nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // and its stdin closes when we go
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, in, out, nil
}
