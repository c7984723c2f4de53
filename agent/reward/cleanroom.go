package reward

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rollbox/rollbox/agent/reward/testreport"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// specsOf lists the tests rewards of s (itself or its parts).
func specsOf(s Spec) []Spec {
	if s.Type == "tests" {
		return []Spec{s}
	}
	if s.Perf != nil {
		return specsOf(*s.Perf)
	}
	var out []Spec
	for _, p := range s.Parts {
		out = append(out, specsOf(p.Reward)...)
	}
	return out
}

// selection is how one tests reward decides which of the agent's paths it
// takes: a path the agent may change is taken from the agent.
type selection struct {
	workdir  string
	protect  matcher
	deny     matcher
	editable matcher
	// fixed are paths only the task decides: hidden tests and the report.
	fixed map[string]bool
}

func newSelection(s Spec, workdir string) selection {
	protect := s.Protect
	if len(protect) == 0 {
		protect = DefaultProtect
	}
	deny := s.Deny
	if deny == nil {
		deny = DefaultDeny
	}
	sel := selection{workdir: workdir,
		protect:  matcher{workdir: workdir, globs: protect, baseNames: true},
		deny:     matcher{workdir: workdir, globs: deny, baseNames: true},
		editable: matcher{workdir: workdir, globs: s.Editable},
		fixed:    map[string]bool{},
	}
	for p := range s.HiddenTests {
		sel.fixed[p] = true
	}
	for _, p := range reportPaths(s) {
		sel.fixed[p] = true
	}
	return sel
}

// why says why p is not taken from the agent ("" when it is).
func (sel selection) why(p string) string {
	switch {
	case sel.fixed[p]:
		return "a hidden test or the runner's report: the task's alone"
	case len(sel.editable.globs) > 0:
		if sel.editable.covers(p) {
			return ""
		}
		return "not named by reward.editable"
	case sel.protect.covers(p):
		return "a protected test: the verifier uses the task's version"
	case sel.deny.covers(p):
		return "runner configuration: the verifier uses the task's version"
	}
	return ""
}

// kind classifies a path this selection does not take from the agent
// (trajectory.Skip kinds): a change to the task's tests, runner
// configuration changed or planted, a file where a hidden test goes, a new
// test of the agent's own, a cache, or a file outside reward.editable.
func (sel selection) kind(p string, fromTask bool) string {
	switch {
	case sel.fixed[p]:
		return trajectory.SkipHidden
	case isCache(p):
		return trajectory.SkipOther
	case sel.deny.covers(p):
		return trajectory.SkipRunnerConfig
	case sel.protect.covers(p) && fromTask:
		return trajectory.SkipProtected
	case sel.protect.covers(p):
		return trajectory.SkipNewTest
	case len(sel.editable.globs) > 0:
		return trajectory.SkipNotEditable
	}
	return trajectory.SkipOther
}

// caches are what runners and tools write on their own: never rigging.
var caches = []string{"__pycache__", ".pytest_cache", ".cache", ".git", ".mypy_cache", ".ruff_cache", "node_modules"}

func isCache(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if slices.Contains(caches, c) {
			return true
		}
	}
	ext := path.Ext(p)
	return ext == ".pyc" || ext == ".pyo"
}

// want is the walk's filter: may p (or something below the directory p)
// be taken from the agent?
func (sel selection) want(p string, dir bool) bool {
	if !dir {
		return sel.why(p) == ""
	}
	if len(sel.editable.globs) > 0 {
		return sel.editable.covers(p) || sel.editable.mayMatchBelow(p)
	}
	return !sel.protect.covers(p) && !sel.deny.covers(p)
}

// plan is what one verification writes into its fresh sandbox.
type plan struct {
	// taken are the paths whose agent version is copied.
	taken   map[string]bool
	task    []sandbox.File // the task's files, less those the agent deleted
	hidden  []sandbox.File
	agent   []sandbox.File
	deleted []string
	skipped []trajectory.Skip
}

