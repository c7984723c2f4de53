package taskimport

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/reward"
	"github.com/rollbox/rollbox/agent/reward/testreport"
	"github.com/rollbox/rollbox/sandbox"
)

// SWEBenchOptions are the SWE-bench importer's own.
type SWEBenchOptions struct {
	// Repos holds the repositories: DIR/<instance_id>/ is taken as the
	// instance's workspace as it stands (a snapshot at its base commit);
	// otherwise DIR/<owner>__<name>, DIR/<owner>/<name> or DIR/<name> is a
	// git repository the base commit is taken from (git archive).
	Repos string
	// Image is the sandbox image (a recipe name or docker:NAME:TAG) of
	// instances that name none (image_name); default "python".
	Image string
	// Workdir is where the repository is in the sandbox (default /testbed,
	// as in SWE-bench's images).
	Workdir string
	// Score is "all" (resolved: every FAIL_TO_PASS and PASS_TO_PASS test
	// passes; the default) or "fraction" (the pass rate over them).
	Score string
	// TestTimeoutS bounds the verifier's run (default 600 s).
	TestTimeoutS float64
	// Hints adds the instance's hints_text to the prompt.
	Hints bool
}

// swebenchKnown are the instance fields the importer reads or knowingly
// leaves out.
var swebenchKnown = map[string]bool{
	"instance_id": true, "repo": true, "base_commit": true, "patch": true, "test_patch": true, "problem_statement": true,
	"hints_text": true, "created_at": true, "version": true, "FAIL_TO_PASS": true, "PASS_TO_PASS": true,
	"environment_setup_commit": true, "image_name": true,
}

// commitRe is a git commit id, whole or abbreviated.
var commitRe = regexp.MustCompile(`^[0-9a-fA-F]{4,64}$`)

// nodeIDRe is a pytest node id: a file, then :: and the test's name.
var nodeIDRe = regexp.MustCompile(`^[^\s:][^:]*\.py::\S.*$`)

// ImportSWEBench imports SWE-bench-style instances (one JSON object a line:
// instance_id, repo, base_commit, problem_statement, test_patch,
// FAIL_TO_PASS, PASS_TO_PASS). The repository at its base commit is the
// task's workspace (a tar beside the task file); the files the test patch
// adds or changes, as patched, are hidden tests: the agent works on the
// repository without them and they are written into the verifier's fresh
// sandbox only after it finished; the verifier runs pytest on the test
// patch's files and the reward is pytest's report of FAIL_TO_PASS and
// PASS_TO_PASS (must_pass), all-or-nothing or a pass rate. What cannot be
// mapped is a Problem of its instance.
//
// # Errors
//
// Only when file cannot be read or holds no instance, or git is missing.
func ImportSWEBench(ctx context.Context, file string, opts Options, sw SWEBenchOptions) (*Report, error) {
	if sw.Image == "" {
		sw.Image = "python"
	}
	if sw.Workdir == "" {
		sw.Workdir = "/testbed"
	}
	if sw.TestTimeoutS <= 0 {
		sw.TestTimeoutS = 600
	}
	switch sw.Score {
	case "":
		sw.Score = reward.ScoreAll
	case reward.ScoreAll, reward.ScoreFraction:
	default:
		return nil, fmt.Errorf("score %q is not one of all, fraction", sw.Score)
	}
	if !path.IsAbs(sw.Workdir) || path.Clean(sw.Workdir) != sw.Workdir || sw.Workdir == "/" {
		return nil, fmt.Errorf("workdir %q must be a clean absolute path other than /", sw.Workdir)
	}
	if _, err := exec.LookPath("git"); err != nil {
		return nil, fmt.Errorf("the SWE-bench importer needs git (to take base commits and apply test patches): %w", err)
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rep := &Report{Format: "swebench", Source: file, Out: opts.OutFile}
	ids := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		rep.Tasks = append(rep.Tasks, importInstance(ctx, fmt.Sprintf("%s:%d", file, n), line, &opts, &sw, ids))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s line %d: %w", file, n+1, err)
	}
	if len(rep.Tasks) == 0 {
		return nil, fmt.Errorf("%s holds no instance", file)
	}
	finalize(rep, filepath.Dir(opts.OutFile))
	return rep, nil
}

