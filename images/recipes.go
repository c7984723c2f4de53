package images

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"sort"
)

// recipes holds images/recipes: one directory per container image, each
// with a build.sh that fills the rootfs directory given as $1.
//
//go:embed recipes
var recipes embed.FS

// RecipeNames lists the container image recipes, sorted.
func RecipeNames() []string {
	entries, _ := fs.ReadDir(recipes, "recipes")
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// IsRecipe reports whether name is a container image recipe.
func IsRecipe(name string) bool {
	if name == "" || name == "." || path.Base(name) != name {
		return false
	}
	st, err := fs.Stat(recipes, path.Join("recipes", name))
	return err == nil && st.IsDir()
}

// Recipe returns a recipe's files (build.sh at its root).
func Recipe(name string) (fs.FS, error) {
	if !IsRecipe(name) {
		return nil, fmt.Errorf("no image recipe %q (have %v)", name, RecipeNames())
	}
	return fs.Sub(recipes, path.Join("recipes", name))
}

// RecipeHash digests a recipe's files (names and contents): the image it
// builds is tagged with the first 12 hex digits, so an unchanged recipe is
// never built twice.
func RecipeHash(name string) (string, error) {
	fsys, err := Recipe(name)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "rollbox recipe %s\n", name)
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", p, len(data))
		h.Write(data)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
