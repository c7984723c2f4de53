package docker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

func TestContainersAreHardenedByDefault(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Limits: sandbox.Limits{MemoryMB: 128, PIDs: 50, CPUs: 0.5, DiskMB: 20, TmpMB: 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	in, err := b.Client().ContainerInspect(ctx, sb.Info().ID)
	if err != nil {
		t.Fatal(err)
	}
	hc := in.HostConfig
	checks := []struct {
		what string
		ok   bool
	}{
		{"network none", string(hc.NetworkMode) == "none"},
		{"all capabilities dropped", len(hc.CapDrop) == 1 && strings.EqualFold(hc.CapDrop[0], "ALL")},
		{"no-new-privileges", len(hc.SecurityOpt) == 1 && hc.SecurityOpt[0] == "no-new-privileges"},
		{"read-only root", hc.ReadonlyRootfs},
		{"memory with swap equal", hc.Memory == 128<<20 && hc.MemorySwap == hc.Memory},
		{"cpu quota", hc.NanoCPUs == 5e8},
		{"pids limit", hc.PidsLimit != nil && *hc.PidsLimit > 50 && *hc.PidsLimit < 100},
		{"no docker init (the guest is PID 1)", hc.Init != nil && !*hc.Init},
		{"workdir tmpfs sized", strings.Contains(hc.Tmpfs["/work"], "size=20m")},
		{"/tmp tmpfs sized", strings.Contains(hc.Tmpfs["/tmp"], "size=10m")},
		{"user nobody", in.Config.User == docker.DefaultUser},
		{"owner label", in.Config.Labels[docker.LabelOwner] != ""},
		{"spec label", in.Config.Labels[docker.LabelSpec] != ""},
		{"image digest in Info", sb.Info().ImageDigest == in.Image},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("not hardened: %s (%+v)", c.what, hc)
		}
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "id -u; touch /x 2>/dev/null && echo root-writable; touch /work/y && echo work-writable; grep CapEff /proc/self/status"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Stdout); !strings.HasPrefix(got, "65534\nwork-writable\nCapEff:\t0000000000000000") {
		t.Errorf("inside: %q %q", got, res.Stderr)
	}
}

func TestMissingImagesAreNamed(t *testing.T) {
	b := need(t)
	_, err := b.Create(context.Background(), sandbox.Spec{Image: "docker:rollbox/no-such-image:none"})
	if !errors.Is(err, sandbox.ErrImageNotFound) || !strings.Contains(err.Error(), "rollbox/no-such-image:none") {
		t.Errorf("err = %v, want ErrImageNotFound naming the image", err)
	}
	_, err = b.Create(context.Background(), sandbox.Spec{Image: "ubuntu"})
	var fe *sandbox.FieldError
	if !errors.As(err, &fe) || fe.Field != "image" {
		t.Errorf("an unknown recipe: err = %v, want a FieldError on image", err)
	}
}

