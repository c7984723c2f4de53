package docker_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
	"github.com/rollbox/rollbox/sandbox/sandboxtest"
)

// testOwner labels every container these tests make; TestMain removes them
// all at the end, whatever happened.
var testOwner = fmt.Sprintf("rollbox-test-%d", os.Getpid())

// env is what the tests share: a backend on the real engine, or the reason
// there is none.
var env struct {
	backend *docker.Backend
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
		b, err := docker.New(ctx, docker.Options{GuestPath: guest, Owner: testOwner})
		if err != nil {
			env.skip = err.Error()
			return m.Run()
		}
		env.backend = b
		defer b.Close()
		if _, err := docker.BuildImage(ctx, b.Client(), "base", os.Stderr); err != nil {
			env.skip = "building the base image: " + err.Error()
			env.backend = nil
			return m.Run()
		}
		defer func() {
			removeTinyImages(context.Background())
			if n, err := docker.Cleanup(context.Background(), b.Client(), testOwner); err != nil || n > 0 {
				fmt.Fprintf(os.Stderr, "cleanup: removed %d leftover containers, err %v\n", n, err)
			}
		}()
		return m.Run()
	}()
	os.Exit(code)
}

// need returns the backend, or skips (fails under CI=true) with the reason
// the real engine is not usable.
func need(t testing.TB) *docker.Backend {
	t.Helper()
	if env.backend == nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("docker engine required under CI=true: %s", env.skip)
		}
		t.Skipf("no docker engine: %s", env.skip)
	}
	return env.backend
}

// remains lists what is left of a closed sandbox on the host: the container
// (by id or label) and any mount or temp dir naming it.
func remains(t *testing.T, info sandbox.Info) []string {
	b := need(t)
	ctx := context.Background()
	var left []string
	if _, err := b.Client().ContainerInspect(ctx, info.ID); err == nil {
		left = append(left, "container "+info.ID)
	}
	list, err := b.Client().ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("id", info.ID))})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		left = append(left, "listed container "+c.ID[:12])
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mounts), "\n") {
			if strings.Contains(line, info.ID) {
				left = append(left, "mount "+line)
			}
		}
	}
	if entries, err := os.ReadDir(os.TempDir()); err == nil {
		for _, e := range entries {
			if strings.Contains(e.Name(), info.ID) {
				left = append(left, "temp "+e.Name())
			}
		}
	}
	return left
}

func TestConformance(t *testing.T) {
	t.Parallel() // beside the other conformance runs: their sandboxes are their own
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			b := need(t)
			sandboxtest.Run(t, b, sandboxtest.Options{
				Spec:    sandbox.Spec{Image: "base", Runtime: rt},
				Remains: remains,
			})
		})
	}
}
