package containerd

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/containerd/containerd/v2/client"
	refdocker "github.com/distribution/reference"

	rimages "github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
)

// ResolveImage maps a Spec's image to the name it has in containerd's image
// store: a recipe name ("base", "python"; empty means base) to
// docker.io/rollbox/NAME:latest (what `rollbox images build` imports),
// "docker:NAME:TAG" to NAME:TAG normalized as Docker names it.
func ResolveImage(image string) (string, error) {
	if image == "" {
		image = "base"
	}
	ref, ok := strings.CutPrefix(image, "docker:")
	if !ok {
		if !rimages.IsRecipe(image) {
			return "", &sandbox.FieldError{Field: "image", Message: fmt.Sprintf("%q is not a recipe (%s) or docker:NAME:TAG", image, strings.Join(rimages.RecipeNames(), ", "))}
		}
		ref = "rollbox/" + image + ":latest"
	}
	named, err := refdocker.ParseDockerRef(ref)
	if err != nil {
		return "", &sandbox.FieldError{Field: "image", Message: fmt.Sprintf("%q: %v", image, err)}
	}
	return named.String(), nil
}

// image finds a Spec's image in containerd's store, unpacked into the
// snapshotter (once per process and image), and its digest: the image
// config's, which is also what Docker calls the image ID, so a trajectory
// names the same image on either engine.
func (b *Backend) image(ctx context.Context, image string) (client.Image, string, string, error) {
	ref, err := ResolveImage(image)
	if err != nil {
		return nil, "", "", err
	}
	img, err := b.cli.GetImage(ctx, ref)
	if err != nil {
		if isNotFound(err) {
			return nil, "", "", imageNotFound(image, ref)
		}
		return nil, "", "", translate("image "+ref, err)
	}
	cfg, err := img.Config(ctx)
	if err != nil {
		return nil, "", "", translate("image config of "+ref, err)
	}
	digest := cfg.Digest.String()
	b.mu.Lock()
	done := b.unpacked[digest]
	b.mu.Unlock()
	if !done {
		ok, err := img.IsUnpacked(ctx, Snapshotter)
		if err == nil && !ok {
			err = img.Unpack(ctx, Snapshotter)
		}
		if err != nil {
			return nil, "", "", translate("unpack image "+ref, err)
		}
		b.mu.Lock()
		b.unpacked[digest] = true
		b.mu.Unlock()
	}
	return img, ref, digest, nil
}

// ImageID is the digest Info reports for a Spec's image (see image).
func (b *Backend) ImageID(ctx context.Context, image string) (string, error) {
	_, _, digest, err := b.image(ctx, image)
	return digest, err
}

func imageNotFound(image, ref string) error {
	if strings.HasPrefix(image, "docker:") {
		return fmt.Errorf("image %s not found in containerd's namespace %q (nothing is pulled: import it first, e.g. `docker save %s | ctr -n %s images import -`): %w",
			ref, DefaultNamespace, strings.TrimPrefix(image, "docker:"), DefaultNamespace, sandbox.ErrImageNotFound)
	}
	if image == "" {
		image = "base"
	}
	return fmt.Errorf("image %s (recipe %q) not found in containerd: build and import it with `rollbox images build %s`: %w", ref, image, image, sandbox.ErrImageNotFound)
}

// Import reads an image archive (docker save's or an OCI layout tar) into
// containerd's content store, names its images as the archive does, and
// unpacks them into the snapshotter. It returns the names.
func Import(ctx context.Context, cli *client.Client, archive io.Reader) ([]string, error) {
	imgs, err := cli.Import(ctx, archive, client.WithAllPlatforms(false))
	if err != nil {
		return nil, translate("import image", err)
	}
	var names []string
	for _, im := range imgs {
		names = append(names, im.Name)
		if err := client.NewImage(cli, im).Unpack(ctx, Snapshotter); err != nil {
			return names, translate("unpack image "+im.Name, err)
		}
	}
	return names, nil
}

// ImageConfigDigest is the config digest of a named image in containerd's
// store ("" when there is none): what Docker calls the image ID.
func ImageConfigDigest(ctx context.Context, cli *client.Client, name string) (string, error) {
	img, err := cli.GetImage(ctx, name)
	if isNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", translate("image "+name, err)
	}
	cfg, err := img.Config(ctx)
	if err != nil {
		return "", translate("image config of "+name, err)
	}
	return cfg.Digest.String(), nil
}

// Tag names an existing image in containerd's store by another name too.
func Tag(ctx context.Context, cli *client.Client, from, to string) error {
	is := cli.ImageService()
	img, err := is.Get(ctx, from)
	if err != nil {
		return translate("image "+from, err)
	}
	img.Name = to
	if _, err := is.Create(ctx, img); err != nil {
		if !strings.Contains(err.Error(), "already exists") {
			return translate("tag "+to, err)
		}
		if _, err := is.Update(ctx, img, "target"); err != nil {
			return translate("tag "+to, err)
		}
	}
	return nil
}

// ImportedImage is a recipe image in containerd's store.
type ImportedImage struct {
	// Ref is the content-addressed name, docker.io/rollbox/NAME:HASH12.
	Ref string
	// ID is the image config's digest (Docker's image ID).
	ID string
	// Imported is false when the image was there already.
	Imported bool
}

// ImportRecipe puts the recipe image name, built elsewhere (by Docker, from
// the same recipe), into containerd's store: when its content-addressed
// name rollbox/NAME:HASH12 is not there yet, archive(refs) must return an
// image archive holding those refs (docker save's), which is imported;
// then rollbox/NAME:latest is pointed at it. An unchanged recipe costs one
// lookup.
func ImportRecipe(ctx context.Context, cli *client.Client, name, hash12 string, archive func(refs []string) (io.ReadCloser, error)) (ImportedImage, error) {
	short := "rollbox/" + name + ":" + hash12
	ref, err := ResolveImage("docker:" + short)
	if err != nil {
		return ImportedImage{}, err
	}
	latest, _ := ResolveImage(name)
	out := ImportedImage{Ref: ref}
	if out.ID, err = ImageConfigDigest(ctx, cli, ref); err != nil {
		return out, err
	}
	if out.ID == "" {
		r, err := archive([]string{short})
		if err != nil {
			return out, err
		}
		_, err = Import(ctx, cli, r)
		r.Close()
		if err != nil {
			return out, err
		}
		if out.ID, err = ImageConfigDigest(ctx, cli, ref); err != nil {
			return out, err
		}
		if out.ID == "" {
			return out, fmt.Errorf("import of %s: the archive did not hold it: %w", short, sandbox.ErrImageNotFound)
		}
		out.Imported = true
	}
	return out, Tag(ctx, cli, ref, latest)
}
