package taskimport

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/BurntSushi/toml"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/reward"
	"github.com/rollbox/rollbox/agent/reward/testreport"
	"github.com/rollbox/rollbox/sandbox"
)

// Where a Harbor task's tests and verifier logs live in Rollbox's
// sandboxes. Harbor's scripts name /tests and /logs/verifier; the root is
// read-only in a Rollbox container, so the imported image links those to
// /tmp (a tmpfs) and the verifier's fresh sandbox gets the tests there.
const (
	harborRoot     = "/tmp/harbor"
	harborTests    = harborRoot + "/tests"
	harborVerifier = harborRoot + "/logs/verifier"
	// HarborDefaultWorkdir is the workdir when the image sets none.
	HarborDefaultWorkdir = "/app"
	// maxHiddenBytes bounds a task's tests (they travel in the task file).
	maxHiddenBytes = 8 << 20
	// maxDiskMB caps storage_mb: the workdir is a tmpfs held in memory.
	maxDiskMB = 4096
)

// harborLayer is appended to every imported Harbor image: /tests and /logs
// point into /tmp, where the verifier writes the tests and the script its
// reward. An image that already holds either was built with its tests in
// it, which the agent could read: the build fails and says so.
const harborLayer = `
USER root
RUN set -e; for d in /tests /logs; do if [ -e "$d" ] || [ -L "$d" ]; then echo "rollbox: the image already has $d (Harbor's tests and logs must not be in the agent's image)" >&2; exit 1; fi; done; ln -s ` + harborTests + ` /tests; ln -s ` + harborRoot + `/logs /logs
`

// harborConfig is task.toml (Harbor's TaskConfig, schema 1.0 and 1.1).
type harborConfig struct {
	Version       string `toml:"version"`
	SchemaVersion string `toml:"schema_version"`
	Source        string `toml:"source"`
	Task          struct {
		Name        string   `toml:"name"`
		Description string   `toml:"description"`
		Keywords    []string `toml:"keywords"`
		Authors     []any    `toml:"authors"`
	} `toml:"task"`
	Metadata map[string]any `toml:"metadata"`
	Verifier struct {
		TimeoutSec   float64           `toml:"timeout_sec"`
		Env          map[string]string `toml:"env"`
		User         any               `toml:"user"`
		NetworkMode  string            `toml:"network_mode"`
		AllowedHosts []string          `toml:"allowed_hosts"`
	} `toml:"verifier"`
	Agent struct {
		TimeoutSec   float64  `toml:"timeout_sec"`
		User         any      `toml:"user"`
		NetworkMode  string   `toml:"network_mode"`
		AllowedHosts []string `toml:"allowed_hosts"`
	} `toml:"agent"`
	Environment struct {
		BuildTimeoutSec float64           `toml:"build_timeout_sec"`
		DockerImage     string            `toml:"docker_image"`
		CPUs            float64           `toml:"cpus"`
		MemoryMB        int               `toml:"memory_mb"`
		StorageMB       int               `toml:"storage_mb"`
		Memory          string            `toml:"memory"`
		Storage         string            `toml:"storage"`
		GPUs            int               `toml:"gpus"`
		GPUTypes        []string          `toml:"gpu_types"`
		AllowInternet   bool              `toml:"allow_internet"`
		NetworkMode     string            `toml:"network_mode"`
		AllowedHosts    []string          `toml:"allowed_hosts"`
		MCPServers      []any             `toml:"mcp_servers"`
		Env             map[string]string `toml:"env"`
		SkillsDir       string            `toml:"skills_dir"`
		Healthcheck     map[string]any    `toml:"healthcheck"`
	} `toml:"environment"`
	Solution struct {
		Env map[string]string `toml:"env"`
	} `toml:"solution"`
}

// isHarborTask reports whether dir looks like one Harbor task.
func isHarborTask(dir string) bool {
	for _, f := range []string{"task.toml", "instruction.md"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return true
		}
	}
	return false
}

