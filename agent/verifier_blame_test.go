package agent_test

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/monitor"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// Who is to blame when verification cannot run: what the agent left scores
// 0 (with the reason), the infrastructure's failures stay unscored, each
// retried once first. The sandboxes are real (WASM); the failures are
// injected around them where no real command can cause them on demand.

// roles sees every sandbox an episode makes: the first is the agent's, the
// others the verifier's.
type roles struct {
	mu    sync.Mutex
	n     int
	agent func(sandbox.Sandbox) sandbox.Sandbox
	// verifier wraps the verifier's i-th sandbox (i from 0), or fails it.
	verifier func(i int, sb sandbox.Sandbox) (sandbox.Sandbox, error)
}

func (r *roles) factory(t *testing.T) agent.SandboxFactory {
	base := wasmFactory(t)
	return func(ctx context.Context, b string, spec sandbox.Spec) (sandbox.Sandbox, error) {
		r.mu.Lock()
		i := r.n
		r.n++
		r.mu.Unlock()
		sb, err := base(ctx, b, spec)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			if spec.Labels[sandbox.LabelRole] == sandbox.RoleVerifier {
				t.Errorf("the agent's sandbox is labelled a verifier's")
			}
			if r.agent != nil {
				return r.agent(sb), nil
			}
			return sb, nil
		}
		if spec.Labels[sandbox.LabelRole] != sandbox.RoleVerifier {
			t.Errorf("the verifier's sandbox is not labelled: %v", spec.Labels)
		}
		if r.verifier != nil {
			w, err := r.verifier(i-1, sb)
			if err != nil {
				sb.Close()
				return nil, err
			}
			return w, nil
		}
		return sb, nil
	}
}

func (r *roles) made() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// brokenFiles fails every file call once broken is set, as a sandbox whose
// guest died does.
type brokenFiles struct {
	sandbox.Sandbox
	broken atomic.Bool
	err    error
}

func (b *brokenFiles) ListFiles(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	if b.broken.Load() {
		return nil, b.err
	}
	return b.Sandbox.ListFiles(ctx, dir)
}

func (b *brokenFiles) ReadFile(ctx context.Context, p string, max int64) ([]byte, error) {
	if b.broken.Load() {
		return nil, b.err
	}
	return b.Sandbox.ReadFile(ctx, p, max)
}

var errGuestDied = fmt.Errorf("guest connection lost: %w", sandbox.ErrSandboxFailed)

func fixAndFinish() *turnsPolicy {
	return &turnsPolicy{turns: []agent.Turn{bash(honestPy), finish}}
}

func TestAnAgentSandboxThatBreaksBeforeItsFilesAreReadIsTheAgentsFailure(t *testing.T) {
	var agentSB *brokenFiles
	r := &roles{agent: func(sb sandbox.Sandbox) sandbox.Sandbox {
		agentSB = &brokenFiles{Sandbox: sb, err: errGuestDied}
		return agentSB
	}}
	task := attackTask(t, "wasm-py", "")
	p := &turnsPolicy{turns: []agent.Turn{bash(honestPy), finish}}
	tr := runEpisode(t, task, &breakingPolicy{turnsPolicy: p, before: 1, breakIt: func() { agentSB.broken.Store(true) }},
		func(c *agent.Config) { c.NewSandbox = r.factory(t) })
	if tr.Termination.Reason != trajectory.EndSandboxAbuse || tr.Reward == nil || *tr.Reward.Total != 0 {
		t.Fatalf("termination %+v reward %+v, want sandbox_abuse scored 0", tr.Termination, tr.Reward)
	}
	if !strings.Contains(tr.Termination.Message, "fresh sandbox of the same spec works") {
		t.Errorf("message %q does not say why it is the episode's", tr.Termination.Message)
	}
}

