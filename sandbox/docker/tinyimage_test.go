package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/sandboxtest"
)

// Images as `docker import` makes them from a bare rootfs: busybox-static
// and its applets, and a /tmp that is 0755 or absent. Built once per test
// binary, tagged with the test owner, removed by TestMain.
var tiny struct {
	once sync.Once
	refs map[string]string // kind -> docker:NAME:TAG
	err  error
}

// tinyImage returns the spec image ("docker:...") of a tiny image of kind
// "tmp0755" (its /tmp is 0755 and its /work 0500, root's) or "notmp" (it
// has neither).
func tinyImage(t *testing.T, kind string) string {
	t.Helper()
	b := need(t)
	tiny.once.Do(func() {
		tiny.refs = map[string]string{}
		out, err := exec.Command("dpkg", "-L", "busybox-static").Output()
		if err != nil {
			tiny.err = fmt.Errorf("busybox-static is needed (apt-get install busybox-static): %v", err)
			return
		}
		bb := ""
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasSuffix(l, "/bin/busybox") {
				bb = l
			}
		}
		bin, err := os.ReadFile(bb)
		if err != nil {
			tiny.err = fmt.Errorf("busybox-static's binary %q: %v", bb, err)
			return
		}
		list, err := exec.Command(bb, "--list-full").Output()
		if err != nil {
			tiny.err = err
			return
		}
		for _, kind := range []string{"tmp0755", "notmp"} {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			dirs := []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc"}
			for _, d := range dirs {
				tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "./" + d + "/", Mode: 0o755, ModTime: time.Unix(0, 0)})
			}
			if kind == "tmp0755" {
				// And a workdir its owner (root) may not even write.
				tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "./tmp/", Mode: 0o755, ModTime: time.Unix(0, 0)})
				tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "./work/", Mode: 0o500, ModTime: time.Unix(0, 0)})
			}
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "./bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: time.Unix(0, 0)})
			tw.Write(bin)
			for _, a := range strings.Fields(string(list)) {
				if a != "bin/busybox" {
					tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "./" + a, Linkname: "/bin/busybox", Mode: 0o777, ModTime: time.Unix(0, 0)})
				}
			}
			tw.Close()
			ref := "rollbox-test/" + kind + ":" + testOwner
			rc, err := b.Client().ImageImport(context.Background(), image.ImportSource{Source: &buf, SourceName: "-"}, ref,
				image.ImportOptions{Changes: []string{"ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}})
			if err != nil {
				tiny.err = err
				return
			}
			io.Copy(io.Discard, rc)
			rc.Close()
			tiny.refs[kind] = "docker:" + ref
		}
	})
	if tiny.err != nil {
		t.Fatalf("building the tiny images: %v", tiny.err)
	}
	return tiny.refs[kind]
}

// removeTinyImages is TestMain's: the images this binary imported.
func removeTinyImages(ctx context.Context) {
	if env.backend == nil {
		return
	}
	for _, ref := range tiny.refs {
		env.backend.Client().ImageRemove(ctx, strings.TrimPrefix(ref, "docker:"), image.RemoveOptions{Force: true})
	}
}

// An image's /tmp is 0755 or missing (any `docker import`ed or scratch
// image): /tmp is still a 1777 tmpfs and the workdir the commands' own, so
// the conformance cases that write /tmp and the workdir (by commands, file
// requests and forks) pass on it. Only those run here (ImageVariant): what
// the image changes is its directories, and the rest of the suite ran on
// runc with the base image (TestConformance). Without the guest's fix of
// the roots' modes (fixRootMode) or with /tmp's tmpfs root's, these cases
// fail on tmp0755: the workdir 0500 and /tmp 0755 are not writable.
func TestConformanceOnImagesWithoutAUsableTmp(t *testing.T) {
	t.Parallel() // beside the other conformance runs: their sandboxes are their own
	for _, kind := range []string{"tmp0755", "notmp"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := need(t)
			sandboxtest.Run(t, b, sandboxtest.Options{
				Spec:         sandbox.Spec{Image: tinyImage(t, kind), Runtime: sandbox.RuntimeRunc},
				Remains:      remains,
				ImageVariant: true,
			})
		})
	}
}

// The same on both runtimes, directly: the mode of /tmp and of the workdir,
// and a command and a file request writing there.
func TestTmpIsStickyAndWorldWritableWhateverTheImage(t *testing.T) {
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		for _, img := range []string{"base", "tmp0755", "notmp"} {
			t.Run(rt+"/"+img, func(t *testing.T) {
				t.Parallel()
				b := need(t)
				ref := img
				if img != "base" {
					ref = tinyImage(t, img)
				}
				ctx := context.Background()
				sb, err := b.Create(ctx, sandbox.Spec{Image: ref, Runtime: rt})
				if err != nil {
					t.Fatal(err)
				}
				defer sb.Close()
				res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: `stat -c '%a' /tmp; echo a > /tmp/a && mkdir -p /tmp/d/e && echo b > /work/b && mkdir /work/c && cat /tmp/a /work/b`})
				if err != nil {
					t.Fatal(err)
				}
				if got := string(res.Stdout); got != "1777\na\nb\n" || res.ExitCode != 0 {
					t.Errorf("/tmp's mode and writes: %q %q exit %d, want 1777 and both written", got, res.Stderr, res.ExitCode)
				}
				if err := sb.WriteFile(ctx, "/tmp/f", []byte("x"), 0o644); err != nil {
					t.Errorf("WriteFile in /tmp: %v", err)
				}
			})
		}
	}
}
