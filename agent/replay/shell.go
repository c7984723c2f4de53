package replay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/rollbox/rollbox/sandbox"
)

// Shell is a line-by-line shell over any sandbox (the WASM backend's, or a
// container's without a terminal): it reads a line from in, runs it with
// the sandbox's shell through Exec in the current directory, and writes its
// output. cd changes the directory for the next lines; exit, quit or the end
// of in leave. Each line is its own shell, so variables and background jobs
// do not carry over to the next.
func Shell(ctx context.Context, sb sandbox.Sandbox, in io.Reader, out io.Writer) error {
	info := sb.Info()
	cwd := info.Workdir
	fmt.Fprintf(out, "rollbox: a shell in %s (each line runs on its own; cd is kept; exit or Ctrl-D leaves)\n", info)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for {
		fmt.Fprintf(out, "sandbox:%s$ ", cwd)
		if !sc.Scan() {
			fmt.Fprintln(out)
			return sc.Err()
		}
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			continue
		case line == "exit" || line == "quit" || line == "logout":
			return nil
		case line == "cd" || strings.HasPrefix(line, "cd "):
			dir := strings.TrimSpace(strings.TrimPrefix(line, "cd"))
			if dir == "" {
				dir = info.Workdir
			}
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "cd " + dir + " && pwd", Workdir: cwd})
			if err != nil {
				return err
			}
			if res.ExitCode != 0 {
				out.Write(res.Stderr)
				continue
			}
			cwd = strings.TrimSpace(string(res.Stdout))
			continue
		}
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: line, Workdir: cwd})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		out.Write(res.Stdout)
		out.Write(res.Stderr)
		switch {
		case res.TimedOut:
			fmt.Fprintf(out, "[timed out after %v]\n", res.Duration.Round(1e6))
		case res.OOMKilled:
			fmt.Fprintln(out, "[killed: out of memory]")
		case res.ExitCode != 0:
			fmt.Fprintf(out, "[exit %d]\n", res.ExitCode)
		}
	}
}
