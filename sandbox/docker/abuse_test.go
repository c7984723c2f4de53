package docker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/scripted"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// abuseEpisode runs one episode through agent.Run on the real engine: the
// agent writes /work/ok (so the verifier, `test -f /work/ok`, would give
// 1), then makes the calls given, then finishes. It returns the trajectory
// and the sandboxes made: the episode's first, then the verifier's; during,
// if set, runs beside the episode with the episode's.
func abuseEpisode(t *testing.T, b *docker.Backend, rt string, verifier string, calls []map[string]any, during func(sb sandbox.Sandbox)) (*trajectory.Trajectory, []sandbox.Sandbox) {
	t.Helper()
	if verifier == "" {
		verifier = "test -f /work/ok"
	}
	task := map[string]any{
		"id": "abuse", "prompt": "p",
		"sandbox": map[string]any{"backend": "docker", "image": "base", "runtime": rt},
		"tools":   []string{"bash", "read_file", "write_file", "finish"},
		"reward":  map[string]any{"type": "tests", "command": verifier, "timeout_s": 60},
		"limits":  map[string]any{"max_turns": 10},
	}
	turns := []map[string]any{{"tool_calls": []map[string]any{{"name": "bash", "arguments": map[string]any{"command": "echo yes > /work/ok"}}}}}
	for _, c := range calls {
		turns = append(turns, map[string]any{"tool_calls": []map[string]any{c}})
	}
	turns = append(turns, map[string]any{"tool_calls": []map[string]any{{"name": "finish", "arguments": map[string]any{}}}})
	taskJSON, _ := json.Marshal(task)
	script, _ := json.Marshal(map[string]any{"task_id": "abuse", "turns": turns})
	tasks, err := agent.ReadTasks(strings.NewReader(string(taskJSON)), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := scripted.Read(strings.NewReader(string(script)))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var made []sandbox.Sandbox
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr, err := agent.Run(ctx, agent.Config{
		Task: tasks[0], EpisodeID: "ep", RolloutID: "r", GroupID: "g", Dir: t.TempDir(), Backend: "docker",
		Policy: pol, PolicyInfo: trajectory.Policy{Kind: "scripted"},
		NewSandbox: func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
			sb, err := b.Create(ctx, spec)
			if err == nil {
				mu.Lock()
				first := len(made) == 0
				made = append(made, sb)
				mu.Unlock()
				if first && during != nil {
					go during(sb)
				}
			}
			return sb, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return tr, made
}

var quick struct {
	once sync.Once
	b    *docker.Backend
	err  error
}

// quickBackend is the tests' engine with a liveness timeout of 5 s instead
// of 10, so a frozen guest costs the suite less.
func quickBackend(t *testing.T) *docker.Backend {
	need(t)
	quick.once.Do(func() {
		quick.b, quick.err = docker.New(context.Background(), docker.Options{GuestPath: env.guest, Owner: testOwner, GuestTimeout: 5 * time.Second})
	})
	if quick.err != nil {
		t.Fatal(quick.err)
	}
	return quick.b
}

func describeEnd(tr *trajectory.Trajectory) string {
	s := fmt.Sprintf("%s (%s)", tr.Termination.Reason, tr.Termination.Message)
	if tr.Reward != nil {
		s += fmt.Sprintf(", reward %v %v", *tr.Reward.Total, tr.Reward.Components)
	}
	for _, st := range tr.Steps {
		if st.Type == trajectory.StepTool && st.ErrorKind != nil {
			s += fmt.Sprintf("; step %d %s: %s", st.Index, *st.ErrorKind, st.Output)
		}
	}
	return s
}

func bash(cmd string) map[string]any {
	return map[string]any{"name": "bash", "arguments": map[string]any{"command": cmd}}
}

// An agent that breaks its own sandbox (kills or freezes the guest, garbles
// its stream) fails the episode: sandbox_abuse, reward 0 with a component
// saying why. Otherwise a policy learns that crashing the sandbox turns a 0
// into an unscored episode. Under runc the kernel protects PID 1 from these
// signals and /proc/1/fd is closed to commands, so the attack fails and the
// episode ends as it would have (finished, reward 1); gVisor lets all three
// through.
func TestAnAgentThatBreaksItsSandboxIsScoredZero(t *testing.T) {
	attacks := []struct {
		name     string
		calls    []map[string]any
		verifier string
	}{
		{"kill -KILL 1", []map[string]any{bash("kill -KILL 1; sleep 1")}, ""},
		{"kill -STOP 1", []map[string]any{bash("kill -STOP 1; sleep 1")}, ""},
		{"garbage written into the guest's stream", []map[string]any{bash("head -c 100000 /dev/urandom > /proc/1/fd/1; sleep 1")}, ""},
		{"a frame header that swallows the replies", []map[string]any{bash(`printf '\267\001\004\000\000\000\000\001\000\360\000\000' > /proc/1/fd/1; sleep 1`)}, ""},
		{"the verifier's command kills the guest", []map[string]any{bash("echo 'kill -KILL 1; sleep 1' > /work/check.sh")}, "sh /work/check.sh; test -f /work/ok"},
		{"the verifier's command freezes the guest", []map[string]any{bash("echo 'kill -STOP 1; sleep 1' > /work/check.sh")}, "sh /work/check.sh; test -f /work/ok"},
	}
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			for _, a := range attacks {
				t.Run(a.name, func(t *testing.T) {
					start := time.Now()
					tr, _ := abuseEpisode(t, quickBackend(t), rt, a.verifier, a.calls, nil)
					t.Logf("after %v: %s", time.Since(start).Round(time.Millisecond), describeEnd(tr))
					switch rt {
					case sandbox.RuntimeRunc:
						if tr.Termination.Reason != trajectory.EndFinished || tr.Reward == nil || *tr.Reward.Total != 1 {
							t.Errorf("under runc the attack cannot work; the episode must end as if it had not been tried: %s", describeEnd(tr))
						}
					case sandbox.RuntimeRunsc:
						if tr.Termination.Reason != trajectory.EndSandboxAbuse || tr.Reward == nil || *tr.Reward.Total != 0 ||
							len(tr.Reward.Components) != 1 || tr.Reward.Components[trajectory.AbuseComponent] != 0 {
							t.Errorf("want sandbox_abuse with reward 0 (component %s): %s", trajectory.AbuseComponent, describeEnd(tr))
						}
					}
					if d := time.Since(start); d > 30*time.Second {
						t.Errorf("the episode took %v: a frozen guest must be found by a bounded check, not by waiting", d)
					}
				})
			}
		})
	}
}