// planFor applies a tests reward's selection to the snapshot.
func planFor(s Spec, in Input, snap *snapshot) *plan {
	sel := newSelection(s, in.Workdir)
	pl := &plan{taken: map[string]bool{}}
	taskDirs := map[string]bool{}
	fixedFiles := map[string]bool{}
	for p := range in.TaskFiles {
		fixedFiles[p] = true
	}
	for p, c := range s.HiddenTests {
		pl.hidden = append(pl.hidden, sandbox.File{Path: p, Data: []byte(c), Mode: 0o644})
		fixedFiles[p] = true
	}
	for _, p := range reportPaths(s) {
		fixedFiles[p] = true
	}
	for p := range fixedFiles {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			taskDirs[d] = true
		}
	}
	for _, p := range sortedPaths(in.TaskFiles) {
		if under(p, in.Workdir) && sel.why(p) == "" {
			switch pr := snap.presence(p); pr {
			case "absent":
				pl.deleted = append(pl.deleted, p)
				continue
			case "file", "unknown":
			default:
				pl.skipped = append(pl.skipped, trajectory.Skip{Path: p, Kind: trajectory.SkipOther, Reason: pr + " in the agent's workspace: the task's version is used"})
			}
		} else if under(p, in.Workdir) {
			switch pr := snap.presence(p); pr {
			case "file", "unknown":
			case "absent":
				pl.skipped = append(pl.skipped, trajectory.Skip{Path: p, Kind: sel.kind(p, true), Reason: "deleted by the agent: " + sel.why(p)})
			default:
				pl.skipped = append(pl.skipped, trajectory.Skip{Path: p, Kind: sel.kind(p, true), Reason: pr + " in the agent's workspace: " + sel.why(p)})
			}
		}
		if _, hidden := s.HiddenTests[p]; hidden {
			continue // the hidden version replaces the visible one
		}
		pl.task = append(pl.task, sandbox.File{Path: p, Data: in.TaskFiles[p], Mode: 0o644})
	}
	for _, p := range snap.sortedFiles() {
		if why := sel.why(p); why != "" {
			_, fromTask := in.TaskFiles[p]
			pl.skipped = append(pl.skipped, trajectory.Skip{Path: p, Kind: sel.kind(p, fromTask), Reason: why})
			continue
		}
		if taskDirs[p] {
			pl.skipped = append(pl.skipped, trajectory.Skip{Path: p, Kind: trajectory.SkipOther, Reason: "a file where the task has a directory: not copied"})
			continue
		}
		conflict := ""
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if fixedFiles[d] {
				conflict = d
				break
			}
		}
		if conflict != "" {
			pl.skipped = append(pl.skipped, trajectory.Skip{Path: p, Kind: trajectory.SkipOther, Reason: "under " + conflict + ", a file of the task: not copied"})
			continue
		}
		f := snap.files[p]
		mode := fs.FileMode(0o644)
		if f.mode&0o111 != 0 {
			mode = 0o755
		}
		pl.agent = append(pl.agent, sandbox.File{Path: p, Data: f.data, Mode: mode})
		pl.taken[p] = true
	}
	pl.agent, pl.skipped = dropTaskShadows(pl.agent, pl.skipped, in.TaskFiles, s.HiddenTests, sel)
	return pl
}

// modulesOf maps the top-level Python module names the files would be
// imported as (a module outside a package, or a package whose parent is
// none) to the files that make them.
func modulesOf(paths []string) map[string][]string {
	isPkg := map[string]bool{}
	for _, p := range paths {
		if b := path.Base(p); b == "__init__.py" || b == "__init__.pyc" {
			isPkg[path.Dir(p)] = true
		}
	}
	out := map[string][]string{}
	for _, p := range paths {
		dir, base := path.Dir(p), path.Base(p)
		if base == "__init__.py" || base == "__init__.pyc" {
			if !isPkg[path.Dir(dir)] {
				out[path.Base(dir)] = append(out[path.Base(dir)], p)
			}
			continue
		}
		if m := moduleRe.FindStringSubmatch(base); m != nil && !isPkg[dir] {
			out[m[1]] = append(out[m[1]], p)
		}
	}
	return out
}

