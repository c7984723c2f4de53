package docs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/testbin"
)

// notRun lists the commands the docs show that TestEveryDocumentedCommandRuns
// does not run, each with the reason. Every other command of a ```sh block
// (and every `go run ./cmd/rollbox ...` of the prose) is run against the
// real binary; a command in neither is an error, so a changed command is
// either run or given a reason here.
var notRun = map[string]string{
	"go test -timeout 15m ./sandbox/... ./runtime ./...":                                        "it is the test suite this test is part of",
	"go install ./cmd/rollbox":                                                                  "the test builds the same binary with go build into a directory of its own, put first on PATH",
	"rollbox replay EPISODE.json --until 7 --policy openai:http://127.0.0.1:8000/v1#model=NAME": "needs an inference server",
	`curl -s -H 'Content-Type: application/json' localhost:7070/v1/rollouts -d '{"tasks": [{"id": "fix-add"}, {"id": "sum-of-squares"}], "group_size": 8, "policy": {"base_url": "http://127.0.0.1:8000/v1", "model": "Qwen3-8B", "sampling": {"temperature": 1.0}}}'`: "needs an inference server",
	"curl -sN 'localhost:7070/v1/rollouts/<id>/episodes?stream=1'":                                                                                           "reads the rollout an inference server would serve",
	"curl -s 'localhost:7070/v1/rollouts/<id>/export?format=parquet' -o rollout.parquet":                                                                     "reads the rollout an inference server would serve",
	"curl -s 'localhost:7070/v1/rollouts/<id>'":                                                                                                              "reads the rollout an inference server would serve",
	"rollbox run --tasks tasks.jsonl --policy openai:http://127.0.0.1:8000/v1#model=P --group 8 --out out/r1":                                                "needs an inference server",
	"rollbox rescore --rubrics examples/coding/judge.json out/r1":                                                                                            "rescores the run an inference server would make (cmd/rollbox's judge tests run rescore against fake judges)",
	"rollbox inspect --serve out/r1/rescores/<id>":                                                                                                           "shows that rescore; inspect --serve runs below on the main job's run",
	"rollbox run --tasks examples/coding/tasks.jsonl --policy 'openai:http://127.0.0.1:8000/v1#model=Qwen3-8B' --group 8 --concurrency 32 --temperature 1.0": "needs an inference server",
	"vllm serve Qwen/Qwen3-8B --port 8000 --enable-auto-tool-choice --tool-call-parser hermes":                                                               "needs a GPU",
	"rollbox run --tasks tasks.jsonl --policy 'openai:http://127.0.0.1:8000/v1#model=Qwen/Qwen3-8B' --group 8":                                               "needs an inference server",
	"python -m sglang.launch_server --model-path Qwen/Qwen3-8B --port 30000 --tool-call-parser qwen25":                                                       "needs a GPU",
	"rollbox run --tasks tasks.jsonl --policy 'openai:http://127.0.0.1:30000/v1#model=Qwen/Qwen3-8B' --group 8":                                              "needs an inference server",
	"rollbox tasks import --format harbor examples/import/harbor --out tb.jsonl":                                                                             "builds the Harbor task's image on the engine: TestImportedHarborTaskScoresSolveFailCheat (cmd/rollbox) runs it",
	"bash examples/import/swebench/make-repos.sh repos":                                                                                                      "TestImportedSWEBenchInstancesScoreSolveFailCheat (cmd/rollbox) makes the repositories and runs the three policies on the engine",
	"rollbox tasks import --format swebench examples/import/swebench/instances.jsonl --repos repos --out swe.jsonl":                                          "TestImportedSWEBenchInstancesScoreSolveFailCheat (cmd/rollbox)",
	"rollbox run --tasks swe.jsonl --policy scripted:examples/import/policies/solve.jsonl":                                                                   "TestImportedSWEBenchInstancesScoreSolveFailCheat (cmd/rollbox)",
	"rollbox audit --json":          "minutes on a shared engine (a container per probe, 3.5 min measured); internal/audit tests the probes",
	"rollbox audit --runtime runsc": "minutes under gVisor (5 min measured); internal/audit tests the probes",
	"rollbox audit --tasks examples/coding/docker-tasks.jsonl --task fix-add-pytest": "minutes on the engine; TestAuditOfATasksWASMSandboxPassesAndLogsItsCalls (cmd/rollbox) audits a task's sandbox",
	"rollbox run --audit-log audit.jsonl ...":                                        "a fragment (any command); the test runs the main job with --audit-log and verifies the log",
}

