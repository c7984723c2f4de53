package containerd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
)

// A fork's children hold the parent's files (workdir, /tmp; links as
// links, never read through), each writes only its own copy, the parent
// goes on, and nothing is left once all are closed.
func TestForkCopiesFilesNotProcessesAndChildrenAreIndependent(t *testing.T) {
	b := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	parent, err := b.Create(ctx, sandbox.Spec{Image: "base", Limits: sandbox.Limits{DiskMB: 8}})
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	setup := `mkdir -p /work/src/empty && printf 'v1' > /work/src/a.txt && chmod 751 /work/src/a.txt &&
		ln -s /etc/hostname /work/host-link && ln -s /proc/1/root /work/root-link && echo tmp > /tmp/t;
		sleep 1000 > /dev/null 2>&1 &`
	if r, err := parent.Exec(ctx, sandbox.ExecRequest{Shell: setup}); err != nil || r.ExitCode != 0 {
		t.Fatalf("setup: %v %+v", err, r)
	}
	kids, err := parent.(sandbox.Forker).Fork(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	infos := []sandbox.Info{parent.Info()}
	for i, k := range kids {
		infos = append(infos, k.Info())
		r, err := k.Exec(ctx, sandbox.ExecRequest{Shell: `cat /work/src/a.txt; echo; stat -c '%a %u' /work/src/a.txt /work /tmp; readlink /work/host-link; readlink /work/root-link; cat /tmp/t; ls -d /work/src/empty; ps -o args | grep '^sleep 1000' | wc -l`})
		if err != nil {
			t.Fatal(err)
		}
		want := "v1\n751 65534\n755 65534\n1777 65534\n/etc/hostname\n/proc/1/root\ntmp\n/work/src/empty\n0\n"
		if string(r.Stdout) != want {
			t.Errorf("child %d sees:\n%s(stderr %s), want:\n%s", i, r.Stdout, r.Stderr, want)
		}
		if _, err := k.Exec(ctx, sandbox.ExecRequest{Shell: "printf 'child" + string(rune('0'+i)) + "' > /work/src/a.txt; rm /tmp/t"}); err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range kids {
		got, err := k.ReadFile(ctx, "/work/src/a.txt", 0)
		if err != nil || string(got) != "child"+string(rune('0'+i)) {
			t.Errorf("child %d reads %q, %v", i, got, err)
		}
	}
	if got, err := parent.ReadFile(ctx, "/work/src/a.txt", 0); err != nil || string(got) != "v1" {
		t.Errorf("the parent reads %q, %v after its children wrote", got, err)
	}
	if got, err := parent.ReadFile(ctx, "/tmp/t", 0); err != nil || string(got) != "tmp\n" {
		t.Errorf("the parent's /tmp/t: %q, %v", got, err)
	}
	// A child's disk is its spec's: writes beyond it fail with ENOSPC.
	r, err := kids[0].Exec(ctx, sandbox.ExecRequest{Shell: "dd if=/dev/zero of=/work/big bs=1M count=20 2>&1; echo rc=$?"})
	if err != nil || !strings.Contains(string(r.Stdout), "No space left") {
		t.Errorf("a child's workdir is not limited to 8 MB: %v %s", err, r.Stdout)
	}
	if err := sandbox.CloseAll(append(kids, parent)); err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if left := remains(t, info); len(left) > 0 {
			t.Errorf("after close, %s left %v", info.ID, left)
		}
	}
	if m := containerd.Mounts(""); len(m) > 0 {
		t.Errorf("fork mounts left: %v", m)
	}
}

// A fork that cannot be made whole makes nothing: no child is left
// running, and the error is the infrastructure's.
func TestAFailedForkLeavesNoChild(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	parent, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	before := countContainers(t, b)
	// The parent's task is gone: the copy cannot read its files.
	if err := parent.(interface{ KillTask(context.Context) error }).KillTask(ctx); err != nil {
		t.Fatal(err)
	}
	kids, err := parent.(sandbox.Forker).Fork(ctx, 4)
	if err == nil {
		sandbox.CloseAll(kids)
		t.Fatal("a fork of a dead sandbox succeeded")
	}
	if !sandbox.IsInfra(err) {
		t.Errorf("error %v is not infrastructure", err)
	}
	if after := countContainers(t, b); after != before {
		t.Errorf("%d containers before the failed fork, %d after", before, after)
	}
}

func countContainers(t *testing.T, b *containerd.Backend) int {
	list, err := b.Client().Containers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}
