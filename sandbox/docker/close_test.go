package docker_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// Close must leave nothing, even when it interrupts commands that fork as
// fast as they can.
func TestCloseRemovesContainersInterruptedMidForkBomb(t *testing.T) {
	attacks := []string{
		`bomb() { bomb | bomb & }; bomb; sleep 30`,
		`c() { c & }; for i in 1 2 3 4 5 6 7 8; do c; done; sleep 30`,
		`while :; do (setsid sh -c 'sleep 1000 & sleep 1000' &); done`,
	}
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			// A runsc sandbox full of forks can take dockerd minutes to
			// remove when the host is loaded ("Container failed to exit
			// within 10 seconds of kill", "cannot delete running task"):
			// Close must wait it out, or fail, never return early.
			need(t)
			b, err := docker.New(context.Background(), docker.Options{GuestPath: env.guest, Owner: testOwner, RemoveTimeout: 5 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ctx := context.Background()
			var wg sync.WaitGroup
			for i := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: rt, Limits: sandbox.Limits{PIDs: 512}})
					if err != nil {
						t.Error(err)
						return
					}
					go sb.Exec(ctx, sandbox.ExecRequest{Shell: attacks[i%len(attacks)], Timeout: time.Minute})
					time.Sleep(time.Duration(500+100*i) * time.Millisecond)
					start := time.Now()
					if err := sb.Close(); err != nil {
						t.Errorf("Close %s after %v: %v", sb.Info().ID, time.Since(start), err)
					}
					if left := remains(t, sb.Info()); len(left) > 0 {
						t.Errorf("after Close returned: %v", left)
					}
				}()
			}
			wg.Wait()
		})
	}
}

// faultyEngine is the real engine behind a proxy that answers the first
// `fail` container removals itself, the way dockerd does when it loses a
// container's exit event, without forwarding them (the container stays).
type faultyEngine struct {
	fail     atomic.Int64 // removals still to fail
	deletes  atomic.Int64 // removals asked for
	answer   int          // the status the failed removals get
	message  string
	upstream string
}

var deletePath = regexp.MustCompile(`^(/v[0-9.]+)?/containers/[0-9a-f]+$`)

func newFaultyEngine(t *testing.T, answer int, message string) (*faultyEngine, *client.Client) {
	t.Helper()
	real := need(t).Client()
	up, err := url.Parse(real.DaemonHost())
	if err != nil || up.Scheme != "unix" {
		t.Skipf("the fault-injecting proxy needs the engine on a unix socket, not %q", real.DaemonHost())
	}
	f := &faultyEngine{answer: answer, message: message, upstream: up.Path}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL.Scheme, r.Out.URL.Host = "http", "docker" },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", f.upstream)
		}},
	}
	sock := filepath.Join(t.TempDir(), "engine.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && deletePath.MatchString(r.URL.Path) {
			f.deletes.Add(1)
			if f.fail.Add(-1) >= 0 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(f.answer)
				w.Write([]byte(`{"message": "` + f.message + `"}`))
				return
			}
		}
		proxy.ServeHTTP(w, r)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	cli, err := client.NewClientWithOpts(client.WithHost("unix://"+sock), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return f, cli
}