// A failure of the engine (the container killed or removed from outside)
// is not the agent's: the episode ends sandbox_error and is not scored,
// even though a command was running.
func TestAnEngineSideFailureStaysUnscored(t *testing.T) {
	outside := []struct {
		name string
		do   func(ctx context.Context, id string) error
	}{
		{"docker kill", func(ctx context.Context, id string) error {
			return need(t).Client().ContainerKill(ctx, id, "KILL")
		}},
		{"docker rm -f", func(ctx context.Context, id string) error {
			return need(t).Client().ContainerRemove(ctx, id, container.RemoveOptions{Force: true})
		}},
		{"docker pause", func(ctx context.Context, id string) error {
			return need(t).Client().ContainerPause(ctx, id)
		}},
	}
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			for _, o := range outside {
				t.Run(o.name, func(t *testing.T) {
					done := make(chan error, 1)
					tr, _ := abuseEpisode(t, quickBackend(t), rt, "", []map[string]any{bash("touch /tmp/sleeping; sleep 20")}, func(sb sandbox.Sandbox) {
						// Once the sleep has started (its command says so):
						// a fixed 3 s wait cost each case seconds.
						ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
						defer cancel()
						for ctx.Err() == nil {
							if _, err := sb.ReadFile(ctx, "/tmp/sleeping", 0); err == nil {
								break
							}
							time.Sleep(50 * time.Millisecond)
						}
						// runc cannot freeze a container while its shell
						// forks the sleep ("unable to freeze"): the engine
						// is asked again until it does what it is asked.
						var err error
						for range 20 {
							if err = o.do(context.Background(), sb.Info().ID); err == nil {
								break
							}
							time.Sleep(250 * time.Millisecond)
						}
						done <- err
					})
					if err := <-done; err != nil {
						t.Fatalf("%s: %v", o.name, err)
					}
					if tr.Termination.Reason != trajectory.EndSandboxError || tr.Reward != nil {
						t.Errorf("want sandbox_error, unscored: %s", describeEnd(tr))
					}
				})
			}
		})
	}
}