func TestAnUnreachableEngineGivesAOneLineHint(t *testing.T) {
	cli, err := client.NewClientWithOpts(client.WithHost("unix://"+filepath.Join(t.TempDir(), "no.sock")), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	guest := env.guest
	if guest == "" {
		guest = "/bin/true"
	}
	_, err = docker.New(context.Background(), docker.Options{GuestPath: guest, Client: cli})
	if !errors.Is(err, sandbox.ErrEngineUnavailable) {
		t.Fatalf("err = %v, want ErrEngineUnavailable", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, ".ci/engine.sh") {
		t.Errorf("message %q: want one line with the hint", msg)
	}
}

func TestCleanupRemovesEveryContainerOfItsOwnerAndIsSafeTwice(t *testing.T) {
	need(t)
	ctx := context.Background()
	owner := testOwner + "-cleanup"
	b, err := docker.New(ctx, docker.Options{GuestPath: env.guest, Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var sbs []sandbox.Sandbox
	for range 2 {
		sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb) // deliberately not closed: a crashed process
	}
	if n, err := docker.Cleanup(ctx, b.Client(), owner); err != nil || n != 2 {
		t.Fatalf("first cleanup: removed %d, err %v; want 2", n, err)
	}
	if n, err := docker.Cleanup(ctx, b.Client(), owner); err != nil || n != 0 {
		t.Fatalf("second cleanup: removed %d, err %v; want 0", n, err)
	}
	// A sandbox whose container vanished fails as infrastructure, not as the command.
	_, err = sbs[0].Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
	if !errors.Is(err, sandbox.ErrSandboxFailed) {
		t.Errorf("exec in a removed container: %v, want ErrSandboxFailed", err)
	}
	for _, sb := range sbs {
		if err := sb.Close(); err != nil {
			t.Errorf("Close after cleanup: %v", err)
		}
	}
}

func TestSeedCopiesAHostTreeThroughTheGuest(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "pkg"), 0o755)
	os.WriteFile(filepath.Join(src, "pkg", "calc.py"), []byte("def add(a, b):\n    return a - b\n"), 0o644)
	os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(src, "link")) // skipped, never followed
	files, err := sandbox.FilesFromHost(src, "/work")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := sandbox.Seed(ctx, sb, files); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "./run.sh; cat pkg/calc.py | head -1; ls -a /work | tr '\\n' ' '"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Stdout); got != "ran\ndef add(a, b):\n. .. pkg run.sh " {
		t.Errorf("seeded tree: %q %q", got, res.Stderr)
	}
}

func TestConcurrentCloseAndExecHammer(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "echo x"})
				if err != nil {
					errs <- err
					return
				}
				if i%2 == 0 {
					_, err = sb.ReadFile(ctx, "/etc/passwd", 0)
					if err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); sb.Close() }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("a call racing Close failed with %v, want ErrClosed", err)
		}
	}
}

func TestASecondImageBuildIsANoOp(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	first, err := docker.BuildImage(ctx, b.Client(), "base", nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := docker.BuildImage(ctx, b.Client(), "base", nil)
	if err != nil {
		t.Fatal(err)
	}
	if second.Built || second.ID != first.ID || !strings.HasPrefix(second.Ref, "rollbox/base:") {
		t.Errorf("second build: %+v, first %+v", second, first)
	}
	in, err := b.Client().ImageInspect(ctx, "rollbox/base:latest")
	if err != nil || in.ID != first.ID || in.Config.Labels[docker.LabelRecipe] != "base" {
		t.Errorf("latest tag: %v %v", in.ID, err)
	}
}

func TestACommandCannotKillOrReachTheGuest(t *testing.T) {
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			b := need(t)
			ctx := context.Background()
			sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: rt})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			// Go exits on these when sent by kill, unless the guest catches them.
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: `for s in TERM INT QUIT HUP ABRT SEGV BUS TRAP SYS USR1 ALRM; do kill -$s 1; done; sleep 0.2
trap 'echo caught' TERM; kill -TERM $$; echo signals-sent`})
			if err != nil {
				t.Fatalf("signalling PID 1: %v", err)
			}
			if got := string(res.Stdout); got != "caught\nsignals-sent\n" {
				t.Errorf("stdout %q, stderr %q: a command's own signals must still work", got, res.Stderr)
			}
			res, err = sb.Exec(ctx, sandbox.ExecRequest{Shell: "echo alive"})
			if err != nil || string(res.Stdout) != "alive\n" {
				t.Fatalf("the guest did not survive the signals: %q %v", res.Stdout, err)
			}
			res, err = sb.Exec(ctx, sandbox.ExecRequest{Shell: "cat /proc/1/mem 2>&1 >/dev/null | head -c 0; ls /proc/1/root/ >/dev/null 2>&1 && echo root-reachable; true"})
			if err != nil || strings.Contains(string(res.Stdout), "reachable") {
				t.Errorf("the guest's /proc entries: %q %v", res.Stdout, err)
			}
			// Commands start with default dispositions: nothing the guest
			// ignores or catches is inherited (a SIGPIPE-proof `yes` would
			// fail with EPIPE instead of ending as it does elsewhere).
			res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"grep", "SigIgn", "/proc/self/status"}})
			if rt == sandbox.RuntimeRunsc && len(res.Stdout) == 0 {
				// gVisor's /proc/PID/status has no SigIgn line.
			} else if err != nil || strings.TrimSpace(string(res.Stdout)) != "SigIgn:\t0000000000000000" {
				t.Errorf("a command's ignored signals: %q %v", res.Stdout, err)
			}
			if rt == sandbox.RuntimeRunc {
				res, _ := sb.Exec(ctx, sandbox.ExecRequest{Shell: "echo garbage > /proc/1/fd/1 && echo wrote"})
				if strings.Contains(string(res.Stdout), "wrote") {
					t.Errorf("a command wrote into the guest's stream under runc")
				}
			}
		})
	}
}