// ImportHarbor imports a Harbor (Terminal-Bench 2) task directory, or a
// directory of them: instruction.md is the prompt; environment/Dockerfile
// (or [environment].docker_image) is built with the local engine, without
// network, into the task's image, and what the image holds in its working
// directory becomes the task's workspace; tests/ (test.sh and what it
// needs) become hidden tests, copied into the verifier's fresh sandbox
// only after the agent finished; the score is the reward file test.sh
// writes (report format harbor); the agent's and the verifier's timeouts
// and the environment's cpus, memory and storage are mapped. What cannot
// be mapped is a Problem of its task.
//
// # Errors
//
// Only when src cannot be read or holds no task; everything about one
// task is in its Result.
func ImportHarbor(ctx context.Context, src string, opts Options) (*Report, error) {
	info, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s is not a directory (a Harbor task directory, or a directory of them)", src)
	}
	rep := &Report{Format: "harbor", Source: src, Out: opts.OutFile}
	var dirs []string
	if isHarborTask(src) {
		dirs = []string{src}
	} else {
		entries, err := os.ReadDir(src)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			p := filepath.Join(src, e.Name())
			if !e.IsDir() {
				continue
			}
			if !isHarborTask(p) {
				r := &Result{Source: p, ID: e.Name()}
				r.errorf("", "not a Harbor task: no task.toml or instruction.md")
				rep.Tasks = append(rep.Tasks, r)
				continue
			}
			dirs = append(dirs, p)
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("%s holds no Harbor task (a directory with task.toml and instruction.md)", src)
	}
	ids := map[string]string{}
	for _, d := range dirs {
		rep.Tasks = append(rep.Tasks, importHarborTask(ctx, d, &opts, ids))
	}
	sort.SliceStable(rep.Tasks, func(i, j int) bool { return rep.Tasks[i].Source < rep.Tasks[j].Source })
	finalize(rep, filepath.Dir(opts.OutFile))
	return rep, nil
}

func importHarborTask(ctx context.Context, dir string, opts *Options, ids map[string]string) *Result {
	r := &Result{Source: dir}
	r.ID = taskID(r, "directory name", filepath.Base(dir))
	if !claimID(r, ids) {
		return r
	}
	t := &agent.Task{ID: r.ID, Sandbox: agent.TaskSandbox{Backend: sandbox.BackendDocker}, Tools: importTools(),
		Metadata: map[string]any{"source": "harbor"}}

	// task.toml
	var cfg harborConfig
	var meta toml.MetaData
	text, err := readTaskFile(dir, "task.toml")
	if err == nil {
		meta, err = toml.Decode(string(text), &cfg)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, yerr := os.Stat(filepath.Join(dir, "task.yaml")); yerr == nil {
			r.errorf("task.yaml", "the Terminal-Bench 1 format is not read: migrate the task to Harbor's (task.toml, instruction.md, environment/, tests/)")
			return r
		}
		r.notef("task.toml", "missing: Harbor's defaults apply")
	case err != nil:
		r.errorf("task.toml", "%v", err)
		return r
	}
	for _, k := range meta.Undecoded() {
		key := k.String()
		if strings.HasPrefix(key, "metadata.") || strings.HasPrefix(key, "task.") {
			continue
		}
		r.warnf("task.toml "+key, "not mapped (this importer does not know it)")
	}
	harborMeta := map[string]any{}
	if cfg.Task.Name != "" {
		harborMeta["name"] = cfg.Task.Name
	}
	if cfg.Task.Description != "" {
		harborMeta["description"] = cfg.Task.Description
	}
	if len(cfg.Task.Keywords) > 0 {
		harborMeta["keywords"] = cfg.Task.Keywords
	}
	if len(cfg.Metadata) > 0 {
		harborMeta["metadata"] = cfg.Metadata
	}
	if len(harborMeta) > 0 {
		t.Metadata["harbor"] = harborMeta
	}

	// instruction.md
	instr, err := readTaskFile(dir, "instruction.md")
	switch {
	case err != nil:
		r.errorf("instruction.md", "%v", err)
	case !utf8.Valid(instr):
		r.errorf("instruction.md", "not UTF-8 text")
	case strings.TrimSpace(string(instr)) == "":
		r.errorf("instruction.md", "empty: the agent would get no instruction")
	default:
		t.Prompt = string(instr)
	}

	harborLimits(r, t, &cfg, meta)
	harborTestsReward(r, t, dir, &cfg, meta)
	if _, err := os.Stat(filepath.Join(dir, "solution")); err == nil {
		r.notef("solution/", "the reference solution is not imported (the agent never sees it; Harbor uploads it for oracle runs only)")
	}
	if r.failed() {
		return r // no image build for a task that cannot be imported
	}
	harborEnvironment(ctx, r, t, dir, &cfg, meta, opts)
	if opts.MaxTurns > 0 {
		t.Limits.MaxTurns = opts.MaxTurns
	}
	r.Task = t
	return r
}