// testNames reads FAIL_TO_PASS or PASS_TO_PASS: a list, or (as in the
// published data sets) a string holding a JSON list.
func testNames(r *Result, field string, raw json.RawMessage) []string {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil || json.Unmarshal([]byte(s), &list) != nil {
			r.errorf(field, "not a list of test names (nor a string holding one)")
			return nil
		}
	}
	return list
}

func importInstance(ctx context.Context, source string, line []byte, opts *Options, sw *SWEBenchOptions, ids map[string]string) *Result {
	r := &Result{Source: source}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		r.ID = source
		r.errorf("", "not a JSON object: %v", err)
		return r
	}
	str := func(k string) string {
		var s string
		if v, ok := raw[k]; ok && json.Unmarshal(v, &s) != nil {
			r.errorf(k, "not a string")
		}
		return s
	}
	instanceID := str("instance_id")
	if instanceID == "" {
		r.ID = source
		r.errorf("instance_id", "required")
		return r
	}
	r.ID = taskID(r, "instance_id", instanceID)
	if !claimID(r, ids) {
		return r
	}
	var unknown []string
	for k := range raw {
		if !swebenchKnown[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		r.notef("", "not mapped: %s", strings.Join(unknown, ", "))
	}
	repo, base, problem, testPatch := str("repo"), str("base_commit"), str("problem_statement"), str("test_patch")
	if strings.TrimSpace(problem) == "" {
		r.errorf("problem_statement", "required: it is the agent's prompt")
	}
	if strings.TrimSpace(testPatch) == "" {
		r.errorf("test_patch", "required: it holds the tests that verify the fix")
	}
	f2p := testNames(r, "FAIL_TO_PASS", raw["FAIL_TO_PASS"])
	p2p := testNames(r, "PASS_TO_PASS", raw["PASS_TO_PASS"])
	if len(f2p) == 0 && !r.failed() {
		r.errorf("FAIL_TO_PASS", "required: at least one test the fix must make pass")
	}
	var mustPass []string
	seen := map[string]bool{}
	for i, list := range [][]string{f2p, p2p} {
		field := [...]string{"FAIL_TO_PASS", "PASS_TO_PASS"}[i]
		for j, name := range list {
			if !nodeIDRe.MatchString(name) {
				r.errorf(fmt.Sprintf("%s[%d]", field, j), "%q is not a pytest node id (path/to/test_file.py::test_name): this importer verifies with pytest's report", name)
				continue
			}
			if file, _, _ := strings.Cut(name, "::"); !isLocalSlash(file) {
				r.errorf(fmt.Sprintf("%s[%d]", field, j), "%q names a file outside the repository: test files are paths relative to its root", name)
				continue
			}
			if !seen[name] {
				seen[name] = true
				mustPass = append(mustPass, name)
			}
		}
	}
	if str("patch") != "" {
		r.notef("patch", "the gold patch is not imported: the agent writes the fix")
	}
	if r.failed() {
		return r
	}

	image := sw.Image
	if in := str("image_name"); in != "" {
		image = "docker:" + in
	}
	t := &agent.Task{ID: r.ID, Tools: importTools(),
		Sandbox: agent.TaskSandbox{Backend: sandbox.BackendDocker, Image: image, Workdir: sw.Workdir,
			Env: map[string]string{"PYTHONPATH": sw.Workdir}},
		Metadata: map[string]any{"source": "swebench", "instance_id": instanceID, "repo": repo, "base_commit": base}}
	for _, k := range []string{"version", "created_at", "environment_setup_commit"} {
		if v := str(k); v != "" {
			t.Metadata[k] = v
		}
	}
	short := base
	if len(short) > 12 {
		short = short[:12]
	}
	where := "The repository"
	if repo != "" {
		where += " " + repo
	}
	where += " is checked out at " + sw.Workdir
	if short != "" {
		where += ", at commit " + short
	}
	t.Prompt = where + ". Resolve the issue below by changing the repository's code (not its tests), then call finish.\n\n" + problem
	if sw.Hints {
		if h := str("hints_text"); strings.TrimSpace(h) != "" {
			t.Prompt += "\n\nHints:\n" + h
		}
	}
	r.notef("sandbox.env.PYTHONPATH", "the repository is importable from its root, %s (SWE-bench's images install it)", sw.Workdir)

	// The workspace: the repository at the base commit.
	tmp, err := os.MkdirTemp("", "rollbox-swebench-")
	if err != nil {
		r.errorf("", "%v", err)
		return r
	}
	defer os.RemoveAll(tmp)
	absWS, relWS := opts.workspaceDir()
	tarPath := filepath.Join(absWS, r.ID+".tar")
	defer func() {
		if r.failed() { // no snapshot of a task that is not imported
			os.Remove(tarPath)
			r.Workspace = ""
		}
	}()
	if !snapshotRepo(ctx, r, sw.Repos, instanceID, repo, base, tarPath) {
		return r
	}
	tree := filepath.Join(tmp, "tree")
	if err := extractTar(tarPath, tree); err != nil {
		r.errorf("", "reading the snapshot %s: %v", tarPath, err)
		return r
	}

	// The test patch, applied to a copy: its files are the hidden tests.
	hidden, testFiles := applyTestPatch(ctx, r, tree, testPatch, sw.Workdir)
	if r.failed() {
		return r
	}
	// Every file a must_pass test is in is the task's alone: one the test
	// patch does not touch (a PASS_TO_PASS test's) is a hidden test too,
	// as at the base commit, so the agent's edits of it never count,
	// whatever its name (the verifier's default protect globs know only
	// the usual ones).
	for _, name := range mustPass {
		file, _, _ := strings.Cut(name, "::")
		if containsString(testFiles, file) {
			continue
		}
		dst := path.Join(sw.Workdir, file)
		if hidden[dst] == "" {
			p := filepath.Join(tree, filepath.FromSlash(file))
			info, err := os.Lstat(p)
			if err != nil || !info.Mode().IsRegular() {
				r.errorf("", "%s names %s, which neither the repository nor the test patch has as a file", name, file)
				return r
			}
			b, err := os.ReadFile(p)
			if err != nil || !utf8.Valid(b) {
				r.errorf("", "%s names %s, which cannot be read as text: %v", name, file, err)
				return r
			}
			hidden[dst] = string(b)
		}
		testFiles = append(testFiles, file)
	}
	// A test the file does not define can never be reported passed.
	for _, name := range mustPass {
		file, _, _ := strings.Cut(name, "::")
		if fn := testFunction(name); fn != "" && !definesTest(hidden[path.Join(sw.Workdir, file)], fn) {
			r.warnf("must_pass", "%s: %s does not define %s (nor assign it): the task scores 0 until it does", name, file, fn)
		}
	}
	canaries := addCanaries(hidden, testFiles, sw.Workdir)
	total := 0
	for _, c := range hidden {
		total += len(c)
	}
	if total > maxHiddenBytes {
		r.errorf("test_patch", "%d bytes of tests: more than the %d a task carries", total, maxHiddenBytes)
		return r
	}
	sort.Strings(testFiles)
	quoted := make([]string, len(testFiles))
	for i, f := range testFiles {
		quoted[i] = shellQuote(f)
	}
	t.Reward = reward.Spec{Type: "tests",
		Command:     "cd " + shellQuote(sw.Workdir) + " && python3 -m pytest -rA " + strings.Join(quoted, " "),
		TimeoutS:    sw.TestTimeoutS,
		Report:      &reward.Report{Format: testreport.Pytest},
		MustPass:    mustPass,
		MustFail:    canaries,
		Score:       sw.Score,
		HiddenTests: hidden,
	}
	t.Workspace = &agent.Workspace{From: filepath.ToSlash(filepath.Join(relWS, r.ID+".tar")), To: sw.Workdir}
	r.Workspace = t.Workspace.From
	if opts.MaxTurns > 0 {
		t.Limits.MaxTurns = opts.MaxTurns
	}

	// The image: it must be there when the episodes run.
	r.Image = image
	switch {
	case opts.Images == nil:
		r.notef("sandbox.image", "%s was not checked (no Docker engine: %v)", image, opts.NoImages)
	default:
		if _, err := opts.Images.Inspect(ctx, image); err != nil {
			if errors.Is(err, sandbox.ErrImageNotFound) {
				r.warnf("sandbox.image", "%s is not in the local engine: the episodes end sandbox_error until it is (`rollbox images build python`, or a local image with pytest)", image)
			} else {
				r.notef("sandbox.image", "%s was not checked: %v", image, err)
			}
		}
	}
	r.Task = t
	return r
}

