package docker_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// A create whose context ends while the engine makes the container (a warm
// pool closing, a cancelled episode) must not leave the container behind.
func TestACreateCancelledMidwayLeavesNoContainer(t *testing.T) {
	need(t)
	owner := fmt.Sprintf("rollbox-test-cancel-%d", os.Getpid())
	b, err := docker.New(context.Background(), docker.Options{GuestPath: env.guest, Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	defer docker.Cleanup(context.Background(), b.Client(), owner)
	for i := range 30 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%15)*4*time.Millisecond)
		sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
		cancel()
		if err == nil {
			sb.Close()
		}
	}
	list, err := b.Client().ContainerList(context.Background(), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", docker.LabelOwner+"="+owner))})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		t.Errorf("left behind: %s %s (%s)", c.ID[:12], c.State, c.Status)
	}
}