// dropTaskShadows leaves out the agent's new modules named like one of the
// task's that the agent may not change (a test helper under tests/, a
// hidden test's module) but elsewhere: depending on sys.path's order,
// either could be the one imported.
func dropTaskShadows(agent []sandbox.File, skipped []trajectory.Skip, task map[string][]byte, hidden map[string]string, sel selection) ([]sandbox.File, []trajectory.Skip) {
	var fixed []string
	for p := range task {
		if sel.why(p) != "" {
			fixed = append(fixed, p)
		}
	}
	for p := range hidden {
		fixed = append(fixed, p)
	}
	taskMods := modulesOf(fixed)
	if len(taskMods) == 0 {
		return agent, skipped
	}
	var all []string
	for p := range task {
		all = append(all, p)
	}
	for _, f := range agent {
		all = append(all, f.Path)
	}
	agentOf := map[string]string{}
	for name, files := range modulesOf(all) {
		if _, ok := taskMods[name]; !ok {
			continue
		}
		for _, p := range files {
			if _, fromTask := task[p]; !fromTask {
				agentOf[p] = name
			}
		}
	}
	var keep []sandbox.File
	for _, f := range agent {
		if name, ok := agentOf[f.Path]; ok {
			skipped = append(skipped, trajectory.Skip{Path: f.Path, Kind: trajectory.SkipShadow, Reason: fmt.Sprintf("would be imported as %q, the name of the task's %s: not copied", name, taskMods[name][0])})
			continue
		}
		keep = append(keep, f)
	}
	return keep, skipped
}

func under(p, dir string) bool { return strings.HasPrefix(p, dir+"/") }

