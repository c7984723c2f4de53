package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/lease"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
)

// needContainerd skips without containerd and the base image in it, except
// under CI=true, where .ci/run has started it and imported the images.
func needContainerd(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	be, err := openContainerd(ctx, os.Stderr, readConfig(os.Getenv), 0)
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

// sameOnEveryEngine are the probes whose answer the engine that started the
// container does not change, so they run under Docker only (internal/audit's
// TestTheDefaultSpecPassesEveryProbe, on runc and on runsc): memory-bypass
// grows a shell variable in two ways (eval, sh -c) the kernel (or gVisor's
// sentry) does not tell apart, each stopped by the sandbox's memory limit as
// memory-balloon's allocation is (which runs here, judged by the containerd
// backend's host view); fifo-threads runs process substitutions inside the
// container and counts this process's threads. They were 61 of the 110 s
// the runsc audit took at a load of 30, and 171 of the 208 s of the runc
// one. Every other probe reads something the containerd backend does its
// own way: its seccomp profile, capabilities, mounts and cgroup limits
// (runc and runsc), the runsc wrapper (the network probes,
// runtime-identity, proc-self-exe), no host workspace under runsc (the
// file probes), the shim's FIFOs (output-flood), the sentry as the task
// (sandbox-abuse, guest-isolation, sandbox-removed, the host view's limits).
var sameOnEveryEngine = []string{"memory-bypass", "fifo-threads"}

// The audit passes on containerd under runc and under gVisor (runsc through
// containerd's runc shim): every probe whose answer the engine can change.
func TestAuditOnContainerdPassesEveryProbe(t *testing.T) {
	t.Parallel() // waits on its containers
	needContainerd(t)
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-audit-containerd")
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			want := probesBut(sameOnEveryEngine...)
			args := []string{"audit", "--backend", "containerd", "--runtime", rt, "--json", "--probes", strings.Join(want, ",")}
			code, out, stderr := rollbox(t, args...)
			rep := decodeAudit(t, out)
			var ran []string
			for _, p := range rep.Probes {
				ran = append(ran, p.Name)
				if p.Status != "pass" && p.Status != "n/a" {
					t.Errorf("%s: %s: %s", p.Name, p.Status, p.Evidence)
				}
			}
			if !slices.Equal(ran, want) {
				t.Errorf("probes %v ran, want %v", ran, want)
			}
			if code != exitOK || !rep.Pass || rep.Backend != "containerd" || len(rep.Loosened) != 0 {
				t.Fatalf("exit %d, backend %s, pass %v, loosened %v: %s", code, rep.Backend, rep.Pass, rep.Loosened, stderr)
			}
		})
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

// postJSON posts body to url and decodes the answer into out.
func postJSON(t *testing.T, url string, body, out any) int {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// serve's containerd backend keeps fork spares by default: after an
// environment-mode episode's first fork (its 2 children created cold),
// 2 spares of its spec are made (rollbox_fork_spares_ready says so), and
// the next fork's episodes run in them: sandboxes that existed before that
// fork, counted as taken from the spares.
func TestServeForksContainerdEpisodesIntoSpares(t *testing.T) {
	needContainerd(t)
	owner := fmt.Sprintf("rollbox-test-forkspares-%d", os.Getpid())
	t.Setenv("ROLLBOX_OWNER", owner)
	url, stop := serve(t, "--data", t.TempDir(), "--no-audit-log")
	defer stop()
	ctx := context.Background()
	cli, err := containerd.Dial(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	owned := func() map[string]bool {
		list, err := cli.Containers(ctx, fmt.Sprintf("labels.%q==%q", containerd.LabelOwner, owner))
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, c := range list {
			ids[c.ID()] = true
		}
		return ids
	}
	sandboxOf := func(id string) string {
		resp, err := http.Get(url + "/v1/episodes/" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var tr struct{ Sandbox struct{ ID string } }
		json.NewDecoder(resp.Body).Decode(&tr)
		return tr.Sandbox.ID
	}
	metric := func(re *regexp.Regexp) int {
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		m := re.FindSubmatch(b)
		if m == nil {
			return -1
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	ready := regexp.MustCompile(`rollbox_fork_spares_ready\{backend="containerd"\} (\d+)`)
	fromSpares := regexp.MustCompile(`rollbox_fork_children_total\{backend="containerd",source="spare"\} (\d+)`)
	var opened struct {
		ID    string
		Error any
	}
	task := map[string]any{"id": "fork-spares", "prompt": "fork me", "tools": []string{"bash", "finish"},
		"sandbox": map[string]any{"backend": "containerd", "image": "base"}, "reward": map[string]any{"type": "exact", "answer": "done"}}
	if code := postJSON(t, url+"/v1/episodes", map[string]any{"task": task}, &opened); code != 201 {
		t.Fatalf("open: %d %v", code, opened.Error)
	}
	var forked struct{ IDs []string }
	if code := postJSON(t, url+"/v1/episodes/"+opened.ID+"/fork", map[string]any{"n": 2}, &forked); code != 201 || len(forked.IDs) != 2 {
		t.Fatalf("first fork: %d %v", code, forked.IDs)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for metric(ready) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("rollbox_fork_spares_ready is %d 2 minutes after a fork of 2, want 2", metric(ready))
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := owned()
	if code := postJSON(t, url+"/v1/episodes/"+opened.ID+"/fork", map[string]any{"n": 2}, &forked); code != 201 || len(forked.IDs) != 2 {
		t.Fatalf("second fork: %d %v", code, forked.IDs)
	}
	for _, id := range forked.IDs {
		if sb := sandboxOf(id); sb == "" || !before[sb] {
			t.Errorf("episode %s runs in sandbox %q, not one of the spares ready before the fork (%v)", id, sb, before)
		}
	}
	if n := metric(fromSpares); n != 2 {
		t.Errorf("rollbox_fork_children_total{source=spare} is %d, want 2", n)
	}
}
