package docker

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/rollbox/rollbox/sandbox"
)

// DockerfileBuild is a `docker build` through the engine's API (the
// classic builder), with no network: RUN steps get only what the base
// image holds, and a base image missing locally is not pulled.
type DockerfileBuild struct {
	// ContextDir is the build context ("" for an empty one). Regular files,
	// directories and symbolic links are sent; the context's .dockerignore
	// is neither sent nor applied.
	ContextDir string
	// Dockerfile is the Dockerfile's text (it replaces any file of the
	// context).
	Dockerfile string
	// Tag names the image (NAME:TAG).
	Tag    string
	Labels map[string]string
	// Progress gets the builder's output.
	Progress io.Writer
	// MaxContextBytes bounds the context sent (default 1 GiB).
	MaxContextBytes int64
}

// ImageInfo is what an importer needs to know of an image.
type ImageInfo struct {
	ID         string
	WorkingDir string
	User       string
	Env        []string
}

// dockerfileName is the context entry the Dockerfile is sent as, named so
// it cannot collide with a file of the context.
const dockerfileName = ".rollbox.Dockerfile"

// BuildDockerfile builds b and returns the image's ID and configuration.
//
// # Errors
//
// The builder's own error (a failed RUN step, a base image that is not
// local) with the last lines of its output; sandbox.ErrEngineUnavailable
// when the engine cannot be reached.
func BuildDockerfile(ctx context.Context, cli *client.Client, b DockerfileBuild) (ImageInfo, error) {
	if b.Progress == nil {
		b.Progress = io.Discard
	}
	if b.MaxContextBytes <= 0 {
		b.MaxContextBytes = 1 << 30
	}
	pr, pw := io.Pipe()
	tarErr := make(chan error, 1)
	go func() {
		err := writeContext(pw, b)
		pw.CloseWithError(err)
		tarErr <- err
	}()
	resp, err := cli.ImageBuild(ctx, pr, build.ImageBuildOptions{
		Tags: []string{b.Tag}, Dockerfile: dockerfileName, Labels: b.Labels,
		Remove: true, ForceRemove: true, PullParent: false, NetworkMode: "none",
		Version: build.BuilderV1,
	})
	if err != nil {
		pr.CloseWithError(err)
		<-tarErr
		return ImageInfo{}, translate("build "+b.Tag, err)
	}
	buildErr := readBuildOutput(resp.Body, b.Progress)
	resp.Body.Close()
	pr.Close()
	if terr := <-tarErr; terr != nil && !errors.Is(terr, io.ErrClosedPipe) {
		return ImageInfo{}, fmt.Errorf("build %s: the context: %w", b.Tag, terr)
	}
	if buildErr != nil {
		return ImageInfo{}, fmt.Errorf("build %s: %w", b.Tag, buildErr)
	}
	return InspectImage(ctx, cli, b.Tag)
}