// snapshotRepo writes the instance's repository at its base commit as a
// tar: a workspace directory as it stands, or git archive of a repository.
func snapshotRepo(ctx context.Context, r *Result, repos, instanceID, repo, base, tarPath string) bool {
	if repos == "" {
		r.errorf("repo", "needs the repositories: --repos DIR (DIR/%s/ as the workspace, or a git repository DIR/<owner>__<name>)", instanceID)
		return false
	}
	if !isLocalName(instanceID) {
		r.errorf("instance_id", "%q cannot name a directory of --repos: an instance id is a plain name, without / or ..", instanceID)
		return false
	}
	if ws := filepath.Join(repos, instanceID); isDir(ws) {
		err := writeTarAtomic(tarPath, func(w io.Writer) error { return tarDir(ws, w) })
		if err != nil {
			r.errorf("repo", "snapshot of %s: %v", ws, err)
			return false
		}
		r.notef("repo", "the workspace is %s as it stands (taken to be %s at %s)", ws, repo, base)
		return true
	}
	if base == "" {
		r.errorf("base_commit", "required to take the repository from git (or give a workspace: --repos DIR with DIR/%s/)", instanceID)
		return false
	}
	if repo == "" {
		r.errorf("repo", "required to find the repository (OWNER/NAME), or give a workspace: --repos DIR with DIR/%s/", instanceID)
		return false
	}
	var candidates []string
	owner, name, hasOwner := strings.Cut(repo, "/")
	if hasOwner && !(isLocalName(owner) && isLocalName(name)) || !hasOwner && repo != "" && !isLocalName(repo) {
		r.errorf("repo", "%q is not OWNER/NAME (or NAME): it cannot name a repository of --repos", repo)
		return false
	}
	if !commitRe.MatchString(base) {
		r.errorf("base_commit", "%q is not a commit id (4 to 64 hexadecimal digits)", base)
		return false
	}
	if hasOwner {
		candidates = append(candidates, filepath.Join(repos, owner+"__"+name), filepath.Join(repos, owner, name), filepath.Join(repos, name))
	} else if repo != "" {
		candidates = append(candidates, filepath.Join(repos, repo))
	}
	var gitDir string
	for _, c := range candidates {
		if isDir(filepath.Join(c, ".git")) || isGitBare(c) {
			gitDir = c
			break
		}
	}
	if gitDir == "" {
		r.errorf("repo", "no repository for %q in %s (looked for %s, and %s as a workspace)", repo, repos, strings.Join(candidates, ", "), filepath.Join(repos, instanceID))
		return false
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", gitDir, "rev-parse", "--verify", "--quiet", base+"^{commit}").Output(); err != nil || len(bytes.TrimSpace(out)) == 0 {
		r.errorf("base_commit", "%s is not a commit of %s", base, gitDir)
		return false
	}
	err := writeTarAtomic(tarPath, func(w io.Writer) error {
		cmd := exec.CommandContext(ctx, "git", "-C", gitDir, "archive", "--format=tar", base)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = w, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("git archive: %v: %s", err, strings.TrimSpace(stderr.String()))
		}
		return nil
	})
	if err != nil {
		r.errorf("base_commit", "%v", err)
		return false
	}
	return true
}

