package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/rollbox/rollbox/sandbox"
)

// Errors that stop a replay before anything runs.
var (
	// ErrImageMissing: neither the recorded image nor one of its name exists locally.
	ErrImageMissing = errors.New("the recorded image is missing")
	// ErrImageChanged: the image of that name exists, but it is not the
	// recorded one (its digest differs) and the recorded one is gone.
	ErrImageChanged = errors.New("the image changed since the recording")
)

// Images finds local images: the content id ("sha256:...") of a Spec's
// image name (a recipe, docker:NAME:TAG, or docker:sha256:ID), or an error
// wrapping sandbox.ErrImageNotFound. The docker backend is one.
type Images interface {
	ImageID(ctx context.Context, image string) (string, error)
}

// ResolveImage decides which image a replay runs, by digest: the image the
// recording ran (digest), found by its id even if its name now points
// elsewhere. image is the Spec's name for it. note says what was decided
// when it is worth saying.
//
// # Errors
//
// ErrImageChanged when image names another image and the recorded one is
// gone; ErrImageMissing when neither exists. Both say how to get it back.
func ResolveImage(ctx context.Context, imgs Images, image, digest string) (use, note string, err error) {
	name := image
	if name == "" {
		name = "base"
	}
	current, cerr := imgs.ImageID(ctx, image)
	if cerr != nil && !errors.Is(cerr, sandbox.ErrImageNotFound) {
		return "", "", cerr
	}
	if digest == "" { // the recorded sandbox never came up, or an old record
		if cerr != nil {
			return "", "", fmt.Errorf("image %s: %v: %w", name, cerr, ErrImageMissing)
		}
		return image, fmt.Sprintf("the trajectory recorded no image digest; using the local %s (%s)", name, short(current)), nil
	}
	if current == digest {
		return image, "", nil
	}
	if _, err := imgs.ImageID(ctx, "docker:"+digest); err == nil {
		if cerr != nil {
			return "docker:" + digest, fmt.Sprintf("%s is not tagged any more; running the recorded image %s by its digest", name, short(digest)), nil
		}
		return "docker:" + digest, fmt.Sprintf("%s now points to %s; running the recorded image %s by its digest", name, short(current), short(digest)), nil
	} else if !errors.Is(err, sandbox.ErrImageNotFound) {
		return "", "", err
	}
	hint := "load the image the recording ran (docker load) or rebuild it from the same recipe revision"
	if cerr != nil {
		return "", "", fmt.Errorf("image %s with digest %s is not on this machine (%v); %s: %w", name, digest, cerr, hint, ErrImageMissing)
	}
	return "", "", fmt.Errorf("image %s changed: the trajectory ran %s, the local %s is %s, and %s is not on this machine; %s: %w",
		name, digest, name, current, short(digest), hint, ErrImageChanged)
}

func short(digest string) string {
	const n = len("sha256:") + 12
	if len(digest) > n {
		return digest[:n]
	}
	return digest
}
