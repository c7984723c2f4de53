package replay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/replay"
	"github.com/rollbox/rollbox/sandbox"
)

// fakeImages maps image names (and "docker:ID") to ids.
type fakeImages map[string]string

func (f fakeImages) ImageID(_ context.Context, image string) (string, error) {
	if id, ok := f[image]; ok {
		return id, nil
	}
	return "", fmt.Errorf("image %s: %w", image, sandbox.ErrImageNotFound)
}

func TestTheRecordedImageIsFoundByDigestOrRefusedWithAReason(t *testing.T) {
	const rec, other = "sha256:aaaaaaaaaaaaaaaaaaaa", "sha256:bbbbbbbbbbbbbbbbbbbb"
	tests := []struct {
		name      string
		local     fakeImages
		use, note string
		err       error
		msg       string
	}{
		{"the name still points to the recorded image", fakeImages{"python": rec}, "python", "", nil, ""},
		{"the name moved but the recorded image is still here", fakeImages{"python": other, "docker:" + rec: rec}, "docker:" + rec, "now points to", nil, ""},
		{"the name is gone but the recorded image is here", fakeImages{"docker:" + rec: rec}, "docker:" + rec, "not tagged any more", nil, ""},
		{"the name moved and the recorded image is gone", fakeImages{"python": other}, "", "", replay.ErrImageChanged, "image python changed: the trajectory ran " + rec},
		{"nothing is here", fakeImages{}, "", "", replay.ErrImageMissing, "is not on this machine"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			use, note, err := replay.ResolveImage(context.Background(), tt.local, "python", rec)
			if tt.err != nil {
				if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.msg) {
					t.Fatalf("err = %v, want %v containing %q", err, tt.err, tt.msg)
				}
				return
			}
			if err != nil || use != tt.use || !strings.Contains(note, tt.note) {
				t.Errorf("= %q, %q, %v; want %q and a note with %q", use, note, err, tt.use, tt.note)
			}
		})
	}
}