// docCommands returns the commands of the ```sh blocks of a file (a
// quoted argument spanning lines joined, comments dropped) and the `go run
// ./cmd/rollbox ...` spans of its prose, with `go run ./cmd/rollbox`
// written `rollbox`.
func docCommands(t *testing.T, file string) []string {
	var out []string
	comment := regexp.MustCompile(`\s+#\s.*$`)
	add := func(c string) {
		c = strings.Join(strings.Fields(comment.ReplaceAllString(c, "")), " ")
		c = strings.ReplaceAll(c, "go run ./cmd/rollbox", "rollbox")
		if c != "" && !strings.HasPrefix(c, "#") {
			out = append(out, c)
		}
	}
	for _, b := range blocks(t, file) {
		if len(b.info) == 0 || b.info[0] != "sh" {
			continue
		}
		pending := ""
		for _, line := range strings.Split(b.body, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") && pending == "" {
				continue
			}
			pending += " " + comment.ReplaceAllString(line, "")
			if strings.Count(pending, "'")%2 == 0 {
				add(pending)
				pending = ""
			}
		}
		if strings.TrimSpace(pending) != "" {
			t.Errorf("%s:%d: a quote is not closed", file, b.line)
		}
	}
	for _, m := range regexp.MustCompile("`(go run ./cmd/rollbox [^`]*)`").FindAllStringSubmatch(readDoc(t, file), -1) {
		add(m[1])
	}
	return out
}

// server is a command the docs start in the background (serve, inspect
// --serve), run on a port of its own.
type server struct {
	cmd  *exec.Cmd
	addr string
}

// rollboxBinary is cmd/rollbox built from the current sources (testbin:
// one build, shared with the other packages' tests).
func rollboxBinary(t *testing.T) string {
	t.Helper()
	return testbin.Build(t, "./cmd/rollbox")
}