// The 0 of an episode that broke its sandbox stands: a monitor's penalty
// does not take it lower (as in a rescore), though the monitor is recorded.
func TestAnEpisodeThatBrokeItsSandboxTakesNoMonitorPenalty(t *testing.T) {
	var agentSB *brokenFiles
	r := &roles{agent: func(sb sandbox.Sandbox) sandbox.Sandbox {
		agentSB = &brokenFiles{Sandbox: sb, err: errGuestDied}
		return agentSB
	}}
	task := attackTask(t, "wasm-py", "")
	task.Monitors = &monitor.Config{Penalties: map[string]float64{trajectory.MonitorRepeatedCalls: 0.25}}
	p := &turnsPolicy{turns: []agent.Turn{bash("true"), bash("true"), finish}}
	tr := runEpisode(t, task, &breakingPolicy{turnsPolicy: p, before: 2, breakIt: func() { agentSB.broken.Store(true) }},
		func(c *agent.Config) { c.NewSandbox = r.factory(t) })
	if tr.Termination.Reason != trajectory.EndSandboxAbuse || tr.Reward == nil || *tr.Reward.Total != 0 {
		t.Fatalf("termination %+v reward %+v, want sandbox_abuse scored 0", tr.Termination, tr.Reward)
	}
	if tr.Monitors == nil || tr.Monitors.RepeatedCalls == nil || *tr.Monitors.RepeatedCalls != 1 {
		t.Errorf("monitors %+v, want repeated_calls 1", tr.Monitors)
	}
	if _, ok := tr.Reward.Components["monitor."+trajectory.MonitorRepeatedCalls]; ok {
		t.Errorf("the 0 of a broken sandbox took a penalty: %v", tr.Reward.Components)
	}
}

func TestAnAgentSandboxThatBreaksWhileTheEngineIsDownIsUnscored(t *testing.T) {
	var agentSB *brokenFiles
	r := &roles{
		agent: func(sb sandbox.Sandbox) sandbox.Sandbox {
			agentSB = &brokenFiles{Sandbox: sb, err: errGuestDied}
			return agentSB
		},
		verifier: func(int, sandbox.Sandbox) (sandbox.Sandbox, error) {
			return nil, fmt.Errorf("engine down: %w", sandbox.ErrEngineUnavailable)
		},
	}
	p := &turnsPolicy{turns: []agent.Turn{bash(honestPy), finish}}
	tr := runEpisode(t, attackTask(t, "wasm-py", ""), &breakingPolicy{turnsPolicy: p, before: 1, breakIt: func() { agentSB.broken.Store(true) }},
		func(c *agent.Config) { c.NewSandbox = r.factory(t) })
	if tr.Termination.Reason != trajectory.EndSandboxError || tr.Reward != nil {
		t.Fatalf("termination %+v reward %+v, want sandbox_error unscored", tr.Termination, tr.Reward)
	}
	if got := r.made(); got != 3 {
		t.Errorf("%d sandboxes made, want the agent's and two tries of the verifier's", got)
	}
}

func TestAVerifierSandboxThatFailsToStartIsRetriedOnceThenUnscored(t *testing.T) {
	for _, failures := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d failure(s)", failures), func(t *testing.T) {
			r := &roles{verifier: func(i int, sb sandbox.Sandbox) (sandbox.Sandbox, error) {
				if i < failures {
					return nil, fmt.Errorf("image missing: %w", sandbox.ErrImageNotFound)
				}
				return sb, nil
			}}
			tr := runEpisode(t, attackTask(t, "wasm-py", ""), fixAndFinish(), func(c *agent.Config) { c.NewSandbox = r.factory(t) })
			switch failures {
			case 1:
				if tr.Reward == nil || *tr.Reward.Total != 1 || tr.Reward.Verifier.Attempts != 2 {
					t.Fatalf("termination %+v reward %+v, want the honest fix scored 1 on the second try", tr.Termination, tr.Reward)
				}
			case 2:
				if tr.Termination.Reason != trajectory.EndSandboxError || tr.Reward != nil || !strings.Contains(tr.Termination.Message, "tried twice") {
					t.Fatalf("termination %+v reward %+v, want sandbox_error unscored", tr.Termination, tr.Reward)
				}
			}
		})
	}
}

// dyingWith fails its Exec when the agent's marker file is in the sandbox:
// code the agent left that kills the verifier's sandbox.
type dyingWith struct {
	sandbox.Sandbox
	marker string
	always bool
}

