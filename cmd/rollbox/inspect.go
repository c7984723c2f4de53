package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/inspect"
)

func newInspectCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect TRAJECTORY.json | --serve DIR",
		Short: "Show a trajectory in the terminal, or serve a run's episodes as a web page",
		Long: `Show one trajectory in the terminal (model turns, tool calls with their
outputs, errors and truncations, context events, the reward and its
components), or with --serve DIR serve the episodes of a run (a rollbox run
--out directory, a rollbox serve --data directory, or an episodes/ directory)
as a web page embedded in the binary, with filters by run, task, reward, end
reason and tool error kind.`,
		Example: `  rollbox inspect out/<rollout id>/episodes/<episode id>.json
  rollbox inspect --serve out/<rollout id>`,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	serve := fs.String("serve", "", "serve a web page of the episodes in `DIR` (a run's out dir or its episodes/)")
	addr := fs.String("addr", "127.0.0.1:7071", "`HOST:PORT` for --serve")
	lines := fs.Int("lines", 12, "lines of each output to show (head and tail); 0 shows all")
	color := fs.String("color", "auto", "colour: auto (on a terminal), always or never")
	cmd.RunE = func(cmd *cobra.Command, pos []string) error {
		ctx := cmd.Context()
		if *serve != "" {
			if len(pos) > 0 {
				return usagef("--serve DIR takes no trajectory file (got %v)", pos)
			}
			return serveInspect(ctx, env, *serve, *addr)
		}
		if len(pos) != 1 {
			return usagef("want one trajectory file: rollbox inspect TRAJECTORY.json, or rollbox inspect --serve DIR")
		}
		if *lines < 0 {
			return usagef("--lines %d is negative", *lines)
		}
		var useColor bool
		switch *color {
		case "auto":
			useColor = env.cfg.colorOutput(env.stdout)
		case "always":
			useColor = true
		case "never":
		default:
			return usagef("--color %q is not one of auto, always, never", *color)
		}
		t, err := trajectory.Read(pos[0])
		if err != nil {
			return usagef("%v", err)
		}
		inspect.Render(env.stdout, t, inspect.Options{Color: useColor, Lines: *lines})
		return nil
	}
	return cmd
}

func serveInspect(ctx context.Context, env *cliEnv, dir, addr string) error {
	srv, err := inspect.NewServer(dir)
	if err != nil {
		return usagef("--serve: %v", err)
	}
	list, err := srv.Load()
	if err != nil {
		return usagef("--serve: %v", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return usagef("--addr: %v", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(env.stderr, "rollbox inspect: %d episode(s) of %d run(s) from %s at http://%s/ (Ctrl-C stops)\n", list.Total, len(list.Runs), list.Dir, ln.Addr())
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
