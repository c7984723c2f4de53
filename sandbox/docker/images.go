package docker

import (
	"fmt"
	"strings"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
)

// ResolveImage maps a Spec's image to a local image reference: a recipe
// name ("base", "python"; empty means base) to the tag its build moves
// (rollbox/NAME:latest), "docker:NAME:TAG" to NAME:TAG as is.
func ResolveImage(image string) (string, error) {
	if image == "" {
		image = "base"
	}
	if ref, ok := strings.CutPrefix(image, "docker:"); ok {
		return ref, nil
	}
	if !images.IsRecipe(image) {
		return "", &sandbox.FieldError{Field: "image", Message: fmt.Sprintf("%q is not a recipe (%s) or docker:NAME:TAG", image, strings.Join(images.RecipeNames(), ", "))}
	}
	return RecipeRepo(image) + ":latest", nil
}

// RecipeRepo is the repository a recipe's images are tagged in.
func RecipeRepo(name string) string { return "rollbox/" + name }

func imageNotFound(image, ref string) error {
	if strings.HasPrefix(image, "docker:") {
		return fmt.Errorf("image %s not found locally (nothing is pulled: load or build it first): %w", ref, sandbox.ErrImageNotFound)
	}
	if image == "" {
		image = "base"
	}
	return fmt.Errorf("image %s (recipe %q) not found: build it with `rollbox images build %s`: %w", ref, image, image, sandbox.ErrImageNotFound)
}