// TestEveryDocumentedCommandRuns drives the real binary through every
// command the README and the docs show that needs no GPU, on the WASM
// backend and on Docker, in the order they show them, in a directory of
// its own (examples/ reached through a link), so the docs cannot drift
// from the code. Placeholders (<rollout>, <episode>, EPISODE.json, <episode
// id>) take the values the commands before them produced; servers listen
// on a port of their own instead of the documented one.
func TestEveryDocumentedCommandRuns(t *testing.T) {
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Dir(rollboxBinary(t))
	work := t.TempDir()
	if err := os.Symlink(filepath.Join(root, "examples"), filepath.Join(work, "examples")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "ROLLBOX_AUDIT_LOG=")
	vars := map[string]string{}
	ran, skipped := 0, 0
	var servers []*server
	stopAll := func() {
		for _, s := range servers {
			s.cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { s.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				s.cmd.Process.Kill()
				<-done
			}
		}
		servers = nil
	}
	defer stopAll()

	bash := func(line string, stdin string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c := exec.CommandContext(ctx, "bash", "-c", line)
		c.Dir, c.Env = work, env
		c.Stdin = strings.NewReader(stdin)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	start := func(t *testing.T, line string, addrRe *regexp.Regexp) *server {
		c := exec.Command("bash", "-c", "exec "+line)
		c.Dir, c.Env = work, env
		stderr, _ := c.StderrPipe()
		c.Stdout = io.Discard
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		s := &server{cmd: c}
		servers = append(servers, s)
		found := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if m := addrRe.FindStringSubmatch(sc.Text()); m != nil {
					select {
					case found <- m[1]:
					default:
					}
				}
			}
		}()
		select {
		case s.addr = <-found:
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: no address logged in 2 minutes", line)
		}
		return s
	}
	get := func(t *testing.T, url string) []byte {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
		}
		return b
	}
	firstFile := func(glob string) string {
		m, _ := filepath.Glob(filepath.Join(work, glob))
		if len(m) == 0 {
			t.Fatalf("nothing matches %s", glob)
		}
		rel, _ := filepath.Rel(work, m[0])
		return rel
	}

	for _, file := range docFiles(t) {
		var serve *server
		for _, line := range docCommands(t, file) {
			if reason, ok := notRun[line]; ok {
				t.Logf("%s: not run: %s: %s", file, line, reason)
				skipped++
				continue
			}
			cmd := line
			for k, v := range vars {
				cmd = strings.ReplaceAll(cmd, k, v)
			}
			if strings.Contains(cmd, "<") && !strings.Contains(cmd, "<(") || strings.Contains(cmd, "EPISODE.json") {
				t.Errorf("%s: %s: a placeholder no command before it fills (or add the command to notRun with a reason)", file, line)
				continue
			}
			ran++
			began := time.Now()
			t.Logf("%s: running %s", file, cmd)
			switch {
			case strings.HasPrefix(cmd, "rollbox serve "):
				cmd = regexp.MustCompile(`--addr \S+`).ReplaceAllString(cmd, "--addr 127.0.0.1:0")
				serve = start(t, cmd, regexp.MustCompile(`listening on http://(\S+)`))
				get(t, "http://"+serve.addr+"/healthz")
			case strings.HasPrefix(cmd, "rollbox inspect --serve "):
				s := start(t, cmd+" --addr 127.0.0.1:0", regexp.MustCompile(`at http://(\S+)/ `))
				var list struct {
					Total int `json:"total"`
				}
				if err := json.Unmarshal(get(t, "http://"+s.addr+"/api/episodes"), &list); err != nil || list.Total == 0 {
					t.Errorf("%s: /api/episodes lists no episode (%v)", cmd, err)
				}
			case strings.HasPrefix(cmd, "curl "):
				if serve == nil {
					t.Fatalf("%s: %s: no rollbox serve before it", file, line)
				}
				cmd = strings.ReplaceAll(cmd, "localhost:7070", serve.addr)
				out, err := bash(cmd+" --fail-with-body", "")
				if err != nil {
					t.Errorf("%s: %s: %v\n%s", file, cmd, err, out)
					continue
				}
				var opened struct {
					ID    string            `json:"id"`
					Tools []json.RawMessage `json:"tools"`
				}
				if json.Unmarshal([]byte(out), &opened) == nil && opened.ID != "" && len(opened.Tools) > 0 {
					vars["<episode id>"] = opened.ID // POST /v1/episodes: EpisodeOpened
				}
			default:
				stdin := ""
				if strings.Contains(cmd, "--shell") {
					stdin = "ls /work\nexit\n"
				}
				if strings.HasPrefix(cmd, "rollbox run ") && !strings.Contains(cmd, "--audit-log") {
					cmd += " --audit-log audit.jsonl"
				}
				out, err := bash(cmd, stdin)
				if err != nil {
					t.Errorf("%s: %s: %v\n%s", file, cmd, err, out)
					continue
				}
			}
			t.Logf("%s: %s took %v", file, line, time.Since(began).Round(time.Millisecond))
			// What later commands refer to.
			switch {
			case strings.HasPrefix(cmd, "rollbox run ") && strings.Contains(cmd, "--out out/workspace"):
				vars["<episode id>"] = strings.TrimSuffix(filepath.Base(firstFile("out/workspace/episodes/*.json")), ".json")
			case strings.HasPrefix(cmd, "rollbox run ") && !strings.Contains(cmd, "--out "):
				ep := longestEpisode(t, work, "out/*/episodes/*.json")
				vars["<rollout>"] = strings.Split(ep, string(filepath.Separator))[1]
				vars["<episode>"] = strings.TrimSuffix(filepath.Base(ep), ".json")
				vars["EPISODE.json"] = ep
			}
		}
		stopAll()
	}
	if out, err := bash("rollbox audit verify-log audit.jsonl", ""); err != nil {
		t.Errorf("the runs' audit log does not verify: %v\n%s", err, out)
	}
	t.Logf("ran %d documented commands, %d not run (reasons above)", ran, skipped)
	if ran < 12 {
		t.Errorf("only %d documented commands ran", ran)
	}
}

// longestEpisode returns the recorded episode (a path relative to dir) with
// the most steps: the docs' examples stop a replay at a step it must have.
func longestEpisode(t *testing.T, dir, glob string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, glob))
	best, most := "", -1
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			Steps []json.RawMessage `json:"steps"`
		}
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(rec.Steps) > most {
			best, most = f, len(rec.Steps)
		}
	}
	if best == "" {
		t.Fatalf("nothing matches %s", glob)
	}
	rel, _ := filepath.Rel(dir, best)
	return rel
}
