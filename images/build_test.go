package images

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBuildIsContentAddressedAndASecondBuildIsANoop(t *testing.T) {
	src, err := FindSource()
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	tgt := Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"}
	var progress bytes.Buffer
	b := &Builder{SourceDir: src, CacheDir: cache, Progress: &progress}
	p1, err := b.Build(context.Background(), tgt)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "building images/guest") {
		t.Errorf("no progress line for a real build: %q", progress.String())
	}
	if st, err := os.Stat(p1); err != nil || st.Size() == 0 || st.Mode()&0o111 == 0 {
		t.Fatalf("built program %s: %v %v", p1, st, err)
	}
	// A second builder (another process) over the same cache builds nothing.
	progress.Reset()
	b2 := &Builder{SourceDir: src, CacheDir: cache, Progress: &progress}
	p2, err := b2.Build(context.Background(), tgt)
	if err != nil || p2 != p1 || progress.Len() != 0 {
		t.Fatalf("second build: %s %v progress %q, want %s and no build", p2, err, progress.String(), p1)
	}
	// The name carries the content hash: another target is another file.
	p3, err := b2.Build(context.Background(), Target{Package: "images/guest", GOOS: "linux", GOARCH: "arm64", Name: "guest"})
	if err != nil || p3 == p1 || filepath.Dir(p3) == filepath.Dir(p1) {
		t.Fatalf("arm64 build: %s %v", p3, err)
	}
}

func TestBuildWithoutSourceSaysHowToFixIt(t *testing.T) {
	b := &Builder{CacheDir: t.TempDir()}
	_, err := b.Build(context.Background(), Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"})
	if !errors.Is(err, ErrNoSource) || !strings.Contains(err.Error(), "ROLLBOX_SRC") {
		t.Fatalf("err = %v", err)
	}
}

func TestASourceDirWithoutOurGoModIsRefused(t *testing.T) {
	b := &Builder{SourceDir: t.TempDir(), CacheDir: t.TempDir()}
	_, err := b.Build(context.Background(), Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"})
	if !errors.Is(err, ErrNoSource) || !strings.Contains(err.Error(), "holds no go.mod") {
		t.Fatalf("a directory without our go.mod was accepted: %v", err)
	}
}