func isDir(p string) bool {
	info, err := os.Stat(p)
	return err == nil && info.IsDir()
}

func isGitBare(p string) bool {
	return isDir(filepath.Join(p, "objects")) && isDir(filepath.Join(p, "refs"))
}

// tarDir writes dir's regular files and directories (not .git, not
// symbolic links) as a tar.
func tarDir(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if d.Name() == ".git" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// extractTar unpacks a snapshot's regular files and directories into dir.
func extractTar(tarPath, dir string) error {
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(h.Name, "./")
		if !filepath.IsLocal(filepath.FromSlash(strings.TrimSuffix(name, "/"))) {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil {
				out.Close()
				return err
			}
			if err := out.Close(); err != nil {
				return err
			}
		}
	}
}

// patchFile is one file a unified diff touches.
type patchFile struct {
	path    string // the path after the patch ("" when deleted)
	old     string
	deleted bool
	binary  bool
	symlink bool // the patch makes it a symbolic link
}

// patchFiles lists what a git diff touches.
func patchFiles(diff string) []patchFile {
	var out []patchFile
	var cur *patchFile
	for _, l := range strings.Split(diff, "\n") {
		switch {
		case strings.HasPrefix(l, "diff --git "):
			out = append(out, patchFile{})
			cur = &out[len(out)-1]
			rest := strings.TrimPrefix(l, "diff --git ")
			if i := strings.Index(rest, " b/"); strings.HasPrefix(rest, "a/") && i > 0 {
				cur.old, cur.path = rest[2:i], rest[i+3:]
			}
		case cur == nil:
		case strings.HasPrefix(l, "deleted file mode"):
			cur.deleted = true
		case strings.HasPrefix(l, "rename to "):
			cur.path = strings.TrimPrefix(l, "rename to ")
		case strings.HasPrefix(l, "+++ b/"):
			cur.path = strings.TrimPrefix(l, "+++ b/")
		case strings.HasPrefix(l, "+++ /dev/null"):
			cur.deleted = true
		case strings.HasPrefix(l, "GIT binary patch"), strings.HasPrefix(l, "Binary files "):
			cur.binary = true
		case strings.HasPrefix(l, "new file mode 120000"), strings.HasPrefix(l, "new mode 120000"):
			cur.symlink = true
		}
	}
	return out
}

