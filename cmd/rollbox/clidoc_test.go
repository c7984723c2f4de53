package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/cli.md from the commands")

// cliReference renders every command's help: what `rollbox help CMD` prints.
func cliReference() string {
	var b strings.Builder
	b.WriteString("# Command-line reference\n\n")
	b.WriteString("Every command's help, as `rollbox help CMD` (or `rollbox CMD --help`) prints it. Generated from the\n")
	b.WriteString("commands by `go test ./cmd/rollbox -run CLIReference -update`; a test fails when it is stale.\n\n")
	b.WriteString("Exit status of every command: 0 ok, 1 a runtime failure, 2 bad input (nothing was started);\n")
	b.WriteString("`rollbox exec` passes its command's through (125 when the sandbox failed), an interrupted\n")
	b.WriteString("`rollbox run` exits 130 (SIGINT) or 143 (SIGTERM). Flags are GNU-style (`--name value` or\n")
	b.WriteString("`--name=value`) and may come anywhere among the arguments up to a `--`, except for `exec`, whose\n")
	b.WriteString("flags stop at the command. `rollbox completion bash|zsh|fish` prints a completion script.\n")
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || (c.Parent() != nil && c.Parent().Name() == "completion") {
			return
		}
		fmt.Fprintf(&b, "\n## %s\n\n", c.CommandPath())
		desc := c.Long
		if desc == "" {
			desc = c.Short + "."
		}
		fmt.Fprintf(&b, "%s\n\n```text\n%s```\n", strings.TrimSpace(desc), c.UsageString())
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	root := newRoot(&cliEnv{})
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	walk(root)
	return b.String()
}

func TestTheCLIReferenceIsUpToDate(t *testing.T) {
	const path = "../../docs/cli.md"
	want := cliReference()
	got, _ := os.ReadFile(path)
	if string(got) == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/cli.md is stale: run go test ./cmd/rollbox -run CLIReference -update")
}
