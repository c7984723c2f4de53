package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// A Dockerfile build through the API: the context is sent, RUN has no
// network, a base image that is not local is not pulled, and a directory
// of the image comes out as a tar without running anything.
func TestBuildDockerfileWithoutNetwork(t *testing.T) {
	b := need(t)
	cli := b.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "sub", "x.txt"), []byte("x\n"), 0o644)
	tag := "rollbox-test-dockerfile:" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))[:20]
	t.Cleanup(func() {
		cli.ImageRemove(context.Background(), tag, image.RemoveOptions{Force: true, PruneChildren: true})
	})
	var progress bytes.Buffer
	info, err := docker.BuildDockerfile(ctx, cli, docker.DockerfileBuild{ContextDir: dir, Tag: tag, Progress: &progress,
		Dockerfile: "FROM rollbox/base:latest\nWORKDIR /srv\nCOPY . /srv/\nRUN test -f /srv/hello.txt && ! test -e /srv/.rollbox.Dockerfile && ! test -e /srv/.dockerignore\n"})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if info.WorkingDir != "/srv" || info.ID == "" {
		t.Errorf("info %+v", info)
	}
	var buf bytes.Buffer
	if err := docker.CopyImageDir(ctx, cli, tag, "/srv", &buf); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "hello.txt sub/ sub/x.txt" {
		t.Errorf("the image's /srv as a tar: %q", names)
	}
	if err := docker.CopyImageDir(ctx, cli, tag, "/nowhere", io.Discard); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a missing directory: %v", err)
	}

	// No network for RUN: a connection out fails the build.
	_, err = docker.BuildDockerfile(ctx, cli, docker.DockerfileBuild{Tag: tag + "-net",
		Dockerfile: "FROM rollbox/base:latest\nRUN wget -q -T 3 -O /dev/null http://1.1.1.1/ || nc -w 3 1.1.1.1 80 </dev/null\n"})
	if err == nil {
		cli.ImageRemove(context.Background(), tag+"-net", image.RemoveOptions{Force: true})
		t.Errorf("a RUN step reached the network")
	}
	// A base image the engine does not have is not pulled.
	_, err = docker.BuildDockerfile(ctx, cli, docker.DockerfileBuild{Tag: tag + "-missing", Dockerfile: "FROM rollbox-test/no-such-image:1\n"})
	if err == nil || !strings.Contains(err.Error(), "no-such-image") {
		t.Errorf("a missing base image: %v", err)
	}
	if _, err := docker.InspectImage(ctx, cli, tag+"-missing"); !errors.Is(err, sandbox.ErrImageNotFound) {
		t.Errorf("inspect a missing image: %v", err)
	}
}