// readTaskFile reads a file of the task directory that must be a regular
// file: a symbolic link (a data set's link to a host file, whose content
// would become the prompt) is refused.
func readTaskFile(dir, name string) ([]byte, error) {
	p := filepath.Join(dir, name)
	info, err := os.Lstat(p)
	if err != nil {
		return os.ReadFile(p) // its error: open ...: no such file
	}
	if !info.Mode().IsRegular() {
		kind := "not a regular file"
		if info.Mode()&fs.ModeSymlink != 0 {
			kind = "a symbolic link"
		}
		return nil, fmt.Errorf("%s: task files are regular files of the task directory", kind)
	}
	return os.ReadFile(p)
}

// harborLimits maps the agent's and the environment's limits and notes
// what Rollbox does differently.
func harborLimits(r *Result, t *agent.Task, cfg *harborConfig, meta toml.MetaData) {
	switch a := cfg.Agent.TimeoutSec; {
	case !meta.IsDefined("agent", "timeout_sec"):
	case a > 0 && !math.IsInf(a, 1):
		t.Limits.EpisodeTimeoutS = a
	default:
		r.errorf("task.toml [agent].timeout_sec", "%v is not a number of seconds above 0", a)
	}
	if v := cfg.Verifier.TimeoutSec; meta.IsDefined("verifier", "timeout_sec") && !(v > 0 && !math.IsInf(v, 1)) {
		r.errorf("task.toml [verifier].timeout_sec", "%v is not a number of seconds above 0", v)
	}
	env := &cfg.Environment
	if meta.IsDefined("environment", "cpus") {
		t.Sandbox.Limits.CPUs = env.CPUs
	}
	memMB := env.MemoryMB
	if env.Memory != "" {
		mb, err := sizeMB(env.Memory)
		if err != nil {
			r.errorf("task.toml [environment].memory", "%v", err)
		}
		memMB = mb
	}
	if meta.IsDefined("environment", "memory_mb") || env.Memory != "" {
		t.Sandbox.Limits.MemoryMB = memMB
	}
	diskMB := env.StorageMB
	if env.Storage != "" {
		mb, err := sizeMB(env.Storage)
		if err != nil {
			r.errorf("task.toml [environment].storage", "%v", err)
		}
		diskMB = mb
	}
	if meta.IsDefined("environment", "storage_mb") || env.Storage != "" {
		if diskMB > maxDiskMB {
			r.notef("task.toml [environment].storage_mb", "%d MB is capped to disk_mb %d: the workdir is a tmpfs held in memory", diskMB, maxDiskMB)
			diskMB = maxDiskMB
		}
		t.Sandbox.Limits.DiskMB = diskMB
	}
	if env.GPUs > 0 {
		r.errorf("task.toml [environment].gpus", "%d GPUs asked for: Rollbox's sandboxes have none", env.GPUs)
	}
	if len(env.MCPServers) > 0 {
		r.errorf("task.toml [environment].mcp_servers", "MCP servers are not supported: the task's tools would be missing")
	}
	if meta.IsDefined("environment", "allow_internet") && env.AllowInternet {
		r.warnf("task.toml [environment].allow_internet", "the sandbox has no network (Rollbox's default, and the only setting for imported tasks)")
	}
	for _, s := range []struct{ field, mode string }{
		{"[environment].network_mode", env.NetworkMode}, {"[agent].network_mode", cfg.Agent.NetworkMode}, {"[verifier].network_mode", cfg.Verifier.NetworkMode},
	} {
		if s.mode != "" && s.mode != "no-network" {
			r.warnf("task.toml "+s.field, "%q: the sandbox has no network", s.mode)
		}
	}
	if len(env.Env) > 0 {
		t.Sandbox.Env = map[string]string{}
		for _, k := range sortedKeys(env.Env) {
			v := env.Env[k]
			if strings.Contains(v, "${") {
				r.warnf("task.toml [environment].env."+k, "resolved from the host at run time in Harbor: not mapped (put the value in the task's sandbox.env)")
				continue
			}
			t.Sandbox.Env[k] = v
		}
	}
	if len(cfg.Verifier.Env) > 0 {
		r.warnf("task.toml [verifier].env", "not mapped (%s): Rollbox's verifier runs with the task's sandbox.env, which the agent sees too",
			strings.Join(sortedKeys(cfg.Verifier.Env), ", "))
	}
	if cfg.Agent.User != nil || cfg.Verifier.User != nil {
		r.notef("task.toml user", "commands run as the unprivileged user 65534 in Rollbox, whatever user Harbor would use")
	}
	if len(env.Healthcheck) > 0 {
		r.warnf("task.toml [environment].healthcheck", "not run: the sandbox has no services to wait for")
	}
	if env.SkillsDir != "" {
		r.warnf("task.toml [environment].skills_dir", "not mapped: the agent's skills are Harbor's agents' feature")
	}
}