// writeContext streams the build context as a tar.
func writeContext(w io.Writer, b DockerfileBuild) error {
	tw := tar.NewWriter(w)
	var total int64
	if b.ContextDir != "" {
		err := filepath.WalkDir(b.ContextDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(b.ContextDir, p)
			if err != nil || rel == "." || rel == ".dockerignore" || rel == dockerfileName {
				return err // ours are written below
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			link := ""
			switch {
			case d.Type()&fs.ModeSymlink != 0:
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			case d.IsDir(), d.Type().IsRegular():
			default:
				return nil // devices, sockets, pipes: not context
			}
			hdr, err := tar.FileInfoHeader(info, link)
			if err != nil {
				return err
			}
			hdr.Name = filepath.ToSlash(rel)
			if d.IsDir() {
				hdr.Name += "/"
			}
			hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
			hdr.ModTime = time.Unix(0, 0)
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if !d.Type().IsRegular() {
				return nil
			}
			total += info.Size()
			if total > b.MaxContextBytes {
				return fmt.Errorf("the build context %s is larger than %d bytes", b.ContextDir, b.MaxContextBytes)
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		})
		if err != nil {
			return err
		}
	}
	// The engine removes the files its .dockerignore names of these two
	// before the build, so COPY . does not copy our Dockerfile.
	for _, f := range []struct{ name, data string }{
		{dockerfileName, b.Dockerfile}, {".dockerignore", dockerfileName + "\n.dockerignore\n"},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// readBuildOutput copies the builder's stream to progress and returns its
// error, with the last lines of output before it.
func readBuildOutput(r io.Reader, progress io.Writer) error {
	dec := json.NewDecoder(bufio.NewReader(r))
	var tail []string
	for {
		var m struct {
			Stream      string `json:"stream"`
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
		if m.Stream != "" {
			io.WriteString(progress, m.Stream)
			for _, l := range strings.Split(strings.TrimRight(m.Stream, "\n"), "\n") {
				if strings.TrimSpace(l) != "" {
					tail = append(tail, strings.TrimSpace(l))
				}
			}
			if len(tail) > 6 {
				tail = tail[len(tail)-6:]
			}
		}
		if m.Error != "" {
			msg := strings.TrimSpace(m.Error)
			if len(tail) > 0 {
				msg += " (after: " + strings.Join(tail, " | ") + ")"
			}
			return errors.New(msg)
		}
	}
}

// InspectImage returns an image's ID and configuration.
//
// # Errors
//
// sandbox.ErrImageNotFound when the engine has no such image.
func InspectImage(ctx context.Context, cli *client.Client, ref string) (ImageInfo, error) {
	in, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		if isNotFound(err) {
			return ImageInfo{}, fmt.Errorf("image %s: %w", ref, sandbox.ErrImageNotFound)
		}
		return ImageInfo{}, translate("inspect image "+ref, err)
	}
	out := ImageInfo{ID: in.ID}
	if in.Config != nil {
		out.WorkingDir, out.User, out.Env = in.Config.WorkingDir, in.Config.User, in.Config.Env
	}
	return out, nil
}

// CopyImageDir writes the content of directory dir of an image as a tar to
// w (entries relative to dir), without running anything: a container is
// created (never started), copied from and removed.
//
// # Errors
//
// sandbox.ErrNotFound when the image has no such directory.
func CopyImageDir(ctx context.Context, cli *client.Client, ref, dir string, w io.Writer) error {
	created, err := cli.ContainerCreate(ctx, &container.Config{Image: ref, Entrypoint: []string{"/nonexistent"},
		Labels: map[string]string{LabelOwner: "rollbox-import"}}, &container.HostConfig{NetworkMode: "none"}, nil, nil, "")
	if err != nil {
		return translate("create a container of "+ref, err)
	}
	defer cli.ContainerRemove(context.WithoutCancel(ctx), created.ID, container.RemoveOptions{Force: true})
	rc, _, err := cli.CopyFromContainer(ctx, created.ID, strings.TrimSuffix(dir, "/")+"/.")
	if err != nil {
		if isNotFound(err) {
			return fmt.Errorf("%s in %s: %w", dir, ref, sandbox.ErrNotFound)
		}
		return translate("copy "+dir+" out of "+ref, err)
	}
	defer rc.Close()
	// The engine names entries "./..." (dir/. was asked for): strip that.
	tr := tar.NewReader(rc)
	tw := tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("copy %s out of %s: %w", dir, ref, err)
		}
		name := strings.TrimPrefix(strings.TrimPrefix(hdr.Name, "./"), ".")
		if name == "" || name == "/" {
			continue
		}
		hdr.Name = name
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	return tw.Close()
}

// Ping checks that the engine answers (within 10 s).
//
// # Errors
//
// sandbox.ErrEngineUnavailable, with a hint, when it does not.
func Ping(ctx context.Context, cli *client.Client) error { return ping(ctx, cli) }
