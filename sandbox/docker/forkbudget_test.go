package docker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// A fork through the guests costs a guest request per file and child, and
// the agent chooses how many files there are: a sandbox holding more than
// sandbox.MaxCopyEntries is refused at once as its own doing (ErrTooLarge,
// not infrastructure), with no child made and the parent untouched. Before,
// the fork went on copying file by file (6,000 empty files: many seconds,
// tens of thousands: minutes) while it held the episode.
func TestAForkOfMoreFilesThanTheBudgetIsRefusedAtOnce(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	owner := testOwner + "-forkbudget"
	b, err := docker.New(ctx, docker.Options{GuestPath: env.guest, Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	defer docker.Cleanup(context.Background(), b.Client(), owner)
	parent, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	n := sandbox.MaxCopyEntries + 1000
	cmd := fmt.Sprintf("mkdir -p /work/many && cd /work/many && seq 1 %d | xargs touch && chmod 000 /work/many/1 && ls | wc -l", n)
	if r, err := parent.Exec(ctx, sandbox.ExecRequest{Shell: cmd}); err != nil || r.ExitCode != 0 {
		t.Fatalf("make the files: %v %+v", err, r)
	}
	start := time.Now()
	kids, err := parent.(sandbox.Forker).Fork(ctx, 2)
	took := time.Since(start)
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	if err == nil {
		sandbox.CloseAll(kids)
		t.Fatalf("a fork of %d files succeeded, in %v", n, took)
	}
	if !errors.Is(err, sandbox.ErrTooLarge) || sandbox.IsInfra(err) {
		t.Errorf("want ErrTooLarge, not infrastructure: %v", err)
	}
	if took > 5*time.Second {
		t.Errorf("the refusal took %v: it must come before any copy", took)
	}
	list, err := b.Client().ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", "rollbox.owner="+owner))})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Errorf("%d containers of the owner after the refused fork, want the parent's alone", len(list))
	}
	// The parent is as it was: the file the walk opened for reading (if
	// it got there) has its mode back.
	fi, err := parent.ListFiles(ctx, "/work/many")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fi {
		if f.Name == "1" && f.Mode.Perm() != 0 {
			t.Errorf("/work/many/1 has mode %v after the fork, want 0", f.Mode.Perm())
		}
	}
}
