package containerd_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
)

// The channel past the shim: each threat of RATIONALE.md's "Why a channel
// past the shim" as a test.

var probeOnce struct {
	sync.Once
	path string
	err  error
}

// probeBinary is the audit's probe program (images/probe).
func probeBinary(t *testing.T) string {
	t.Helper()
	probeOnce.Do(func() {
		probeOnce.path, probeOnce.err = images.NewBuilder(os.Stderr).Build(context.Background(),
			images.Target{Package: "images/probe", GOOS: "linux", GOARCH: "amd64", Name: "probe"})
	})
	if probeOnce.err != nil {
		t.Fatal(probeOnce.err)
	}
	return probeOnce.path
}

type finding struct {
	Pass     bool           `json:"pass"`
	Evidence string         `json:"evidence"`
	Data     map[string]any `json:"data"`
}

// runProbe copies the probe into the sandbox and runs `probe args...`.
func runProbe(t *testing.T, sb sandbox.Sandbox, args ...string) finding {
	t.Helper()
	ctx := context.Background()
	bin, err := os.ReadFile(probeBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/work/probe", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: append([]string{"/work/probe"}, args...), Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	out := strings.TrimSpace(string(r.Stdout))
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	var f finding
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("probe %v: %v: stdout %q stderr %q", args, err, r.Stdout, r.Stderr)
	}
	return f
}

func usesChannel(t *testing.T, sb sandbox.Sandbox) bool {
	t.Helper()
	c, ok := sb.(*containerd.Container)
	if !ok {
		t.Fatalf("%T is not a containerd sandbox", sb)
	}
	return c.UsesChannel()
}

func TestACommandCannotConnectToTheChannel(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if !usesChannel(t, sb) {
		t.Fatal("a runc sandbox does not speak to its guest over the channel")
	}
	// The socket is there (bound read-only), and nobody listens.
	r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "test -S " + containerd.ChannelMountPath + " && grep ' " + containerd.ChannelMountPath + " ro,' /proc/self/mountinfo"})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("the channel is not a socket bound read-only: %v %+v", err, r)
	}
	f := runProbe(t, sb, "guest")
	if !strings.Contains(f.Evidence, "connect "+containerd.ChannelMountPath+": ECONNREFUSED") {
		t.Errorf("a command's connect to the channel was not refused: %s", f.Evidence)
	}
	if !f.Pass {
		t.Errorf("the guest probe fails: %s", f.Evidence)
	}
	// The guest still answers on its channel.
	if r, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("after the probe: %v %+v", err, r)
	}
}

func TestTheChannelIsNotInheritedNorReachableThroughProc(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	f := runProbe(t, sb, "guest")
	reach, _ := f.Data["reachable"].(map[string]any)
	for _, k := range []string{"inherited-socket", "/proc/1/fd/0", "/proc/1/fd/1", "ptrace"} {
		if reach[k] != nil {
			t.Errorf("%s reachable from a command: %s", k, f.Evidence)
		}
	}
	// Nor listed (pidfd_getfd needs what a listing needs, and more).
	if !strings.Contains(f.Evidence, "list /proc/1/fd: EACCES") {
		t.Errorf("/proc/1/fd is listable from a command: %s", f.Evidence)
	}
}

func TestAConnectionRacingTheGuestIsRefused(t *testing.T) {
	b := newBackend(t, containerd.Options{})
	ctx := context.Background()
	type racer struct {
		got []byte
		err error
	}
	done := make(chan racer, 1)
	containerd.SetChannelHook(b, func(path string) {
		// Connect before the guest can (its container does not exist
		// yet), as a process that reached the socket would, and read
		// what the host sends: the Hello carries the key that seals the
		// guest's replies.
		conn, err := net.Dial("unix", path)
		if err != nil {
			done <- racer{err: err}
			return
		}
		go func() {
			defer conn.Close()
			conn.SetReadDeadline(time.Now().Add(20 * time.Second))
			got, err := io.ReadAll(conn)
			done <- racer{got: got, err: err}
		}()
	})
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	var r racer
	select {
	case r = <-done:
	case <-time.After(25 * time.Second):
		t.Fatal("the racer's connection was neither closed nor answered")
	}
	if r.err != nil || len(r.got) != 0 {
		t.Fatalf("the racing connection was served: read %d bytes, err %v", len(r.got), r.err)
	}
	c := sb.(*containerd.Container)
	if !c.UsesChannel() || c.ChannelRefused() != 1 {
		t.Errorf("uses the channel %v, refused %d connections, want 1", c.UsesChannel(), c.ChannelRefused())
	}
	if r, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "ok"}}); err != nil || string(r.Stdout) != "ok\n" {
		t.Fatalf("the guest behind the race: %v %+v", err, r)
	}
}

func TestAGuestThatNeverConnectsFailsTheCreateAsInfra(t *testing.T) {
	// A guest built before the channel (or one that hangs) serves stdio
	// and never connects: the create fails, bounded, as the sandbox's
	// failure (unscored), and leaves nothing behind.
	dir := t.TempDir()
	hang := dir + "/guest"
	if err := os.WriteFile(hang, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	exits := dir + "/exits"
	if err := os.WriteFile(exits, []byte("#!/bin/sh\necho no channel here >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, guest string
		within      time.Duration
		want        string
	}{
		{"hangs", hang, 20 * time.Second, "did not connect in 2s"},
		{"exits", exits, 15 * time.Second, "exited (status 3) before it connected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, containerd.Options{GuestPath: tc.guest, ChannelTimeout: 2 * time.Second})
			start := time.Now()
			sb, err := b.Create(context.Background(), sandbox.Spec{Image: "base"})
			if err == nil {
				sb.Close()
				t.Fatal("a create whose guest never connects succeeded")
			}
			if !errors.Is(err, sandbox.ErrSandboxFailed) || errors.Is(err, sandbox.ErrSandboxAbuse) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v: want ErrSandboxFailed (not abuse) saying %q", err, tc.want)
			}
			if d := time.Since(start); d > tc.within {
				t.Errorf("took %v", d)
			}
			if n := ownContainers(t, b, t.Name()); n != 0 {
				t.Errorf("%d containers left", n)
			}
		})
	}
}

