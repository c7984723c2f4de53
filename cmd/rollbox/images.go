package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// newImagesCmd is `rollbox images build [NAME...] | list`.
func newImagesCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "images",
		Short: "Build the sandbox images or list them",
		Long: `Build the sandbox images from the recipes in images/ (never a registry), or
list them. Container recipes: ` + strings.Join(images.RecipeNames(), ", ") + `; also wasm (the WASI
guests, built and compiled for the WASM backend) and guest (the static guest
agent every container runs as PID 1). An unchanged recipe is not rebuilt.`,
		RunE: groupRunE,
	}
	build := &cobra.Command{
		Use:   "build [NAME...]",
		Short: "Build images: " + strings.Join(append([]string{"wasm", "guest"}, images.RecipeNames()...), ", ") + " (default: all)",
		Example: `  rollbox images build wasm          # the WASM backend's guests (needs only Go)
  rollbox images build base python   # the container images (needs a Docker engine)`,
		ValidArgs: append([]string{"wasm", "guest"}, images.RecipeNames()...),
		RunE: func(cmd *cobra.Command, args []string) error {
			return imagesBuild(cmd.Context(), env, args)
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the container images the recipes built",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return imagesList(cmd.Context(), env)
		},
	}
	cmd.AddCommand(build, list)
	return cmd
}

func imagesBuild(ctx context.Context, env *cliEnv, args []string) error {
	names := args
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
	var built []docker.BuiltImage
	for _, n := range names {
		img, err := docker.BuildImage(ctx, cli, n, env.stderr)
		if err != nil {
			return err
		}
		built = append(built, img)
		if img.Built {
			fmt.Fprintf(env.stdout, "%s\t%s\tbuilt in %v\n", img.Ref, img.ID, img.Duration.Round(100*time.Millisecond))
		} else {
			fmt.Fprintf(env.stdout, "%s\t%s\tup to date\n", img.Ref, img.ID)
		}
	}
	// The same images in containerd's store, for --backend containerd.
	return importIntoContainerd(ctx, env.stdout, built, func(ctx context.Context, refs []string) (io.ReadCloser, error) {
		return cli.ImageSave(ctx, refs)
	})
}

// buildWASMGuests builds and compiles the WASI guest programs now rather
// than on first use.
func buildWASMGuests(ctx context.Context, env *cliEnv) error {
	start := time.Now()
	be, err := openBackend(ctx, sandbox.BackendWASM, env.stderr, backendOptions{cfg: env.cfg, warm: []string{"python", "js"}})
	if err != nil {
		return err
	}
	be.Close()
	fmt.Fprintf(env.stdout, "wasm\tpython, js\tready in %v\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

func imagesList(ctx context.Context, env *cliEnv) error {
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
