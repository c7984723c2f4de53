package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/tools"
)

func rollbox(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, self: testSelf, getenv: testGetenv(t)}, args)
	return code, out.String(), errb.String()
}

// testEnv holds the variables setEnv set, by test name.
var testEnv sync.Map // string -> map[string]string

// setEnv sets key to value in the environment rollbox(t, ...) reads, for t
// and its subtests, and not in the process's: unlike t.Setenv, a test that
// sets its own (its containers' owner label) may run in parallel.
func setEnv(t *testing.T, key, value string) {
	t.Helper()
	m, _ := testEnv.LoadOrStore(t.Name(), map[string]string{})
	m.(map[string]string)[key] = value
	t.Cleanup(func() { testEnv.Delete(t.Name()) })
}

// testGetenv reads what setEnv set for t or a test above it, else the
// process's environment.
func testGetenv(t *testing.T) func(string) string {
	return func(key string) string {
		for name := t.Name(); ; {
			if m, ok := testEnv.Load(name); ok {
				if v, ok := m.(map[string]string)[key]; ok {
					return v
				}
			}
			i := strings.LastIndexByte(name, '/')
			if i < 0 {
				return os.Getenv(key)
			}
			name = name[:i]
		}
	}
}

func TestIndexBuildThenSearch(t *testing.T) {
	dir := t.TempDir()
	corpus := filepath.Join(dir, "corpus.jsonl")
	os.WriteFile(corpus, []byte(`{"id": "gzip", "title": "compress/gzip", "text": "Package gzip reads and writes gzip files.", "top": "compress"}
{"id": "http", "title": "net/http", "text": "Package http provides HTTP clients and servers.", "top": "net"}
`), 0o644)
	ix := filepath.Join(dir, "ix")
	code, out, errs := rollbox(t, "index", "build", "--corpus", corpus, "--out", ix, "--chunk-tokens", "50")
	if code != exitOK || !strings.Contains(out, "built "+ix+": 2 documents in 2 chunks") {
		t.Fatalf("build: %d %q %q", code, out, errs)
	}
	code, out, errs = rollbox(t, "index", "search", "--index", ix, "--filter", "top=net", "HTTP", "servers")
	if code != exitOK || !strings.Contains(out, "http#1") || strings.Contains(out, "gzip#1") {
		t.Fatalf("search: %d %q %q", code, out, errs)
	}
	code, out, _ = rollbox(t, "index", "info", ix)
	if code != exitOK || !strings.Contains(out, `"scoring": "bm25"`) {
		t.Fatalf("info: %d %q", code, out)
	}
}

func TestIndexBuildRefusesBadInputWithExit2(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte("{\"id\": \"a\", \"text\": \"x\"}\n{\"text\": \"no id\"}\n"), 0o644)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"a corpus line without an id", []string{"index", "build", "--corpus", bad, "--out", filepath.Join(dir, "a")}, `bad.jsonl line 2: bad corpus: no "id" field`},
		{"an output directory in use", []string{"index", "build", "--corpus", bad, "--out", dir}, "already exists"},
		{"no corpus", []string{"index", "build", "--out", filepath.Join(dir, "b")}, "--corpus FILE and --out DIR are required"},
		{"a missing corpus", []string{"index", "build", "--corpus", filepath.Join(dir, "none"), "--out", filepath.Join(dir, "c")}, "no such file"},
		{"an unknown subcommand", []string{"index", "drop"}, `unknown command "drop" for "rollbox index"`},
		{"searching what is not an index", []string{"index", "search", "--index", dir, "x"}, "not a rollbox index"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errs := rollbox(t, tt.args...)
			if code != exitBadInput || !strings.Contains(errs, tt.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errs, tt.want)
			}
		})
	}
}

func TestSearchTasksShareOneIndexAndGetALedgerEach(t *testing.T) {
	dir := t.TempDir()
	if _, err := retriever.Build(context.Background(), filepath.Join(dir, "ix"), strings.NewReader(`{"id": "a", "text": "alpha"}`), retriever.BuildOptions{}); err != nil {
		t.Fatal(err)
	}
	lines := `{"id": "t1", "prompt": "p", "retriever": {"index": "ix", "context_tokens": 123}, "reward": {"type": "fbeta", "relevant": ["a"]}}
{"id": "t2", "prompt": "p", "retriever": {"index": "./ix"}, "reward": {"type": "fbeta", "relevant": ["a"]}, "limits": {"max_context_tokens": 1000}}
{"id": "t3", "prompt": "p", "reward": {"type": "exact", "answer": "a"}}
`
	tasks, err := agent.ReadTasks(strings.NewReader(lines), filepath.Join(dir, "tasks.jsonl"), tools.Known)
	if err != nil {
		t.Fatal(err)
	}
	s, err := openSearchIndexes(tasks)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.open) != 1 {
		t.Fatalf("%d indexes opened for one directory", len(s.open))
	}
	for i, want := range []int64{123, 500} {
		cfg := agent.Config{Task: tasks[i]}
		if err := s.configure(&cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.ExtraTools["search"] == nil || cfg.ExtraTools["read"] == nil || cfg.ExtraTools["prune"] == nil {
			t.Fatalf("extra tools = %v", cfg.ExtraTools)
		}
		env := &tools.Env{Extra: map[string]any{}}
		if err := cfg.ToolEnv(env); err != nil {
			t.Fatal(err)
		}
		if l := tools.LedgerOf(env); l == nil || l.Budget() != want {
			t.Errorf("task %s: ledger %+v, want budget %d", tasks[i].ID, l, want)
		}
	}
	cfg := agent.Config{Task: tasks[2]}
	if err := s.configure(&cfg); err != nil || cfg.ExtraTools != nil || cfg.ToolEnv != nil {
		t.Errorf("a task without a retriever was configured: %v", err)
	}
	if _, err := openSearchIndexes([]*agent.Task{{ID: "x", Retriever: &agent.Retriever{Index: filepath.Join(dir, "none")}}}); err == nil || !strings.Contains(err.Error(), `task "x": retriever.index`) {
		t.Errorf("missing index: %v", err)
	}
}

func TestSetEnvReachesTheCommandsAndSubtestsNotTheProcess(t *testing.T) {
	const key = "ROLLBOX_TEST_SETENV"
	setEnv(t, key, "set")
	if got := testGetenv(t)(key); got != "set" {
		t.Errorf("the test reads %q, want set", got)
	}
	t.Run("a subtest", func(t *testing.T) {
		if got := testGetenv(t)(key); got != "set" {
			t.Errorf("its subtest reads %q, want set", got)
		}
		setEnv(t, key, "sub")
		if got := testGetenv(t)(key); got != "sub" {
			t.Errorf("a subtest's own reads %q, want sub", got)
		}
	})
	if got := testGetenv(t)(key); got != "set" {
		t.Errorf("after the subtest the test reads %q, want set", got)
	}
	if v, ok := os.LookupEnv(key); ok {
		t.Errorf("the process's environment has %s=%q", key, v)
	}
	// What the command reads: rollbox's config through cliEnv.getenv.
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-setenv")
	if c := readConfig(testGetenv(t)); c.owner != "rollbox-test-setenv" {
		t.Errorf("the command's owner is %q", c.owner)
	}
}
