package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/internal/lease"
)

// Labels of recipe images.
const (
	LabelRecipe     = "rollbox.recipe"
	LabelRecipeHash = "rollbox.recipe.hash"
)

// BuiltImage is a recipe image present in the engine.
type BuiltImage struct {
	Recipe string
	// Ref is the content-addressed tag, rollbox/NAME:HASH12.
	Ref string
	// ID is the image ID (its digest).
	ID string
	// Built is false when the image already existed (a no-op build).
	Built    bool
	Size     int64
	Duration time.Duration
}

// BuildImage builds a recipe from images/recipes into a local image with no
// registry: the recipe's build.sh fills an empty rootfs directory (run as
// root on the host), which is streamed as a tar into the engine's image
// import. The image is tagged rollbox/NAME:HASH12 (the recipe's content
// hash) and rollbox/NAME:latest (what Spec.Image NAME resolves to). When the
// hash tag exists already nothing is built: only latest is pointed at it.
// progress gets the recipe's output.
func BuildImage(ctx context.Context, cli *client.Client, name string, progress io.Writer) (BuiltImage, error) {
	if progress == nil {
		progress = io.Discard
	}
	hash, err := images.RecipeHash(name)
	if err != nil {
		return BuiltImage{}, err
	}
	ref := RecipeRepo(name) + ":" + hash[:12]
	latest := RecipeRepo(name) + ":latest"
	out := BuiltImage{Recipe: name, Ref: ref}
	if in, err := cli.ImageInspect(ctx, ref); err == nil {
		if err := cli.ImageTag(ctx, ref, latest); err != nil {
			return out, translate("tag "+latest, err)
		}
		out.ID, out.Size = in.ID, in.Size
		return out, nil
	} else if !isNotFound(err) {
		return out, translate("inspect image "+ref, err)
	}

	start := time.Now()
	work, err := os.MkdirTemp("", buildDirPrefix+name+"-")
	if err != nil {
		return out, err
	}
	defer os.RemoveAll(work)
	// Held for the build: CleanupBuildDirs removes only directories whose
	// lock nobody holds, what a build killed midway left (a rootfs of
	// hundreds of MB).
	if lock, err := lease.LockDir(work); err == nil {
		defer lock.Close()
	}
	recipeDir, rootfs := filepath.Join(work, "recipe"), filepath.Join(work, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return out, err
	}
	fsys, err := images.Recipe(name)
	if err != nil {
		return out, err
	}
	if err := os.CopyFS(recipeDir, fsys); err != nil {
		return out, fmt.Errorf("recipe %s: %w", name, err)
	}
	fmt.Fprintf(progress, "rollbox: building image %s (recipe %s)\n", ref, name)
	cmd := exec.CommandContext(ctx, "sh", filepath.Join(recipeDir, "build.sh"), rootfs)
	cmd.Dir = recipeDir
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		return out, fmt.Errorf("recipe %s: build.sh: %w", name, err)
	}

	// tar the rootfs straight into the engine.
	tarCmd := exec.CommandContext(ctx, "tar", "--numeric-owner", "-C", rootfs, "-cf", "-", ".")
	var tarErr strings.Builder
	tarCmd.Stderr = &tarErr
	stream, err := tarCmd.StdoutPipe()
	if err != nil {
		return out, err
	}
	if err := tarCmd.Start(); err != nil {
		return out, fmt.Errorf("recipe %s: tar: %w", name, err)
	}
	rc, err := cli.ImageImport(ctx, image.ImportSource{Source: stream, SourceName: "-"}, ref, image.ImportOptions{
		Message: "rollbox recipe " + name,
		Changes: []string{
			"ENV PATH=" + defaultPath,
			"LABEL " + LabelRecipe + "=" + name,
			"LABEL " + LabelRecipeHash + "=" + hash,
		},
	})
	if err != nil {
		tarCmd.Process.Kill()
		tarCmd.Wait()
		return out, translate("import image "+ref, err)
	}
	importErr := drainJSONMessages(rc)
	rc.Close()
	if err := tarCmd.Wait(); err != nil {
		return out, fmt.Errorf("recipe %s: tar: %v: %s", name, err, strings.TrimSpace(tarErr.String()))
	}
	if importErr != nil {
		return out, fmt.Errorf("import image %s: %w", ref, importErr)
	}
	if err := cli.ImageTag(ctx, ref, latest); err != nil {
		return out, translate("tag "+latest, err)
	}
	in, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		return out, translate("inspect image "+ref, err)
	}
	out.ID, out.Size, out.Built, out.Duration = in.ID, in.Size, true, time.Since(start)
	return out, nil
}

// drainJSONMessages reads the engine's progress stream and returns the
// error it reports, if any.
func drainJSONMessages(r io.Reader) error {
	dec := json.NewDecoder(r)
	for {
		var m struct {
			Error       string `json:"error"`
			ErrorDetail *struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
	}
}

// ListImages lists the recipe images in the engine, newest first.
func ListImages(ctx context.Context, cli *client.Client) ([]image.Summary, error) {
	list, err := cli.ImageList(ctx, image.ListOptions{})
	if err != nil {
		return nil, translate("list images", err)
	}
	var out []image.Summary
	for _, im := range list {
		for _, t := range im.RepoTags {
			if strings.HasPrefix(t, "rollbox/") {
				out = append(out, im)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created > out[j].Created })
	return out, nil
}