func (d *dyingWith) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Result, error) {
	if _, err := d.Sandbox.ReadFile(ctx, d.marker, 0); err == nil || d.always {
		return sandbox.Result{}, errGuestDied
	}
	return d.Sandbox.Exec(ctx, req)
}

func TestAVerifierSandboxThatFailsOnlyWithTheAgentsFilesIsTheAgentsFailure(t *testing.T) {
	for _, always := range []bool{false, true} {
		t.Run(fmt.Sprintf("fails without them too: %v", always), func(t *testing.T) {
			r := &roles{verifier: func(i int, sb sandbox.Sandbox) (sandbox.Sandbox, error) {
				return &dyingWith{Sandbox: sb, marker: "/work/killer.py", always: always}, nil
			}}
			tr := runEpisode(t, attackTask(t, "wasm-py", ""), &turnsPolicy{turns: []agent.Turn{write("/work/killer.py", "x = 1\n"), finish}},
				func(c *agent.Config) { c.NewSandbox = r.factory(t) })
			if got := r.made(); got != 4 {
				t.Errorf("%d sandboxes made, want the agent's, two verifiers and a control", got)
			}
			if always {
				if tr.Termination.Reason != trajectory.EndSandboxError || tr.Reward != nil {
					t.Fatalf("termination %+v reward %+v, want sandbox_error unscored", tr.Termination, tr.Reward)
				}
				return
			}
			if tr.Termination.Reason != trajectory.EndSandboxAbuse || tr.Reward == nil || *tr.Reward.Total != 0 {
				t.Fatalf("termination %+v reward %+v, want sandbox_abuse scored 0", tr.Termination, tr.Reward)
			}
		})
	}
}

// fullDisk refuses the agent's files as a full disk does.
type fullDisk struct{ sandbox.Sandbox }

func (f *fullDisk) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	if strings.HasPrefix(p, "/work/fill") {
		return fmt.Errorf("write %s: no space left: %w", p, sandbox.ErrTooLarge)
	}
	return f.Sandbox.WriteFile(ctx, p, data, mode)
}

func TestWhatTheAgentLeftThatCannotBeVerifiedScoresZero(t *testing.T) {
	t.Parallel() // WASM sandboxes of its own, beside the gVisor test
	t.Run("files that do not fit the verifier's sandbox", func(t *testing.T) {
		r := &roles{verifier: func(i int, sb sandbox.Sandbox) (sandbox.Sandbox, error) { return &fullDisk{sb}, nil }}
		tr := runEpisode(t, attackTask(t, "wasm-py", ""), &turnsPolicy{turns: []agent.Turn{bash(honestPy), write("/work/fill1", "x"), finish}},
			func(c *agent.Config) { c.NewSandbox = r.factory(t) })
		if tr.Termination.Reason != trajectory.EndFinished || tr.Reward == nil || *tr.Reward.Total != 0 ||
			!strings.Contains(tr.Reward.Verifier.Blame, "do not fit") {
			t.Fatalf("termination %+v reward %+v", tr.Termination, tr.Reward)
		}
	})
	t.Run("a workspace with more files than the verifier reads", func(t *testing.T) {
		// The shell's own mkdir, seq, xargs and touch make the files (in
		// this process: python in WASM took 15-35 s for them).
		tr := runEpisode(t, attackTask(t, "wasm-py", ""), &turnsPolicy{turns: []agent.Turn{bash(honestPy),
			bash("mkdir /work/junk && cd /work/junk && seq 10001 | xargs touch && ls | wc -l"), finish}})
		if tr.Termination.Reason != trajectory.EndFinished || tr.Reward == nil || *tr.Reward.Total != 0 ||
			!strings.Contains(tr.Reward.Verifier.Blame, "more than 10000 files") {
			t.Fatalf("termination %+v reward %+v", tr.Termination, tr.Reward)
		}
	})
}

// breakingPolicy plays turns and calls breakIt before turn number before.
type breakingPolicy struct {
	*turnsPolicy
	before  int
	breakIt func()
	once    sync.Once
}

func (p *breakingPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	if req.Turn == p.before {
		p.once.Do(p.breakIt)
	}
	return p.turnsPolicy.Next(ctx, req)
}