// sizeMB reads Harbor's deprecated sizes ("2G", "512M").
func sizeMB(s string) (int, error) {
	s = strings.ToUpper(strings.TrimSpace(s))
	var n float64
	var unit string
	if _, err := fmt.Sscanf(s, "%g%s", &n, &unit); err != nil {
		return 0, fmt.Errorf("%q is not a size like 2G or 512M", s)
	}
	switch unit {
	case "G":
		return int(n * 1024), nil
	case "M":
		return int(n), nil
	case "K":
		return int(n / 1024), nil
	}
	return 0, fmt.Errorf("%q is not a size like 2G or 512M", s)
}

var networkRe = regexp.MustCompile(`\b(apt-get|apt|apk|yum|dnf)\s+(-\S+\s+)*install\b|\b(pip3?|uv\s+pip)\s+install\b|\bcurl\b|\bwget\b|\buvx\b|\bnpm\s+(install|ci)\b|\bgit\s+clone\b`)

// harborTestsReward makes the verifier: tests/ as hidden tests, test.sh run
// in the fresh sandbox, its reward file the score.
func harborTestsReward(r *Result, t *agent.Task, dir string, cfg *harborConfig, meta toml.MetaData) {
	testsDir := filepath.Join(dir, "tests")
	if _, err := os.Stat(filepath.Join(testsDir, "test.sh")); err != nil {
		if _, berr := os.Stat(filepath.Join(testsDir, "test.bat")); berr == nil {
			r.errorf("tests/test.bat", "Windows verifiers are not supported")
		} else {
			r.errorf("tests/test.sh", "missing: Harbor's verifier is tests/test.sh")
		}
		return
	}
	hidden := map[string]string{}
	var total int
	err := filepath.WalkDir(testsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(testsDir, p)
		field := "tests/" + filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			return nil
		case d.Type()&fs.ModeSymlink != 0:
			r.errorf(field, "a symbolic link: hidden tests are files")
			return nil
		case !d.Type().IsRegular():
			r.errorf(field, "not a regular file")
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !utf8.Valid(b) {
			r.errorf(field, "not UTF-8 text: hidden tests travel in the task file as text")
			return nil
		}
		total += len(b)
		hidden[harborTests+"/"+filepath.ToSlash(rel)] = string(b)
		if rel == "test.sh" {
			if m := networkRe.FindAllString(string(b), -1); len(m) > 0 {
				r.warnf(field, "downloads or installs (%s): the verifier's sandbox has no network; bake what it needs into the environment's image", strings.Join(dedupe(m), ", "))
			}
		}
		return nil
	})
	if err != nil {
		r.errorf("tests/", "%v", err)
		return
	}
	if total > maxHiddenBytes {
		r.errorf("tests/", "%d bytes of tests: more than the %d a task carries", total, maxHiddenBytes)
		return
	}
	timeout := cfg.Verifier.TimeoutSec
	if !meta.IsDefined("verifier", "timeout_sec") {
		timeout = 600 // Harbor's default
	}
	t.Reward = reward.Spec{Type: "tests",
		Command:     "mkdir -p " + harborVerifier + " " + harborRoot + "/logs/agent && bash /tests/test.sh",
		TimeoutS:    timeout,
		HiddenTests: hidden,
		Report:      &reward.Report{Format: testreport.Harbor, Path: harborVerifier},
	}
}

