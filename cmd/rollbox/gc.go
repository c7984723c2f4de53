package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/rollbox/rollbox/sandbox/docker"
)

// runGC is `rollbox gc [--owner NAME]`: it removes every container labelled
// with the owner, what a crashed rollbox left behind. Running it twice is
// harmless.
func runGC(ctx context.Context, env *cliEnv, args []string) error {
	fs := flag.NewFlagSet("gc", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	owner := fs.String("owner", dockerOwner(), "remove the containers whose rollbox.owner label is this")
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("gc takes no arguments")
	}
	cli, err := docker.NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	n, err := docker.Cleanup(ctx, cli, *owner)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "removed %d containers of owner %q\n", n, *owner)
	return nil
}
