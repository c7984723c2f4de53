package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// commandPaths lists every command of the tree but the root, as the words
// that name it (["images", "build"]).
func commandPaths(c *cobra.Command, prefix []string) [][]string {
	var out [][]string
	for _, sub := range c.Commands() {
		p := append(append([]string{}, prefix...), sub.Name())
		out = append(out, p)
		out = append(out, commandPaths(sub, p)...)
	}
	return out
}

func TestEveryCommandPrintsItsHelpOnStdoutAndExits0(t *testing.T) {
	root := newRoot(&cliEnv{})
	paths := commandPaths(root, nil)
	if len(paths) < 18 {
		t.Fatalf("only %d commands: %v", len(paths), paths)
	}
	for _, p := range append(paths, []string{}) {
		name := strings.Join(append([]string{"rollbox"}, p...), " ")
		for _, args := range [][]string{append(append([]string{}, p...), "--help"), append([]string{"help"}, p...), append(append([]string{}, p...), "-h")} {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, stdout, stderr := rollbox(t, args...)
				if code != exitOK || stderr != "" {
					t.Fatalf("exit %d, stderr %q; want 0 and nothing on stderr", code, stderr)
				}
				if !strings.Contains(stdout, "Usage:") || !strings.Contains(stdout, name) {
					t.Fatalf("stdout does not show the usage of %q:\n%s", name, stdout)
				}
			})
		}
	}
}

func TestTheGroupCommandsListTheirSubcommands(t *testing.T) {
	for _, tt := range []struct {
		cmd  string
		subs []string
	}{{"images", []string{"build", "list"}}, {"index", []string{"build", "info", "search"}}, {"audit", []string{"verify-log"}}} {
		for _, args := range [][]string{{tt.cmd, "--help"}, {"help", tt.cmd}} {
			code, stdout, _ := rollbox(t, args...)
			for _, s := range tt.subs {
				if code != exitOK || !regexp.MustCompile(`(?m)^  `+s+` `).MatchString(stdout) {
					t.Errorf("%v: exit %d, %q is not listed:\n%s", args, code, s, stdout)
				}
			}
		}
	}
	code, stdout, stderr := rollbox(t, "images")
	if code != exitOK || !strings.Contains(stdout, "build") || stderr != "" {
		t.Errorf("rollbox images alone: exit %d, stdout %q, stderr %q; want its help", code, stdout, stderr)
	}
}

func TestVersionAndCompletion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"-v"}, {"version"}} {
		code, stdout, stderr := rollbox(t, args...)
		if code != exitOK || !strings.HasPrefix(stdout, "rollbox "+version+" (go") || stderr != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		code, stdout, stderr := rollbox(t, "completion", shell)
		if code != exitOK || !strings.Contains(stdout, "rollbox") || len(stdout) < 1000 || stderr != "" {
			t.Errorf("completion %s: exit %d, %d bytes, stderr %q", shell, code, len(stdout), stderr)
		}
	}
	// The completion offers the subcommands and a command's flags.
	code, stdout, _ := rollbox(t, "__complete", "images", "")
	if code != exitOK || !strings.Contains(stdout, "build") || !strings.Contains(stdout, "list") {
		t.Errorf("completing `rollbox images `: exit %d\n%s", code, stdout)
	}
	code, stdout, _ = rollbox(t, "__complete", "run", "--con")
	if code != exitOK || !strings.Contains(stdout, "--concurrency") {
		t.Errorf("completing `rollbox run --con`: exit %d\n%s", code, stdout)
	}
}

func TestBadCommandLinesExit2AndSaySo(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"an unknown command", []string{"rnu"}, []string{`unknown command "rnu" for "rollbox"`, "run"}},
		{"an unknown subcommand", []string{"images", "biuld"}, []string{`unknown command "biuld" for "rollbox images"`, "did you mean build?"}},
		{"an unknown flag", []string{"run", "--tsks", "x"}, []string{"rollbox run: unknown flag: --tsks", "Run 'rollbox run --help' for usage."}},
		{"a single-dash long flag", []string{"run", "-tasks", "x"}, []string{"-tasks: long flags take two dashes: --tasks"}},
		{"a flag without its value", []string{"run", "--policy", "scripted:x", "--tasks"}, []string{"flag needs an argument: --tasks"}},
		{"a value that is not a number", []string{"run", "--group", "many"}, []string{`invalid argument "many" for "--group"`}},
		{"arguments a command does not take", []string{"serve", "extra"}, []string{"unexpected arguments: extra"}},
		{"an argument audit does not take", []string{"audit", "verfiy-log"}, []string{"unexpected arguments: verfiy-log"}},
		{"replay without a trajectory", []string{"replay"}, []string{"want one trajectory file"}},
		{"index info without a directory", []string{"index", "info"}, []string{"want one index directory"}},
		{"verify-log without a file", []string{"audit", "verify-log"}, []string{"verify-log takes the log's files"}},
		{"an export of nothing", []string{"export", "--from", filepath.Join(dir, "none")}, []string{"--from"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := rollbox(t, tt.args...)
			if code != exitBadInput || stdout != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 2 and nothing on stdout", code, stdout, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not say %q", stderr, w)
				}
			}
		})
	}
}