// applyTestPatch applies the test patch to the snapshot in tree and returns
// the files it adds or changes, as patched, as hidden tests (under
// workdir), and the Python test files among them.
func applyTestPatch(ctx context.Context, r *Result, tree, patch, workdir string) (map[string]string, []string) {
	files := patchFiles(patch)
	if len(files) == 0 {
		r.errorf("test_patch", "not a git diff (no \"diff --git\" header)")
		return nil, nil
	}
	for _, f := range files {
		if f.binary {
			r.errorf("test_patch", "changes the binary file %s: hidden tests are text", f.path)
		}
		if f.symlink {
			r.errorf("test_patch", "%s is a symbolic link after the patch: hidden tests are files", f.path)
		}
		if f.path == "" || !filepath.IsLocal(filepath.FromSlash(f.path)) {
			r.errorf("test_patch", "a file path that is not inside the repository: %q", f.path)
		}
	}
	if r.failed() {
		return nil, nil
	}
	pf := filepath.Join(filepath.Dir(tree), "test.patch")
	if err := os.WriteFile(pf, []byte(patch), 0o644); err != nil {
		r.errorf("test_patch", "%v", err)
		return nil, nil
	}
	cmd := exec.CommandContext(ctx, "git", "apply", "--whitespace=nowarn", pf)
	cmd.Dir = tree
	cmd.Env = append(os.Environ(), "GIT_CEILING_DIRECTORIES="+filepath.Dir(tree))
	if out, err := cmd.CombinedOutput(); err != nil {
		r.errorf("test_patch", "does not apply to the base commit: %s", strings.TrimSpace(string(out)))
		return nil, nil
	}
	hidden := map[string]string{}
	var tests []string
	for _, f := range files {
		if f.deleted {
			r.warnf("test_patch", "deletes %s: hidden tests add or replace files, so it stays as at the base commit in the verifier's sandbox", f.old)
			continue
		}
		if f.old != "" && f.old != f.path {
			r.warnf("test_patch", "renames %s to %s: the old file stays as at the base commit in the verifier's sandbox", f.old, f.path)
		}
		p := filepath.Join(tree, filepath.FromSlash(f.path))
		if info, err := os.Lstat(p); err == nil && !info.Mode().IsRegular() {
			r.errorf("test_patch", "%s is not a regular file after the patch (%s): hidden tests are files", f.path, info.Mode().Type())
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			r.errorf("test_patch", "%s after the patch: %v", f.path, err)
			continue
		}
		if !utf8.Valid(b) {
			r.errorf("test_patch", "%s is not UTF-8 text: hidden tests are text", f.path)
			continue
		}
		hidden[path.Join(workdir, f.path)] = string(b)
		if strings.HasSuffix(f.path, ".py") {
			base := path.Base(f.path)
			if strings.HasPrefix(base, "test_") || strings.HasSuffix(base, "_test.py") {
				tests = append(tests, f.path)
			}
		}
	}
	return hidden, tests
}

