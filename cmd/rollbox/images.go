package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// runImages is `rollbox images build [NAME...] | list`.
func runImages(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 {
		return usagef("usage: rollbox images build [NAME...] | list (recipes: %s)", strings.Join(images.RecipeNames(), ", "))
	}
	switch args[0] {
	case "build":
		return imagesBuild(ctx, env, args[1:])
	case "list":
		return imagesList(ctx, env, args[1:])
	}
	return usagef("unknown images subcommand %q: want build or list", args[0])
}

func imagesBuild(ctx context.Context, env *cliEnv, args []string) error {
	fs := flag.NewFlagSet("images build", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	names := fs.Args()
	if len(names) == 0 {
		names = append([]string{"wasm", "guest"}, images.RecipeNames()...)
	}
	var recipes []string
	for _, n := range names {
		switch {
		case n == "wasm":
			if err := buildWASMGuests(ctx, env); err != nil {
				return err
			}
		case n == "guest":
			start := time.Now()
			p, err := env.cfg.builder(env.stderr).Build(ctx, guestTarget)
			if err != nil {
				return err
			}
			fmt.Fprintf(env.stdout, "guest\t%s\tready in %v\n", p, time.Since(start).Round(100*time.Millisecond))
		case images.IsRecipe(n):
			recipes = append(recipes, n)
		default:
			return usagef("no image %q (container recipes: %s; also wasm, guest)", n, strings.Join(images.RecipeNames(), ", "))
		}
	}
	if len(recipes) == 0 {
		return nil
	}
	names = recipes
	cli, err := docker.NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	for _, n := range names {
		img, err := docker.BuildImage(ctx, cli, n, env.stderr)
		if err != nil {
			return err
		}
		if img.Built {
			fmt.Fprintf(env.stdout, "%s\t%s\tbuilt in %v\n", img.Ref, img.ID, img.Duration.Round(100*time.Millisecond))
		} else {
			fmt.Fprintf(env.stdout, "%s\t%s\tup to date\n", img.Ref, img.ID)
		}
	}
	return nil
}

// buildWASMGuests builds and compiles the WASI guest programs now rather
// than on first use.
func buildWASMGuests(ctx context.Context, env *cliEnv) error {
	start := time.Now()
	be, err := openWASM(ctx, env.stderr, env.cfg)
	if err != nil {
		return err
	}
	defer be.Close()
	if err := be.Warm(ctx, "python", "js"); err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "wasm\tpython, js\tready in %v\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

func imagesList(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) > 0 {
		return usagef("images list takes no arguments")
	}
	cli, err := docker.NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	list, err := docker.ListImages(ctx, cli)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TAGS\tID\tSIZE\tCREATED")
	for _, im := range list {
		fmt.Fprintf(tw, "%s\t%.19s\t%d MB\t%s\n", strings.Join(im.RepoTags, ","), im.ID, im.Size>>20,
			time.Unix(im.Created, 0).UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}