func TestIndexSearchTakesFlagsAfterTheQueryAndWordsAfterDashDash(t *testing.T) {
	dir := t.TempDir()
	corpus := filepath.Join(dir, "corpus.jsonl")
	os.WriteFile(corpus, []byte(`{"id": "a", "title": "http one", "text": "http servers"}
{"id": "b", "title": "http two", "text": "http clients"}
{"id": "c", "title": "http three", "text": "http proxies"}
{"id": "flags", "title": "flag parsing", "text": "the --k flag and the -v flag"}
`), 0o644)
	ix := filepath.Join(dir, "ix")
	if code, _, stderr := rollbox(t, "index", "build", "--corpus", corpus, "--out", ix); code != exitOK {
		t.Fatal(stderr)
	}
	// `--k 2` after the query is the flag, not the words "--k 2".
	code, stdout, stderr := rollbox(t, "index", "search", "--index", ix, "http", "--k", "2")
	if code != exitOK || !strings.HasPrefix(stdout, "2 of 3 matching") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want the 2 best of the 3 http documents", code, stdout, stderr)
	}
	code, stdout, _ = rollbox(t, "index", "search", "http", "-k", "1", "--index", ix)
	if code != exitOK || !strings.HasPrefix(stdout, "1 of 3 matching") {
		t.Fatalf("exit %d, stdout %q", code, stdout)
	}
	// After --, words are the query even when they look like flags.
	code, stdout, _ = rollbox(t, "index", "search", "--index", ix, "--", "--k", "flag")
	if code != exitOK || !strings.Contains(stdout, "flags") || strings.Contains(stdout, "http") {
		t.Fatalf("exit %d, stdout %q; want the document about flags", code, stdout)
	}
}

func TestExecRefusesTheDockerOnlyFlagsOnWASMAndLeavesTheCommandsFlagsAlone(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--image", "python", "--", "python", "-c", "print(1)"}, "--image python: the wasm backend has no images"},
		{[]string{"exec", "--backend", "wasm", "--runtime", "runsc", "--", "true"}, "--runtime runsc: the wasm backend has no OCI runtime"},
		{[]string{"exec", "--network", "bridge", "--", "true"}, "--network bridge: the wasm backend has no network"},
	} {
		code, stdout, stderr := rollbox(t, tt.args...)
		if code != exitBadInput || stdout != "" || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and %q", tt.args, code, stdout, stderr, tt.want)
		}
	}
	// Flags stop at the command: what follows is the command's, with or
	// without --.
	for _, args := range [][]string{{"exec", "echo", "--backend", "-v"}, {"exec", "--", "echo", "--backend", "-v"}} {
		code, stdout, stderr := rollbox(t, args...)
		if code != exitOK || stdout != "--backend -v\n" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// synonyms are names a flag must not take: the same thing has one name in
// every command.
var synonyms = map[string]string{
	"output": "out", "out-dir": "out", "dir": "out or data", "data-dir": "data", "listen": "addr", "address": "addr",
	"bind": "addr", "port": "addr", "json-out": "json", "format-json": "json", "oci-runtime": "runtime", "backend-name": "backend",
	"img": "image", "task-file": "tasks", "tasks-file": "tasks", "model": "policy", "verbose": "log-level",
}

func TestTheSameThingHasTheSameFlagNameEverywhere(t *testing.T) {
	root := newRoot(&cliEnv{})
	types := map[string]string{}
	where := map[string]string{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if want, ok := synonyms[f.Name]; ok {
				t.Errorf("%s --%s: call it --%s, as the other commands do", c.CommandPath(), f.Name, want)
			}
			typ := f.Value.Type()
			if prev, ok := types[f.Name]; ok && prev != typ {
				t.Errorf("--%s is a %s in %s but a %s in %s", f.Name, typ, c.CommandPath(), prev, where[f.Name])
			}
			types[f.Name], where[f.Name] = typ, c.CommandPath()
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	for name, typ := range map[string]string{"backend": "string", "runtime": "string", "image": "string", "out": "string",
		"data": "string", "addr": "string", "json": "bool", "tasks": "string", "policy": "string"} {
		if types[name] != typ {
			t.Errorf("--%s: %q, want a %s flag", name, types[name], typ)
		}
	}
}
