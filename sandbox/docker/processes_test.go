package docker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// survivors lists every process of the sandbox but PID 1 and the listing
// shell itself, with no fork (a glob and builtins), so it works even when a
// fork bomb left the pids table full. A listing that fails is a survivor
// too (it says why). Safe from any goroutine.
func survivors(t *testing.T, sb sandbox.Sandbox) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: `cd /proc; for p in [0-9]*; do [ "$p" = 1 ] || [ "$p" = "$$" ] || echo "$p"; done`})
	if err != nil {
		return []string{fmt.Sprintf("(listing the processes failed: %v)", err)}
	}
	var out []string
	for _, pid := range strings.Fields(string(res.Stdout)) {
		st, err := sb.ReadFile(ctx, "/proc/"+pid+"/stat", 0)
		if err == nil {
			pid = strings.TrimSpace(string(st))
		}
		out = append(out, pid)
	}
	if res.ExitCode != 0 || len(res.Stderr) > 0 {
		out = append(out, fmt.Sprintf("(the listing exited %d: %q)", res.ExitCode, res.Stderr))
	}
	return out
}

// The attacks a command can make to outlive itself. Each is followed by a
// command that must find nothing but PID 1 and itself.
var outliveAttacks = []struct {
	name    string
	shell   string
	timeout time.Duration
}{
	// The classic: the guest's timeout kills it while it forks.
	{"a fork bomb", `bomb() { bomb | bomb & }; bomb; sleep 5`, 2 * time.Second},
	// Links that fork a new session and exit at once: whatever is listed
	// is already gone, its child is not listed yet.
	{"fork chains in new sessions", `cat > /tmp/chain <<'EOF'
setsid /bin/sh /tmp/chain &
EOF
for i in 1 2 3 4; do sh /tmp/chain; done; sleep 0.3`, 0},
	// The same without exec or a new session: a subshell forks the next
	// link and exits, a thousand times a second.
	{"fork chains in the command's session", `c() { c & }; for i in 1 2 3 4; do c; done; sleep 0.3`, 0},
	// A daemon in the usual way: double fork, new session, parent 1.
	{"a setsid double-fork daemon", `(setsid sh -c 'sleep 1000 & sleep 1000' &); sleep 0.1`, 0},
	// A daemon that keeps spawning while it is swept.
	{"a daemon respawning its children", `setsid sh -c 'while :; do sleep 1000 & done' >/dev/null 2>&1 & sleep 0.3`, 0},
}

// A command's processes end with it: nothing it started (a fork bomb, fork
// chains that change session at every link, a daemon) is alive when the
// next command runs.
func TestNothingACommandStartedOutlivesIt(t *testing.T) {
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
			for _, a := range outliveAttacks {
				t.Run(a.name, func(t *testing.T) {
					for round := range 3 {
						if _, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: a.shell, Timeout: a.timeout}); err != nil {
							t.Fatalf("round %d: the attack broke the sandbox: %v", round, err)
						}
						if left := survivors(t, sb); len(left) > 0 {
							t.Fatalf("round %d: %d processes outlived the command: %v", round, len(left), left)
						}
					}
				})
			}
		})
	}
}

// A command cancelled by the host (the episode's deadline) and the command
// sent right after it (the verifier): the second must not run beside
// anything the first started, even though the guest is still killing it.
func TestACancelledCommandLeavesNothingForTheNextOne(t *testing.T) {
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			b := need(t)
			ctx := context.Background()
			sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: rt})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if err := sb.WriteFile(ctx, "/work/chain", []byte("setsid /bin/sh /work/chain &\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			for round := range 5 {
				if _, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "rm -f /work/victim"}); err != nil {
					t.Fatal(err)
				}
				// Cancelled as soon as it wrote the victim, so while its
				// daemon is being forked (a fixed 400 ms was not enough for
				// gVisor on a loaded host to get that far, and the victim was
				// never written: CI of de9b804, load ~19).
				cctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() {
					_, err := sb.Exec(cctx, sandbox.ExecRequest{Shell: `for i in 1 2 3; do sh /work/chain; done
echo original > /work/victim
setsid sh -c 'sleep 1; echo tampered > /work/victim' &
sleep 1000`})
					done <- err
				}()
				for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
					if got, _ := sb.ReadFile(ctx, "/work/victim", 0); string(got) == "original\n" {
						break
					}
					if time.Now().After(deadline) {
						cancel()
						t.Fatalf("round %d: the command did not write the victim in 30 s", round)
					}
				}
				cancel()
				if err := <-done; err == nil {
					t.Fatal("the command was not cancelled")
				}
				if left := survivors(t, sb); len(left) > 0 {
					t.Fatalf("round %d: %d processes of the cancelled command run beside the next: %v", round, len(left), left)
				}
			}
			time.Sleep(1200 * time.Millisecond)
			if got, err := sb.ReadFile(ctx, "/work/victim", 0); err != nil || string(got) != "original\n" {
				t.Errorf("a daemon of a cancelled command wrote after it: %q %v", got, err)
			}
		})
	}
}

// Commands may overlap (parallel tool calls). What one leaves behind dies
// when it ends or, at the latest, when the sandbox has no command left:
// a command that starts on an idle sandbox starts alone.
func TestOverlappingCommandsLeaveNothingOnceTheSandboxIsIdle(t *testing.T) {
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			b := need(t)
			ctx := context.Background()
			sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: rt, Limits: sandbox.Limits{PIDs: 128}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if err := sb.WriteFile(ctx, "/tmp/chain", []byte("setsid /bin/sh /tmp/chain &\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			for round := range 3 {
				var wg sync.WaitGroup
				errs := make(chan error, 8)
				for i := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						shell := []string{
							`sleep 0.5`,
							`sh /tmp/chain; sleep 0.2`,
							`(setsid sh -c 'sleep 1000 &' &); sleep 0.1`,
							`bomb() { bomb | bomb & }; bomb; sleep 5`,
						}[i%4]
						if _, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: shell, Timeout: time.Second}); err != nil {
							errs <- err
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("round %d: %v", round, err)
				}
				if left := survivors(t, sb); len(left) > 0 {
					t.Fatalf("round %d: %d processes outlived overlapping commands: %v", round, len(left), left)
				}
			}
		})
	}
}

// The attacks above again and again, in several sandboxes of both
// runtimes at once, each followed by the check: escaping a sweep is a race,
// so it must fail to escape under load too.
func TestNothingOutlivesItsCommandHammer(t *testing.T) {
	b := need(t)
	var wg sync.WaitGroup
	for i := range 4 {
		rt := []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: rt, Limits: sandbox.Limits{PIDs: 64}})
			if err != nil {
				t.Error(err)
				return
			}
			defer sb.Close()
			for round := range 8 {
				a := outliveAttacks[(i+round)%len(outliveAttacks)]
				timeout := a.timeout
				if timeout == 0 {
					timeout = time.Second
				}
				if _, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: a.shell, Timeout: timeout}); err != nil {
					t.Errorf("%s round %d, %s: the attack broke the sandbox: %v", rt, round, a.name, err)
					return
				}
				if left := survivors(t, sb); len(left) > 0 {
					t.Errorf("%s round %d, %s: %d processes outlived the command: %v", rt, round, a.name, len(left), left)
					return
				}
			}
		}()
	}
	wg.Wait()
}
