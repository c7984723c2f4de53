package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/internal/lease"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
)

// needContainerd skips without containerd and the base image in it, except
// under CI=true, where .ci/run has started it and imported the images.
func needContainerd(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	be, err := openContainerd(ctx, os.Stderr, readConfig(os.Getenv))
	if err == nil {
		defer be.Close()
		var sb sandbox.Sandbox
		if sb, err = be.Create(ctx, sandbox.Spec{Image: "base"}); err == nil {
			sb.Close()
			return
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("containerd and the base image in it are required under CI=true: %v", err)
	}
	t.Skipf("no containerd or base image (run .ci/engine.sh and rollbox images build base): %v", err)
}

func TestAuditOnContainerdPassesEveryProbe(t *testing.T) {
	t.Parallel() // waits on its containers
	needContainerd(t)
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-audit-containerd")
	code, out, stderr := rollbox(t, "audit", "--backend", "containerd", "--json")
	rep := decodeAudit(t, out)
	for _, p := range rep.Probes {
		if p.Status != "pass" && p.Status != "n/a" {
			t.Errorf("%s: %s: %s", p.Name, p.Status, p.Evidence)
		}
	}
	if code != exitOK || !rep.Pass || rep.Backend != "containerd" || len(rep.Loosened) != 0 {
		t.Fatalf("exit %d, backend %s, pass %v, loosened %v: %s", code, rep.Backend, rep.Pass, rep.Loosened, stderr)
	}
}

// gc removes a containerd sandbox whose process died (its lease file is
// there, unlocked) with its snapshot and lease, and leaves a live one.
func TestGCRemovesTheContainerdSandboxesOfADeadProcess(t *testing.T) {
	needContainerd(t)
	ctx := context.Background()
	leases := t.TempDir()
	t.Setenv("ROLLBOX_LEASE_DIR", leases)
	dead := "00deadbeef00cafe"
	if err := os.WriteFile(filepath.Join(leases, dead+".lease"), []byte("pid 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	live, err := lease.Acquire(leases)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Release()
	cfg := readConfig(os.Getenv)
	guest, err := cfg.builder(os.Stderr).Build(ctx, guestTarget)
	if err != nil {
		t.Fatal(err)
	}
	make := func(token string) sandbox.Sandbox {
		b, err := containerd.New(ctx, containerd.Options{GuestPath: guest, Owner: "rollbox-test-gc-containerd",
			Labels: map[string]string{lease.LabelLease: token, lease.LabelHost: lease.Host()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	orphan, kept := make(dead), make(live.Token())
	defer kept.Close()
	code, out, stderr := rollbox(t, "gc")
	if code != exitOK || !regexp.MustCompile(`gc: containerd: removed [1-9][0-9]* orphaned`).MatchString(out) {
		t.Fatalf("gc: exit %d\n%s\n%s", code, out, stderr)
	}
	cli, err := containerd.Dial(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.LoadContainer(ctx, orphan.Info().ID); err == nil {
		t.Errorf("the dead process's container %s is still there", orphan.Info().ID)
	}
	if _, err := cli.LoadContainer(ctx, kept.Info().ID); err != nil {
		t.Errorf("the live process's container %s was removed: %v", kept.Info().ID, err)
	}
	ls, _ := cli.LeasesService().List(ctx)
	for _, l := range ls {
		if strings.Contains(l.ID, orphan.Info().ID) {
			t.Errorf("lease %s of the removed container is left", l.ID)
		}
	}
	if r, err := kept.Exec(ctx, sandbox.ExecRequest{Shell: "echo alive"}); err != nil || string(r.Stdout) != "alive\n" {
		t.Errorf("the live sandbox after gc: %v %q", err, r.Stdout)
	}
	orphan.Close()
}