// The guest shares the pids limit with the commands: a Go runtime that
// wants one more thread when a command has filled the limit dies ("fatal
// error: newosproc"), and the sandbox with it. Concurrent requests while
// the table is full are what make it want threads.
func TestTheGuestAnswersConcurrentRequestsWhileACommandFillsThePidsLimit(t *testing.T) {
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			b := need(t)
			ctx := context.Background()
			sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: rt, Limits: sandbox.Limits{PIDs: 64}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			type result struct {
				res sandbox.Result
				err error
			}
			filler := make(chan result, 1)
			go func() {
				// The inner shell starts sleeps until a fork fails; the outer
				// one then waits without forking, holding the table full:
				// read (a builtin) opens a FIFO no one writes, which blocks
				// until the timeout (a spinning loop held a core for it).
				// Under gVisor on a loaded host filling the table took more
				// than 6 s (CI of de9b804, load ~19: no "filled" before the
				// timeout; at load ~15 not full within 5 s), so it may take
				// 15 s and the window is 20 s.
				res, err := sb.Exec(ctx, sandbox.ExecRequest{
					Shell:   `mkfifo /tmp/hold && sh -c 'while :; do sleep 100 & done' 2>/dev/null; echo filled; read x < /tmp/hold`,
					Timeout: 20 * time.Second,
				})
				filler <- result{res, err}
			}()
			full := false
			for deadline := time.Now().Add(15 * time.Second); !full && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				fis, err := sb.ListFiles(ctx, "/proc")
				if err != nil {
					t.Fatalf("listing /proc while the table fills: %v", err)
				}
				procs := 0
				for _, fi := range fis {
					if fi.Name[0] >= '0' && fi.Name[0] <= '9' {
						procs++
					}
				}
				full = procs >= 48
			}
			if !full {
				t.Fatal("the command did not fill the pids limit in 15 s")
			}
			var wg sync.WaitGroup
			errs := make(chan error, 400)
			for i := range 400 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var err error
					switch i % 4 {
					case 0:
						_, err = sb.ReadFile(ctx, "/etc/passwd", 0)
					case 1:
						_, err = sb.ListFiles(ctx, "/etc")
					case 2:
						err = sb.WriteFile(ctx, fmt.Sprintf("/tmp/f%d", i), []byte("x"), 0o644)
					case 3:
						if i%40 == 3 { // cannot fork: retried, then exit 126
							_, err = sb.Exec(ctx, sandbox.ExecRequest{Shell: "true"})
						} else {
							_, err = sb.ReadFile(ctx, "/work/nope", 0)
							if errors.Is(err, sandbox.ErrNotFound) {
								err = nil
							}
						}
					}
					if err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("a request while the pids limit was full: %v", err)
			}
			r := <-filler
			if r.err != nil || !r.res.TimedOut || string(r.res.Stdout) != "filled\n" {
				t.Fatalf("the command that filled the limit: %+v %v", r.res, r.err)
			}
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "echo alive"})
			if err != nil || string(res.Stdout) != "alive\n" {
				t.Fatalf("after the pids limit was full: %q %v", res.Stdout, err)
			}
		})
	}
}