func sortedPaths(m map[string][]byte) []string {
	out := make([]string, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// errRetry marks a failure of the verifier's own sandbox that may pass on
// a fresh one.
type errRetry struct{ err error }

func (e errRetry) Error() string { return e.err.Error() }
func (e errRetry) Unwrap() error { return e.err }

// pytestRe finds a pytest invocation in a shell line.
var pytestRe = regexp.MustCompile(`(^|[\s/;&|(])(py\.test|pytest)(\s|$|[;&|)])`)

// reportPaths are the files the runner's report is read from: the task's
// alone, never taken from the agent.
func reportPaths(s Spec) []string {
	switch {
	case s.Report == nil || s.Report.Path == "":
		return nil
	case s.Report.Format == testreport.Harbor:
		return []string{path.Join(s.Report.Path, testreport.HarborRewardJSON), path.Join(s.Report.Path, testreport.HarborRewardText)}
	}
	return []string{s.Report.Path}
}

// runsPytest reports whether the verifier runs pytest for s.
func runsPytest(s Spec) bool {
	return (s.Report != nil && s.Report.Format == testreport.Pytest) || pytestRe.MatchString(s.Command)
}

// pytestConfigs are the files pytest reads its configuration from, in the
// order it prefers them within a directory, with the section that makes a
// file count.
var pytestConfigs = []struct{ name, section string }{
	{"pytest.ini", ""}, {".pytest.ini", ""}, {"pyproject.toml", "[tool.pytest.ini_options]"},
	{"tox.ini", "[pytest]"}, {"setup.cfg", "[tool:pytest]"},
}

// pytestConfig finds the task's own pytest configuration: the shallowest
// directory holding one, and the file there pytest would read first. ok is
// false when the task has none.
func pytestConfig(task map[string][]byte, workdir string) (file string, ok bool) {
	best := -1
	for p, c := range task {
		if !under(p, workdir) {
			continue
		}
		for rank, pc := range pytestConfigs {
			if path.Base(p) != pc.name || (pc.section != "" && !strings.Contains(string(c), pc.section)) {
				continue
			}
			score := strings.Count(p, "/")*len(pytestConfigs) + rank
			if best < 0 || score < best || (score == best && p < file) {
				best, file = score, p
			}
		}
	}
	return file, best >= 0
}

// pytestIsolation is what the verifier adds to a pytest run: its
// configuration given explicitly (the task's file, so no other file is
// discovered; an empty one when the task has none), no cache, the test
// directories appended to sys.path rather than put before the standard
// library, and the JUnit report when the verifier reads it. Files it
// needs are returned to be written into the sandbox.
func pytestIsolation(s Spec, in Input, vdir string, taken func(string) bool, junit string) ([]string, []sandbox.File) {
	var files []sandbox.File
	cfg, ok := pytestConfig(in.TaskFiles, in.Workdir)
	rootdir := in.Workdir
	switch {
	case !ok:
		cfg = vdir + "/pytest.ini"
		files = append(files, sandbox.File{Path: cfg, Data: []byte("[pytest]\n"), Mode: 0o644})
	case taken(cfg):
		// reward.editable lets the agent change the file: pytest reads the
		// task's copy beside it (relative paths in it stay right).
		rootdir = path.Dir(cfg)
		dup := path.Join(rootdir, ".rollbox-verifier-"+path.Base(vdir)+path.Ext(cfg))
		if path.Ext(cfg) == "" || path.Base(cfg) == "pytest.ini" || path.Base(cfg) == ".pytest.ini" || path.Base(cfg) == "tox.ini" {
			dup = path.Join(rootdir, ".rollbox-verifier-"+path.Base(vdir)+".ini")
		}
		files = append(files, sandbox.File{Path: dup, Data: in.TaskFiles[cfg], Mode: 0o644})
		cfg = dup
	default:
		rootdir = path.Dir(cfg)
	}
	opts := []string{"-p", "no:cacheprovider", "--import-mode=append", "-c", cfg, "--rootdir=" + rootdir}
	if junit != "" {
		opts = append(opts, "--junitxml="+junit, "-o", "junit_family=xunit1")
	}
	return opts, files
}

// run is one verification in one fresh sandbox.
type run struct {
	res     sandbox.Result
	report  *testreport.Report
	repErr  error
	skipped []trajectory.Skip
	blame   string
	copied  []string
}

// prepared is a verifier sandbox made ahead, while the agent's files are
// read out (the agent's sandbox is closed before anything runs in it).
type prepared struct {
	sb       sandbox.Sandbox
	err      error
	attempts int
}

// prepare starts making a verifier sandbox; the channel yields it once.
func prepare(ctx context.Context, in Input) <-chan prepared {
	ch := make(chan prepared, 1)
	go func() {
		var p prepared
		p.sb, p.err = newVerifierSandbox(ctx, in, &p.attempts)
		ch <- p
	}()
	return ch
}

// newVerifierSandbox makes the fresh sandbox, trying twice: a sandbox that
// cannot be made is the infrastructure's failure.
func newVerifierSandbox(ctx context.Context, in Input, attempts *int) (sandbox.Sandbox, error) {
	var err error
	for try := 0; try < 2; try++ {
		if try > 0 {
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		*attempts++
		var sb sandbox.Sandbox
		if sb, err = in.NewSandbox(ctx); err == nil {
			return sb, nil
		}
	}
	return nil, fmt.Errorf("the verifier's fresh sandbox did not start (tried twice): %w", err)
}

// runOnce makes a fresh sandbox, writes the plan into it and runs the
// command. withAgent false is the control run (the task's files alone).
// An errRetry is the verifier sandbox failing; other errors are final.
func runOnce(ctx context.Context, s Spec, in Input, pl *plan, withAgent bool, attempts *int, made *prepared) (*run, error) {
	var sb sandbox.Sandbox
	var err error
	if made != nil {
		sb, err = made.sb, made.err
		*attempts += made.attempts
	} else {
		sb, err = newVerifierSandbox(ctx, in, attempts)
	}
	if err != nil {
		return nil, err
	}
	defer sb.Close()
	r := &run{}
	var rnd [6]byte
	rand.Read(rnd[:])
	vdir := "/tmp/rollbox-verifier-" + hex.EncodeToString(rnd[:])
	files := append(append([]sandbox.File{}, pl.task...), pl.hidden...)
	env := map[string]string{"PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}
	reportPath := ""
	if s.Report != nil {
		reportPath = s.Report.Path
	}
	pytest := runsPytest(s)
	if pytest {
		if s.Report == nil || s.Report.Format == testreport.Pytest {
			reportPath = vdir + "/report.xml"
		}
		taken := func(p string) bool { return withAgent && pl.taken[p] }
		junit := ""
		if s.Report == nil || s.Report.Format == testreport.Pytest {
			junit = reportPath
		}
		opts, more := pytestIsolation(s, in, vdir, taken, junit)
		files = append(files, more...)
		if prev := strings.TrimSpace(in.Env["PYTEST_ADDOPTS"]); prev != "" {
			opts = append([]string{prev}, opts...)
		}
		env["PYTEST_ADDOPTS"] = strings.Join(opts, " ")
		env["PYTHONSAFEPATH"] = "1"
	}
	if err := sandbox.Seed(ctx, sb, files); err != nil {
		return nil, errRetry{fmt.Errorf("seed the task's files into the verifier's sandbox: %w", err)}
	}
	if withAgent {
		agentFiles := pl.agent
		if in.Backend != sandbox.BackendWASM {
			var skipped []trajectory.Skip
			agentFiles, skipped, err = dropShadows(ctx, sb, agentFiles, pl.task)
			if err != nil {
				return nil, errRetry{err}
			}
			r.skipped = append(r.skipped, skipped...)
		}
		for _, f := range agentFiles {
			err := sb.WriteFile(ctx, f.Path, f.Data, f.Mode)
			switch {
			case err == nil:
				r.copied = append(r.copied, f.Path)
			case errors.Is(err, sandbox.ErrTooLarge):
				r.blame = fmt.Sprintf("the agent's files do not fit the verifier's sandbox (writing %s: %v)", f.Path, err)
				return r, nil
			case failed(ctx, err):
				return nil, errRetry{fmt.Errorf("copy %s into the verifier's sandbox: %w", f.Path, err)}
			default:
				r.skipped = append(r.skipped, trajectory.Skip{Path: f.Path, Kind: trajectory.SkipOther, Reason: "could not be written into the verifier's sandbox: " + err.Error()})
			}
		}
	}
	timeout := time.Duration(s.TimeoutS * float64(time.Second))
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	outCap := in.VerifierOutputCap
	stdoutReport := s.Report != nil && s.Report.Path == "" && (s.Report.Format == testreport.GoTestJSON || s.Report.Format == testreport.TAP)
	if stdoutReport {
		outCap = maxReportBytes
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: s.Command, Timeout: timeout, OutputCap: outCap, Env: env})
	if err != nil {
		if sandbox.IsAbuse(err) || ctx.Err() != nil {
			return nil, err
		}
		return nil, errRetry{fmt.Errorf("the verifier's command: %w", err)}
	}
	r.res = res
	switch {
	case s.Report != nil && s.Report.Format == testreport.Harbor:
		// reward.json first, reward.txt when it is missing or has no reward.
		var files [2][]byte
		for i, name := range []string{testreport.HarborRewardJSON, testreport.HarborRewardText} {
			p := path.Join(s.Report.Path, name)
			data, err := sb.ReadFile(ctx, p, maxReportBytes)
			switch {
			case err == nil:
				files[i] = data
			case failed(ctx, err):
				if sandbox.IsAbuse(err) {
					return nil, err
				}
				return nil, errRetry{fmt.Errorf("read the runner's report %s: %w", p, err)}
			}
		}
		if files[0] == nil && files[1] == nil {
			r.repErr = fmt.Errorf("the test script wrote neither %s nor %s in %s (it exited early or never ran)",
				testreport.HarborRewardJSON, testreport.HarborRewardText, s.Report.Path)
			break
		}
		r.report, r.repErr = testreport.ParseHarbor(files[0], files[1])
	case stdoutReport:
		if res.StdoutDropped > 0 {
			r.repErr = fmt.Errorf("the report on stdout is over %d bytes", maxReportBytes)
		} else {
			r.report, r.repErr = testreport.Parse(s.Report.Format, res.Stdout)
		}
	case reportPath != "":
		format := testreport.Pytest
		if s.Report != nil {
			format = s.Report.Format
		}
		data, err := sb.ReadFile(ctx, reportPath, maxReportBytes)
		switch {
		case err == nil:
			r.report, r.repErr = testreport.Parse(format, data)
		case failed(ctx, err):
			if sandbox.IsAbuse(err) {
				return nil, err
			}
			return nil, errRetry{fmt.Errorf("read the runner's report %s: %w", reportPath, err)}
		default:
			r.repErr = fmt.Errorf("the runner wrote no report at %s (it exited early or never ran): %v", reportPath, err)
		}
	}
	return r, nil
}

// maxReportBytes caps a runner's report.
const maxReportBytes = 16 << 20

// moduleRe finds the module name a file would be imported as.
var moduleRe = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)(\.[A-Za-z0-9_-]+)*\.(py|pyc|pyw|so|pyd)$`)

// dropShadows leaves out the agent's new Python modules (and packages)
// that would be imported in place of a module the verifier's Python
// already has (the standard library, installed packages, the runner
// itself): pytest.py, a _pytest/ package, unittest.py. A module inside a
// package (a directory with __init__.py) cannot shadow a top-level one and
// is kept. The check runs in the fresh sandbox before any agent file is
// there, in isolated mode from /.
func dropShadows(ctx context.Context, sb sandbox.Sandbox, files, task []sandbox.File) ([]sandbox.File, []trajectory.Skip, error) {
	isPkg := map[string]bool{}
	for _, f := range append(append([]sandbox.File{}, task...), files...) {
		if b := path.Base(f.Path); b == "__init__.py" || b == "__init__.pyc" {
			isPkg[path.Dir(f.Path)] = true
		}
	}
	names := map[string][]int{} // module name → files
	for i, f := range files {
		dir, base := path.Split(f.Path)
		dir = path.Clean(dir)
		if base == "__init__.py" || base == "__init__.pyc" {
			if !isPkg[path.Dir(dir)] {
				names[path.Base(dir)] = append(names[path.Base(dir)], i)
			}
			continue
		}
		if m := moduleRe.FindStringSubmatch(base); m != nil && !isPkg[dir] {
			names[m[1]] = append(names[m[1]], i)
		}
	}
	if len(names) == 0 {
		return files, nil, nil
	}
	argv := []string{"python3", "-I", "-c", "import sys, importlib.util\nfor n in sys.argv[1:]:\n    try:\n        found = n in sys.builtin_module_names or importlib.util.find_spec(n) is not None\n    except Exception:\n        found = True\n    if found:\n        print(n)\n"}
	var list []string
	for n := range names {
		list = append(list, n)
	}
	sort.Strings(list)
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: append(argv, list...), Workdir: "/", Timeout: time.Minute})
	if err != nil {
		return nil, nil, fmt.Errorf("look up the agent's module names in the verifier's sandbox: %w", err)
	}
	if res.ExitCode != 0 {
		return files, nil, nil // no Python in the image: nothing to shadow
	}
	drop := map[int]string{}
	for _, n := range strings.Fields(string(res.Stdout)) {
		for _, i := range names[n] {
			drop[i] = n
		}
	}
	var keep []sandbox.File
	var skipped []trajectory.Skip
	for i, f := range files {
		if n, ok := drop[i]; ok {
			skipped = append(skipped, trajectory.Skip{Path: f.Path, Kind: trajectory.SkipShadow, Reason: fmt.Sprintf("would be imported as %q, a module the verifier's Python already has: not copied", n)})
			continue
		}
		keep = append(keep, f)
	}
	return keep, skipped, nil
}