// harborEnvironment builds the task's image (Dockerfile or docker_image,
// plus the layer linking /tests and /logs into /tmp) and takes what the
// image holds in its working directory as the task's workspace.
func harborEnvironment(ctx context.Context, r *Result, t *agent.Task, dir string, cfg *harborConfig, meta toml.MetaData, opts *Options) {
	envDir := filepath.Join(dir, "environment")
	for _, f := range []string{"docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml"} {
		if _, err := os.Stat(filepath.Join(envDir, f)); err == nil {
			r.errorf("environment/"+f, "multi-container environments (Docker Compose) are not supported")
			return
		}
	}
	dockerfile, derr := os.ReadFile(filepath.Join(envDir, "Dockerfile"))
	image := cfg.Environment.DockerImage
	var text, contextDir string
	switch {
	case image != "":
		if derr == nil {
			r.notef("environment/Dockerfile", "not built: [environment].docker_image %s is the environment (as in Harbor)", image)
		}
		text = "FROM " + image + "\n"
	case derr == nil:
		text, contextDir = string(dockerfile), envDir
		if _, err := os.Stat(filepath.Join(envDir, ".dockerignore")); err == nil {
			r.warnf("environment/.dockerignore", "not applied: the whole environment/ directory is the build context")
		}
	default:
		r.errorf("environment/Dockerfile", "no environment: neither environment/Dockerfile nor [environment].docker_image")
		return
	}
	if opts.Images == nil {
		why := "no Docker engine"
		if opts.NoImages != nil {
			why = opts.NoImages.Error()
		}
		r.errorf("environment", "needs an image built with a Docker engine: %s", why)
		return
	}
	// The base images must be local: the engine would pull a missing one
	// (the daemon's network, not the build's) where it has a network.
	bases, unresolved := baseImages(text)
	for _, b := range bases {
		if _, err := opts.Images.Inspect(ctx, "docker:"+b); err != nil {
			if errors.Is(err, sandbox.ErrImageNotFound) {
				r.errorf("environment", "the base image %s is not in the local engine, and nothing is pulled (images here come from `docker import`, e.g. rollbox/python: `rollbox images build python`)", b)
			} else {
				r.errorf("environment", "the base image %s: %v", b, err)
			}
		}
	}
	for _, b := range unresolved {
		r.warnf("environment/Dockerfile", "FROM %s: not checked before the build (an ARG names it); the engine pulls it if it is not local and has a network", b)
	}
	if r.failed() {
		return
	}
	text += harborLayer
	tag, err := contentTag(r.ID, text, contextDir)
	if err != nil {
		r.errorf("environment/", "%v", err)
		return
	}
	img, err := opts.Images.Inspect(ctx, "docker:"+tag)
	if err != nil {
		if !errors.Is(err, sandbox.ErrImageNotFound) {
			r.errorf("environment", "%v", err)
			return
		}
		timeout := 10 * time.Minute
		if cfg.Environment.BuildTimeoutSec > 0 {
			timeout = time.Duration(cfg.Environment.BuildTimeoutSec * float64(time.Second))
		}
		img, err = opts.Images.Build(ctx, Build{ContextDir: contextDir, Dockerfile: text, Tag: tag, Timeout: timeout,
			Labels: map[string]string{"rollbox.import": "harbor", "rollbox.import.task": r.ID}}, opts.progress())
		if err != nil {
			msg := err.Error()
			if strings.Contains(msg, "pull access denied") || strings.Contains(msg, "manifest unknown") ||
				strings.Contains(msg, "no such host") || strings.Contains(msg, "not found") && strings.Contains(msg, "repository") {
				msg += " (the base image must be in the local engine: images here come from `docker import`, e.g. `rollbox images build base python`)"
			}
			r.errorf("environment", "the image could not be built without network: %s", msg)
			return
		}
	} else {
		r.notef("environment", "image %s was built by an earlier import of the same environment", tag)
	}
	r.Image = img.Ref
	t.Sandbox.Image = img.Ref
	workdir := img.WorkingDir
	if workdir == "" || workdir == "/" {
		workdir = HarborDefaultWorkdir
		r.notef("environment", "the image sets no WORKDIR: the agent works in %s", workdir)
	}
	switch {
	case workdir == harborRoot || strings.HasPrefix(harborRoot, workdir+"/"):
		r.errorf("environment", "the image's WORKDIR %s holds %s, where the verifier puts the hidden tests and the reward file: the agent's files there would be copied beside them (use another WORKDIR, e.g. /app)", workdir, harborRoot)
		return
	case strings.HasPrefix(workdir, harborRoot+"/"):
		r.errorf("environment", "the image's WORKDIR %s is in %s, where the verifier puts the hidden tests and the reward file (use another WORKDIR, e.g. /app)", workdir, harborRoot)
		return
	}
	t.Sandbox.Workdir = workdir
	absWS, relWS := opts.workspaceDir()
	tarPath := filepath.Join(absWS, r.ID+".tar")
	err = writeTarAtomic(tarPath, func(w io.Writer) error { return opts.Images.CopyDir(ctx, img.Ref, workdir, w) })
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return // nothing in the workdir
	case err != nil:
		r.errorf("environment", "copying the image's %s: %v", workdir, err)
		return
	}
	files, size, err := tarStats(tarPath)
	if err != nil {
		r.errorf("environment", "reading %s: %v", tarPath, err)
		return
	}
	if files == 0 {
		os.Remove(tarPath)
		return
	}
	t.Workspace = &agent.Workspace{From: filepath.ToSlash(filepath.Join(relWS, r.ID+".tar")), To: workdir}
	r.Workspace = t.Workspace.From
	r.notef("environment", "the image's %s (%d files, %d bytes) is the task's workspace: Rollbox's workdir is a fresh tmpfs, seeded from it", workdir, files, size)
}

