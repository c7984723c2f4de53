package containerd_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/rollbox/rollbox/sandbox"
)

// A sandbox removed or killed from outside its backend while a command runs
// (an operator's `rollbox gc --owner`, `ctr task kill`, a test's cleanup) is
// an infrastructure failure, not the agent's: the Exec error is IsInfra, not
// IsAbuse. Before, the stopped task read as the command's doing
// (sandbox_abuse, scored 0).
// loadTask is container id and its task, as a process outside the backend
// finds them.
func loadTask(ctx context.Context, cli *client.Client, id string) (client.Container, client.Task, error) {
	ctr, err := cli.LoadContainer(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	task, err := ctr.Task(ctx, nil)
	return ctr, task, err
}

func TestASandboxRemovedFromOutsideIsInfra(t *testing.T) {
	b := need(t)
	outside := []struct {
		name string
		do   func(ctx context.Context, cli *client.Client, id string) error
	}{
		{"gc: kill, delete the task and the container", func(ctx context.Context, cli *client.Client, id string) error {
			ctr, task, err := loadTask(ctx, cli, id)
			if err != nil {
				return err
			}
			exit, err := task.Wait(ctx)
			if err != nil {
				return err
			}
			if err := task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil {
				return err
			}
			<-exit
			if _, err := task.Delete(ctx); err != nil {
				return err
			}
			return ctr.Delete(ctx, client.WithSnapshotCleanup)
		}},
		{"ctr task kill -s KILL", func(ctx context.Context, cli *client.Client, id string) error {
			_, task, err := loadTask(ctx, cli, id)
			if err != nil {
				return err
			}
			return task.Kill(ctx, syscall.SIGKILL)
		}},
	}
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		for _, o := range outside {
			if rt == sandbox.RuntimeRunsc && o.name != outside[0].name {
				// Under runsc a command can SIGKILL the guest too: a
				// kill alone cannot be told from the agent's (below).
				continue
			}
			t.Run(rt+"/"+o.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: rt})
				if err != nil {
					t.Fatal(err)
				}
				defer sb.Close()
				done := make(chan error, 1)
				go func() {
					_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
					done <- err
				}()
				time.Sleep(time.Second)
				if err := o.do(ctx, b.Client(), sb.Info().ID); err != nil {
					t.Fatalf("%s: %v", o.name, err)
				}
				start := time.Now()
				select {
				case err = <-done:
				case <-time.After(20 * time.Second):
					t.Fatal("the Exec did not end within 20 s of the removal")
				}
				t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
				if err == nil || !sandbox.IsInfra(err) || sandbox.IsAbuse(err) || !errors.Is(err, sandbox.ErrSandboxFailed) {
					t.Errorf("want an infrastructure error (IsInfra, not IsAbuse), got %v", err)
				}
			})
		}
	}
}

// What the sandbox's own processes do to its guest stays theirs: under runc
// the guest killed by the kernel's OOM killer for the sandbox's memory
// limit, under runsc a command's `kill -KILL 1` (gVisor lets it through).
// Both end the task with SIGKILL, as an outside kill does. The OOM killer
// will not pick the guest over the command that eats the memory (both have
// oom_score_adj 1000, the command more memory), so the test makes its kill
// as the kernel would: a command runs the cgroup out of memory (its OOM
// kill is counted), then the guest gets SIGKILL straight from the kernel
// (the test's kill(2) of its host pid, not containerd's).
func TestTheSandboxsOwnKillOfItsGuestIsNotInfra(t *testing.T) {
	b := need(t)
	cases := []struct {
		name, runtime, cmd string
		oom                bool
	}{
		{"runc: the guest OOM-killed", sandbox.RuntimeRunc, "sleep 5", true},
		{"runsc: kill -KILL 1", sandbox.RuntimeRunsc, "kill -KILL 1; sleep 5", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: c.runtime, Limits: sandbox.Limits{MemoryMB: 128}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if c.oom {
				r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "head -c 400m /dev/zero | tail"})
				if err != nil || r.ExitCode != 137 {
					t.Fatalf("the memory eater: %+v %v", r, err)
				}
				ctr, err := b.Client().LoadContainer(ctx, sb.Info().ID)
				if err != nil {
					t.Fatal(err)
				}
				task, err := ctr.Task(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				pid := int(task.Pid())
				go func() {
					time.Sleep(time.Second)
					syscall.Kill(pid, syscall.SIGKILL)
				}()
			}
			_, err = sb.Exec(ctx, sandbox.ExecRequest{Shell: c.cmd})
			t.Logf("%v", err)
			if err == nil || !sandbox.IsAbuse(err) || sandbox.IsInfra(err) {
				t.Errorf("want the guest broken by the sandbox's own doing (IsAbuse, not IsInfra), got %v", err)
			}
		})
	}
}
