package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/docker/docker/client"
	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/agent/taskimport"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// newTasksCmd is `rollbox tasks import`.
func newTasksCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tasks",
		Short: "Import tasks from other benchmarks' formats",
		Long: `Turn the task formats data sets come in into a Rollbox task file: Harbor
(Terminal-Bench 2) task directories and SWE-bench-style instances.`,
		RunE: groupRunE,
	}
	imp := &cobra.Command{
		Use:   "import --format harbor|swebench SRC --out FILE.jsonl",
		Short: "Import Harbor task directories or SWE-bench instances into a task file",
		Long: `Import tasks into a Rollbox task file (JSONL), with a report of every task:
what was mapped, what was changed, and what could not be mapped (an error keeps
the task out of the file; nothing is dropped silently).

--format harbor SRC: a Harbor task directory, or a directory of them.
  instruction.md is the prompt; environment/Dockerfile (or [environment].docker_image)
  is built with the local Docker engine without network (its base image must be
  local) and what the image holds in its WORKDIR becomes the task's workspace;
  tests/ (test.sh and what it needs) are hidden tests, copied into the verifier's
  fresh sandbox only after the agent finished; the score is the reward file
  test.sh writes (/logs/verifier/reward.txt or reward.json); the agent's and the
  verifier's timeouts, cpus, memory and storage are mapped.

--format swebench SRC.jsonl: SWE-bench-style instances (instance_id, repo,
  base_commit, problem_statement, test_patch, FAIL_TO_PASS, PASS_TO_PASS). --repos
  DIR holds DIR/<instance_id>/ (the workspace as it stands) or a git repository
  DIR/<owner>__<name> the base commit is taken from. The test patch's files are
  hidden tests, added only for verification; the reward is pytest's report of
  FAIL_TO_PASS + PASS_TO_PASS (--score all: resolved or not; fraction: the pass
  rate).

Workspaces are written beside FILE in FILE's name + .workspaces/, and the tasks
name them relative to FILE. Exit status: 0 when every task was imported, 1 when
some were not (the file holds the others; the report says why), 2 for bad input.`,
		Example: `  rollbox tasks import --format harbor ./terminal-bench-tasks --out tb.jsonl
  rollbox tasks import --format swebench instances.jsonl --repos ./repos --out swe.jsonl --score fraction`,
		Args: cobra.ExactArgs(1),
	}
	fs := imp.Flags()
	fs.SortFlags = false
	format := fs.String("format", "", "harbor or swebench")
	out := fs.String("out", "", "the task `FILE` (JSONL) to write")
	force := fs.Bool("force", false, "replace FILE if it exists")
	reportFile := fs.String("report", "", "also write the report as JSON to this `FILE`")
	maxTurns := fs.Int("max-turns", 0, "every task's limits.max_turns (default: Rollbox's)")
	repos := fs.String("repos", "", "swebench: the `DIR` of repositories (DIR/<instance_id>/ or a git repository DIR/<owner>__<name>)")
	image := fs.String("image", "python", "swebench: the sandbox image of instances that name none (a recipe or docker:NAME:TAG)")
	workdir := fs.String("workdir", "/testbed", "swebench: where the repository is in the sandbox")
	score := fs.String("score", "all", "swebench: all (every FAIL_TO_PASS and PASS_TO_PASS test passes) or fraction (the pass rate)")
	testTimeout := fs.Duration("test-timeout", 10*time.Minute, "swebench: bound on the verifier's test run")
	hints := fs.Bool("hints", false, "swebench: add the instance's hints_text to the prompt")
	imp.RunE = func(cmd *cobra.Command, args []string) error {
		src := args[0]
		switch {
		case *format != "harbor" && *format != "swebench":
			return usagef("--format %q is not one of harbor, swebench", *format)
		case *out == "":
			return usagef("--out FILE.jsonl is required")
		case *format == "harbor" && flagChanged(fs, "repos"):
			return usagef("--repos is for --format swebench")
		case *score != "all" && *score != "fraction":
			return usagef("--score %q is not one of all, fraction", *score)
		case *maxTurns < 0:
			return usagef("--max-turns %d is negative", *maxTurns)
		}
		if _, err := os.Stat(src); err != nil {
			return usagef("%v", err)
		}
		if _, err := os.Stat(*out); err == nil && !*force {
			return usagef("%s exists: choose another --out, or --force to replace it", *out)
		}
		if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
			return err
		}
		ctx := cmd.Context()
		opts := taskimport.Options{OutFile: *out, Progress: env.stderr, MaxTurns: *maxTurns}
		images, closeImages, err := openImageEngine(ctx)
		if err != nil {
			opts.NoImages = err
		} else {
			defer closeImages()
			opts.Images = images
		}
		var rep *taskimport.Report
		switch *format {
		case "harbor":
			rep, err = taskimport.ImportHarbor(ctx, src, opts)
		case "swebench":
			rep, err = taskimport.ImportSWEBench(ctx, src, opts, taskimport.SWEBenchOptions{Repos: *repos, Image: *image,
				Workdir: *workdir, Score: *score, TestTimeoutS: testTimeout.Seconds(), Hints: *hints})
		}
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			return usagef("%v", err)
		}
		if err := taskimport.WriteTasks(*out, rep); err != nil {
			return err
		}
		rep.WriteText(env.stdout)
		if *reportFile != "" {
			b, _ := json.MarshalIndent(rep, "", "  ")
			if err := os.WriteFile(*reportFile, append(b, '\n'), 0o644); err != nil {
				return err
			}
		}
		if rep.Skipped > 0 {
			return &exitError{code: exitFailure}
		}
		return nil
	}
	cmd.AddCommand(imp)
	return cmd
}

// openImageEngine connects to the local Docker engine for the importers.
func openImageEngine(ctx context.Context) (taskimport.ImageBuilder, func(), error) {
	cli, err := docker.NewClient()
	if err != nil {
		return nil, nil, err
	}
	if err := docker.Ping(ctx, cli); err != nil {
		cli.Close()
		return nil, nil, err
	}
	return engineImages{cli}, func() { cli.Close() }, nil
}

// engineImages is taskimport.ImageBuilder on the local engine.
type engineImages struct{ cli *client.Client }

func (e engineImages) Build(ctx context.Context, b taskimport.Build, progress io.Writer) (taskimport.Image, error) {
	if b.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.Timeout)
		defer cancel()
	}
	info, err := docker.BuildDockerfile(ctx, e.cli, docker.DockerfileBuild{ContextDir: b.ContextDir, Dockerfile: b.Dockerfile,
		Tag: b.Tag, Labels: b.Labels, Progress: progress})
	if err != nil {
		return taskimport.Image{}, err
	}
	return taskimport.Image{Ref: "docker:" + b.Tag, ID: info.ID, WorkingDir: info.WorkingDir}, nil
}

func (e engineImages) Inspect(ctx context.Context, ref string) (taskimport.Image, error) {
	name, err := docker.ResolveImage(ref)
	if err != nil {
		return taskimport.Image{}, err
	}
	info, err := docker.InspectImage(ctx, e.cli, name)
	if err != nil {
		return taskimport.Image{}, err
	}
	return taskimport.Image{Ref: ref, ID: info.ID, WorkingDir: info.WorkingDir}, nil
}

func (e engineImages) CopyDir(ctx context.Context, ref, dir string, w io.Writer) error {
	name, err := docker.ResolveImage(ref)
	if err != nil {
		return err
	}
	return docker.CopyImageDir(ctx, e.cli, name, dir, w)
}
