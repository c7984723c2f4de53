package docker

import (
	"errors"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/sandbox"
)

func TestResolveImage(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "rollbox/base:latest"},
		{"base", "rollbox/base:latest"},
		{"python", "rollbox/python:latest"},
		{"docker:debian:bookworm", "debian:bookworm"},
	} {
		if got, err := ResolveImage(tc.in); err != nil || got != tc.want {
			t.Errorf("ResolveImage(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := ResolveImage("nosuch"); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("unknown recipe: %v", err)
	}
}

func TestAMissingRecipeImageSaysHowToBuildIt(t *testing.T) {
	err := imageNotFound("python", "rollbox/python:latest")
	if !errors.Is(err, sandbox.ErrImageNotFound) || !strings.Contains(err.Error(), "rollbox images build python") {
		t.Errorf("err = %v", err)
	}
}