// addCanaries appends to each Python test file the verifier runs a test
// whose real outcome is a failure, under a random name the agent never
// sees (the files are hidden tests), and returns their node ids: the
// verifier's must_fail. Code of the agent's that rewrites the test
// process's reports (every test passed) rewrites a canary's too, and the
// reward is 0, blamed, instead of 1.
func addCanaries(hidden map[string]string, testFiles []string, workdir string) []string {
	var ids []string
	for _, f := range testFiles {
		dst := path.Join(workdir, f)
		src, ok := hidden[dst]
		if !ok || !strings.HasSuffix(f, ".py") {
			continue
		}
		var b [8]byte
		rand.Read(b[:])
		name := "test_regression_" + hex.EncodeToString(b[:4])
		n := 2 + int(b[4])<<8 + int(b[5])
		if src != "" && !strings.HasSuffix(src, "\n") {
			src += "\n"
		}
		hidden[dst] = src + fmt.Sprintf("\n\ndef %s():\n    assert %d == %d\n", name, n, n+1+int(b[6]))
		ids = append(ids, f+"::"+name)
	}
	return ids
}

// testFunction is the name a pytest node id's last part defines: the
// function or method, without its parameters ("" when unclear).
func testFunction(nodeID string) string {
	parts := strings.Split(nodeID, "::")
	if len(parts) < 2 {
		return ""
	}
	fn, _, _ := strings.Cut(parts[len(parts)-1], "[")
	if !identRe.MatchString(fn) {
		return ""
	}
	return fn
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// definesTest reports whether Python source defines or assigns name.
func definesTest(src, name string) bool {
	re := regexp.MustCompile(`(?m)^[ \t]*((async[ \t]+)?def[ \t]+` + name + `[ \t]*\(|` + name + `[ \t]*=|class[ \t]+` + name + `\b)`)
	return re.MatchString(src)
}

// isLocalName reports whether s is one plain path component: not empty,
// not . or .., without a separator.
func isLocalName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\\\x00")
}

// isLocalSlash reports whether the slash-separated path p stays inside the
// directory it is relative to.
func isLocalSlash(p string) bool {
	return p != "" && !strings.ContainsAny(p, "\\\x00") && filepath.IsLocal(filepath.FromSlash(p)) && !path.IsAbs(p)
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
