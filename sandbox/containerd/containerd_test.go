package containerd_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
	"github.com/rollbox/rollbox/sandbox/docker"
	"github.com/rollbox/rollbox/sandbox/sandboxtest"
)

// testOwner labels every container these tests make; TestMain removes them
// all at the end, whatever happened.
var testOwner = fmt.Sprintf("rollbox-cdtest-%d", os.Getpid())

var env struct {
	backend *containerd.Backend
	guest   string
	skip    string
}

func TestMain(m *testing.M) {
	code := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		guest, err := images.NewBuilder(os.Stderr).Build(ctx, images.Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"})
		if err != nil {
			env.skip = "building the guest agent: " + err.Error()
			return m.Run()
		}
		env.guest = guest
		b, err := containerd.New(ctx, containerd.Options{GuestPath: guest, Owner: testOwner})
		if err != nil {
			env.skip = err.Error()
			return m.Run()
		}
		defer b.Close()
		if err := importRecipe(ctx, b, "base"); err != nil {
			env.skip = "importing the base image: " + err.Error()
			return m.Run()
		}
		env.backend = b
		defer func() {
			if n, err := containerd.Cleanup(context.Background(), b.Client(), testOwner); err != nil || n > 0 {
				fmt.Fprintf(os.Stderr, "cleanup: removed %d leftover containers, err %v\n", n, err)
			}
		}()
		return m.Run()
	}()
	os.Exit(code)
}

// importRecipe builds a recipe with Docker and imports it into containerd,
// as `rollbox images build` does.
func importRecipe(ctx context.Context, b *containerd.Backend, name string) error {
	cli, err := docker.NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	img, err := docker.BuildImage(ctx, cli, name, os.Stderr)
	if err != nil {
		return err
	}
	_, hash, _ := strings.Cut(img.Ref, ":")
	_, err = containerd.ImportRecipe(ctx, b.Client(), name, hash, func(refs []string) (io.ReadCloser, error) {
		return cli.ImageSave(ctx, refs)
	})
	return err
}

// need returns the backend, or skips (fails under CI=true) with the reason
// containerd is not usable.
func need(t testing.TB) *containerd.Backend {
	t.Helper()
	if env.backend == nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("containerd required under CI=true: %s", env.skip)
		}
		t.Skipf("no containerd: %s", env.skip)
	}
	return env.backend
}

// newBackend is a backend of its own with opts (the owner is the tests',
// the guest too unless opts names one), closed at the end of the test. Its containers carry the
// label labelBackend with the test's name (ownContainers lists them).
func newBackend(t testing.TB, opts containerd.Options) *containerd.Backend {
	t.Helper()
	need(t)
	if opts.GuestPath == "" {
		opts.GuestPath = env.guest
	}
	opts.Owner = testOwner
	opts.Labels = map[string]string{labelBackend: fmt.Sprintf("%s-%d", t.Name(), os.Getpid())}
	b, err := containerd.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

const labelBackend = "rollbox.test.backend"

// ownContainers counts the containers of a backend newBackend made.
func ownContainers(t testing.TB, b *containerd.Backend, name string) int {
	t.Helper()
	list, err := b.Client().Containers(context.Background(), fmt.Sprintf("labels.%q==%q", labelBackend, fmt.Sprintf("%s-%d", name, os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// remains lists what is left of a closed sandbox on the host: the
// container, its lease, its snapshot, and any mount naming it.
func remains(t *testing.T, info sandbox.Info) []string {
	b := need(t)
	ctx := context.Background()
	var left []string
	if _, err := b.Client().LoadContainer(ctx, info.ID); err == nil {
		left = append(left, "container "+info.ID)
	}
	ls, err := b.Client().LeasesService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if strings.Contains(l.ID, info.ID) {
			left = append(left, "lease "+l.ID)
		}
	}
	b.Client().SnapshotService(containerd.Snapshotter).Walk(ctx, func(_ context.Context, si snapshots.Info) error {
		if strings.Contains(si.Name, info.ID) {
			left = append(left, "snapshot "+si.Name)
		}
		return nil
	})
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mounts), "\n") {
			if strings.Contains(line, info.ID) {
				left = append(left, "mount "+line)
			}
		}
	}
	return left
}

func TestConformance(t *testing.T) {
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			b := need(t)
			sandboxtest.Run(t, b, sandboxtest.Options{
				Spec:    sandbox.Spec{Image: "base", Runtime: rt},
				Remains: remains,
			})
		})
	}
}