// baseImages lists the images a Dockerfile's FROM lines name: not its own
// stages, not scratch; those an ARG names are unresolved.
func baseImages(dockerfile string) (images, unresolved []string) {
	stages := map[string]bool{}
	for _, line := range strings.Split(dockerfile, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.EqualFold(f[0], "FROM") {
			continue
		}
		f = f[1:]
		for len(f) > 0 && strings.HasPrefix(f[0], "--") {
			f = f[1:]
		}
		if len(f) == 0 {
			continue
		}
		img := f[0]
		switch {
		case stages[strings.ToLower(img)], strings.EqualFold(img, "scratch"):
		case strings.Contains(img, "$"):
			unresolved = append(unresolved, img)
		default:
			images = append(images, img)
		}
		if len(f) >= 3 && strings.EqualFold(f[1], "AS") {
			stages[strings.ToLower(f[2])] = true
		}
	}
	return images, unresolved
}

// contentTag names an image by its task and the content it is built from.
func contentTag(id, dockerfile, contextDir string) (string, error) {
	h := sha256.New()
	io.WriteString(h, "rollbox-import v1\x00") // how the image is built
	io.WriteString(h, dockerfile)
	if contextDir != "" {
		err := filepath.WalkDir(contextDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(contextDir, p)
			info, err := d.Info()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "\x00%s\x00%o\x00", filepath.ToSlash(rel), info.Mode())
			switch {
			case d.Type()&fs.ModeSymlink != 0:
				l, _ := os.Readlink(p)
				io.WriteString(h, l)
			case d.Type().IsRegular():
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				defer f.Close()
				if _, err := io.Copy(h, f); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	sum := hex.EncodeToString(h.Sum(nil))
	return "rollbox-import/" + repoComponent(id) + ":" + sum[:12], nil
}

// repoComponent makes a task id a Docker repository path component:
// lower-case letters and digits separated by single dashes.
func repoComponent(id string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(id) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(c)
			dash = false
		} else {
			dash = true
		}
	}
	if b.Len() == 0 {
		return "task"
	}
	return b.String()
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func dedupe(list []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range list {
		s = strings.Join(strings.Fields(s), " ")
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