// A container the engine fails to remove is retried until it is gone; one
// that stays is an error from Close naming it, counted by the backend:
// never a container left behind while the episode is recorded ended.
func TestCloseRetriesAFailedRemoveAndSurfacesOneThatNeverSucceeds(t *testing.T) {
	failures := []struct {
		name    string
		status  int
		message string
	}{
		{"the engine lost the exit event", http.StatusInternalServerError,
			"Could not kill running container abc, cannot remove - tried to kill container, but did not receive an exit event"},
		{"the engine says a removal is already in progress", http.StatusConflict,
			"removal of container abc is already in progress"},
		{"the engine accepts the removal but does nothing", http.StatusNoContent, ""},
	}
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel() // an engine proxy and backends of its own; mostly waits on the engine
			engine, cli := newFaultyEngine(t, f.status, f.message)
			b, err := docker.New(context.Background(), docker.Options{GuestPath: env.guest, Owner: testOwner, Client: cli, RemoveTimeout: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			// The removal that never succeeds waits out its backend's
			// whole RemoveTimeout: 1 s of retries (about 5 attempts) is
			// as good a proof as 3 s, at a third of the wait.
			never, err := docker.New(context.Background(), docker.Options{GuestPath: env.guest, Owner: testOwner, Client: cli, RemoveTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer never.Close()
			ctx := context.Background()

			t.Run("a few failures are retried until the container is gone", func(t *testing.T) {
				sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
				if err != nil {
					t.Fatal(err)
				}
				engine.fail.Store(3)
				engine.deletes.Store(0)
				if err := sb.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				if n := engine.deletes.Load(); n < 4 {
					t.Errorf("%d removals asked for, want the 3 that failed and one more", n)
				}
				if left := remains(t, sb.Info()); len(left) > 0 {
					t.Errorf("after Close returned nil: %v", left)
				}
			})

			t.Run("a remove that never succeeds is Close's error, counted", func(t *testing.T) {
				b := never
				sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
				if err != nil {
					t.Fatal(err)
				}
				engine.fail.Store(1 << 30)
				before := b.RemoveFailures()
				start := time.Now()
				err = sb.Close()
				engine.fail.Store(0)
				defer need(t).Client().ContainerRemove(ctx, sb.Info().ID, container.RemoveOptions{Force: true})
				if !errors.Is(err, sandbox.ErrSandboxFailed) || !strings.Contains(err.Error(), sb.Info().ID) || time.Since(start) > 10*time.Second {
					t.Fatalf("Close after %v: %v, want ErrSandboxFailed naming %s within the remove timeout", time.Since(start), err, sb.Info().ID)
				}
				if f.message != "" && !strings.Contains(err.Error(), "cannot remove") && !strings.Contains(err.Error(), "in progress") {
					t.Errorf("Close's error does not say what the engine said: %v", err)
				}
				if got := b.RemoveFailures(); got != before+1 {
					t.Errorf("RemoveFailures %d, want %d", got, before+1)
				}
				if err2 := sb.Close(); err2 == nil || err2.Error() != err.Error() {
					t.Errorf("a second Close: %v, want the same error", err2)
				}
			})
		})
	}
}

// An episode is recorded ended only once its container is gone; one the
// engine would not remove is recorded in the trajectory (sandbox.close_error,
// naming the container), and neither its end nor its reward change.
func TestAnEpisodeRecordsAContainerThatCouldNotBeRemoved(t *testing.T) {
	engine, cli := newFaultyEngine(t, http.StatusInternalServerError, "tried to kill container, but did not receive an exit event")
	b, err := docker.New(context.Background(), docker.Options{GuestPath: env.guest, Owner: testOwner, Client: cli, RemoveTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	engine.fail.Store(1 << 30)
	tr, made := abuseEpisode(t, b, sandbox.RuntimeRunc, "", nil, nil)
	engine.fail.Store(0)
	for _, sb := range made {
		defer need(t).Client().ContainerRemove(context.Background(), sb.Info().ID, container.RemoveOptions{Force: true})
	}
	sb := made[0]
	if tr.Termination.Reason != "finished" || tr.Reward == nil || *tr.Reward.Total != 1 {
		t.Errorf("the end changed: %s", describeEnd(tr))
	}
	if ce := tr.Sandbox.CloseError; !strings.Contains(ce, sb.Info().ID) || !strings.Contains(ce, "exit event") {
		t.Errorf("sandbox.close_error = %q, want the container and the engine's error", ce)
	}
	// The episode's container and the verifier's: both counted.
	if b.RemoveFailures() != 2 {
		t.Errorf("RemoveFailures = %d, want 2", b.RemoveFailures())
	}
}

// A gVisor container the engine paused (found by the guest's ping) is
// removed without waiting out dockerd's 10 s for a paused container to
// exit after its kill: Close unpauses it first (docker rm -f of a paused
// runsc container took 12 s at a load of 30, unpause and rm 3.4 s).
func TestClosingAPausedGVisorSandboxDoesNotWaitOutTheEngine(t *testing.T) {
	t.Parallel() // a sandbox of its own; mostly waits for the ping to fail
	b := quickBackend(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: sandbox.RuntimeRunsc})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := b.Client().ContainerPause(ctx, sb.Info().ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "true"}); !errors.Is(err, sandbox.ErrSandboxFailed) || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("a command in a paused sandbox: %v, want ErrSandboxFailed saying it is paused", err)
	}
	start := time.Now()
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("Close took %v: the removal waited out the engine's timeout for a paused container", d)
	}
	if left := remains(t, sb.Info()); len(left) > 0 {
		t.Errorf("after Close: %v", left)
	}
}