func TestForksSparesAndPoolsUseTheChannel(t *testing.T) {
	b := newBackend(t, containerd.Options{ForkSpares: 2})
	ctx := context.Background()
	spec := sandbox.Spec{Image: "base"}
	parent, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	if err := parent.WriteFile(ctx, "/work/f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(what string, sb sandbox.Sandbox) {
		t.Helper()
		if !usesChannel(t, sb) {
			t.Errorf("%s: not on the channel", what)
		}
		if r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "cat /work/f 2>/dev/null; echo ."}); err != nil || r.ExitCode != 0 {
			t.Errorf("%s: %v %+v", what, err, r)
		}
	}
	// Cold children, then children taken from the spares made after.
	kids, err := parent.(sandbox.Forker).Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		check("a fork's cold child", k)
	}
	sandbox.CloseAll(kids)
	deadline := time.Now().Add(time.Minute)
	for b.SparesReady(spec) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if b.SparesReady(spec) < 2 {
		t.Fatalf("%d spares after a minute", b.SparesReady(spec))
	}
	kids, err = parent.(sandbox.Forker).Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		check("a fork's child from the spares", k)
	}
	sandbox.CloseAll(kids)
	pool := sandbox.NewPool(b, 1)
	defer pool.Close()
	if err := pool.Warm(spec); err != nil {
		t.Fatal(err)
	}
	for pool.Stats().Ready[spec.Key()] < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	sb, err := pool.Get(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	check("a warm pool's sandbox", sb)
}

func TestRunscUsesStdio(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: sandbox.RuntimeRunsc})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if usesChannel(t, sb) {
		t.Error("a runsc sandbox uses the channel")
	}
	r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "test -e " + containerd.ChannelMountPath + "; echo $?"})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "1" {
		t.Errorf("a runsc sandbox has %s: %v %+v", containerd.ChannelMountPath, err, r)
	}
}

// TestAWorkdirOverTheGuestsMountsIsBadInput: a workdir is a tmpfs mounted
// after the guest's binds: on /.rollbox it hid the guest (the create
// failed as "sandbox engine unavailable"), on /.rollbox/channel the
// channel's mount failed (sandbox failed), on /sys/fs/cgroup it hid the
// memory cgroup the guest reads for its OOM verdicts, on /proc or /dev
// runc refused it: infrastructure failures (unscored episodes) for what is
// the task's bad input. It is refused before anything is made, naming
// the field.
func TestAWorkdirOverTheGuestsMountsIsBadInput(t *testing.T) {
	b := newBackend(t, containerd.Options{ChannelTimeout: 5 * time.Second})
	for _, wd := range []string{"/.rollbox", "/.rollbox/channel", "/sys/fs/cgroup", "/proc", "/dev"} {
		sb, err := b.Create(context.Background(), sandbox.Spec{Image: "base", Workdir: wd})
		if err == nil {
			sb.Close()
		}
		var fe *sandbox.FieldError
		if !errors.As(err, &fe) || fe.Field != "workdir" || errors.Is(err, sandbox.ErrSandboxFailed) || errors.Is(err, sandbox.ErrEngineUnavailable) {
			t.Errorf("workdir %s: %v, want bad input naming workdir", wd, err)
		}
	}
	if n := ownContainers(t, b, t.Name()); n != 0 {
		t.Errorf("%d containers left", n)
	}
}

// TestNoChannelDirectoryOutlivesItsCreate: a sandbox's channel directory
// and socket on the host are gone once its guest connected, once a create
// whose guest never connected failed, and once a sandbox killed from
// outside was closed: no fd nor ch/ entry accumulates.
func TestNoChannelDirectoryOutlivesItsCreate(t *testing.T) {
	dir := t.TempDir()
	exits := dir + "/exits"
	if err := os.WriteFile(exits, []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var paths []string
	hook := func(p string) { mu.Lock(); paths = append(paths, p); mu.Unlock() }
	gone := func(what string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(paths) == 0 {
			t.Fatalf("%s: no channel was made", what)
		}
		for _, p := range paths {
			if _, err := os.Lstat(filepath.Dir(p)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: the channel directory %s is still there (%v)", what, filepath.Dir(p), err)
			}
		}
	}
	ctx := context.Background()

	b := newBackend(t, containerd.Options{ChannelTimeout: 5 * time.Second})
	containerd.SetChannelHook(b, hook)
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	gone("a create whose guest connected")
	if err := sb.(*containerd.Container).KillTask(ctx); err != nil {
		t.Fatal(err)
	}
	sb.Close()
	gone("a sandbox killed from outside, closed")

	bad := newBackend(t, containerd.Options{GuestPath: exits, ChannelTimeout: 5 * time.Second})
	containerd.SetChannelHook(bad, hook)
	if sb, err := bad.Create(ctx, sandbox.Spec{Image: "base"}); err == nil {
		sb.Close()
		t.Fatal("a create whose guest exits succeeded")
	}
	gone("a failed create")
}
