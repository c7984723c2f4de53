package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// failing makes real sandboxes, failing the first n creates with err.
func failing(t *testing.T, n int64, err error) (agent.SandboxFactory, *atomic.Int64) {
	var calls atomic.Int64
	inner := wasmFactory(t)
	return func(ctx context.Context, backend string, spec sandbox.Spec) (sandbox.Sandbox, error) {
		if calls.Add(1) <= n {
			return nil, err
		}
		return inner(ctx, backend, spec)
	}, &calls
}

func TestAnOpenThatFailsSaysWhichStageAndWhetherTheInfrastructureFailed(t *testing.T) {
	tooBig := loadTask(t, `{"id": "big", "prompt": "p", "sandbox": {"limits": {"disk_mb": 1, "tmp_mb": 1}},
		"files_base64": {"/work/big": "`+bigBase64(3<<20)+`"}, "reward": {"type": "exact", "answer": "x"}}`)
	tests := []struct {
		name      string
		task      *agent.Task
		createErr error
		stage     string
		infra     bool
	}{
		{"an engine that failed", loadTask(t, calcTask), fmt.Errorf("the engine broke: %w", sandbox.ErrSandboxFailed), agent.StageCreate, true},
		{"an unreachable engine", loadTask(t, calcTask), fmt.Errorf("no engine: %w", sandbox.ErrEngineUnavailable), agent.StageCreate, true},
		{"a missing image", loadTask(t, calcTask), fmt.Errorf("image x: %w", sandbox.ErrImageNotFound), agent.StageCreate, false},
		{"an invalid spec", loadTask(t, calcTask), fmt.Errorf("bad: %w", sandbox.ErrInvalidSpec), agent.StageCreate, false},
		{"files that do not fit the sandbox", tooBig, nil, agent.StageSeed, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := int64(0)
			if tt.createErr != nil {
				n = 1
			}
			factory, _ := failing(t, n, tt.createErr)
			dir := t.TempDir()
			s, err := agent.Open(context.Background(), agent.Config{Task: tt.task, EpisodeID: "ep", Dir: dir, Backend: "wasm", NewSandbox: factory})
			var oe *agent.OpenError
			if !errors.As(err, &oe) {
				t.Fatalf("Open: %v, want an *agent.OpenError", err)
			}
			if oe.Stage != tt.stage || oe.Infra() != tt.infra {
				t.Errorf("stage %q infra %v, want %q %v (%v)", oe.Stage, oe.Infra(), tt.stage, tt.infra, oe)

			}
			if tt.createErr != nil && !errors.Is(err, tt.createErr) {
				t.Errorf("%v does not wrap the cause %v", err, tt.createErr)
			}
			tr, rerr := trajectory.Read(filepath.Join(dir, "ep.json"))
			if rerr != nil || tr.Termination.Reason != trajectory.EndSandboxError || tr.Reward != nil || s.Trajectory().Termination.Reason != trajectory.EndSandboxError {
				t.Errorf("record %+v (%v), want an unscored sandbox_error", tr, rerr)
			}
		})
	}
}

func bigBase64(n int) string {
	b := make([]byte, n*4/3+4)
	for i := range b {
		b[i] = 'A'
	}
	return string(b[:len(b)/4*4])
}

func TestAnOpenIsRetriedOnlyForTheInfrastructureAndKeepsTheFailedAttempts(t *testing.T) {
	t.Run("an infrastructure failure is retried; the failed attempt's record is kept aside", func(t *testing.T) {
		factory, creates := failing(t, 2, fmt.Errorf("the engine broke: %w", sandbox.ErrSandboxFailed))
		dir, attempts := t.TempDir(), t.TempDir()
		var retried []string
		tr, err := agent.Run(context.Background(), agent.Config{Task: loadTask(t, calcTask), EpisodeID: "ep", Dir: dir, Backend: "wasm",
			NewSandbox: factory, Policy: &turnsPolicy{turns: []agent.Turn{calls("finish", `{"answer": "x"}`)}},
			Retry: agent.Retry{Attempts: 3, Dir: attempts, Backoff: func(int) time.Duration { return time.Millisecond },
				OnRetry: func(n int, err *agent.OpenError) { retried = append(retried, fmt.Sprintf("%d %s", n, err.Stage)) }}})
		if err != nil {
			t.Fatal(err)
		}
		// Three opens, then the verifier's own fresh sandbox.
		if tr.Termination.Reason != trajectory.EndFinished || creates.Load() != 4 || len(retried) != 2 || retried[0] != "1 create" {
			t.Fatalf("end %s after %d creates, retries %v", tr.Termination.Reason, creates.Load(), retried)
		}
		for _, n := range []string{"ep.1.json", "ep.2.json"} {
			if a, err := trajectory.Read(filepath.Join(attempts, n)); err != nil || a.Termination.Reason != trajectory.EndSandboxError {
				t.Errorf("attempt %s: %v", n, err)
			}
		}
	})
	t.Run("the task's failure is not retried", func(t *testing.T) {
		factory, creates := failing(t, 5, fmt.Errorf("image x: %w", sandbox.ErrImageNotFound))
		dir, attempts := t.TempDir(), t.TempDir()
		_, err := agent.Open(context.Background(), agent.Config{Task: loadTask(t, calcTask), EpisodeID: "ep", Dir: dir, Backend: "wasm",
			NewSandbox: factory, Retry: agent.Retry{Attempts: 3, Dir: attempts}})
		var oe *agent.OpenError
		if !errors.As(err, &oe) || creates.Load() != 1 {
			t.Fatalf("%v after %d creates, want one attempt", err, creates.Load())
		}
		if m, _ := os.ReadDir(attempts); len(m) != 0 {
			t.Errorf("attempts kept: %v", m)
		}
	})
	t.Run("a context that ends during the pause ends the retries at once", func(t *testing.T) {
		factory, creates := failing(t, 100, fmt.Errorf("the engine broke: %w", sandbox.ErrSandboxFailed))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := agent.Open(ctx, agent.Config{Task: loadTask(t, calcTask), EpisodeID: "ep", Dir: t.TempDir(), Backend: "wasm",
			NewSandbox: factory, Retry: agent.Retry{Attempts: 10, Dir: t.TempDir(), Backoff: func(int) time.Duration { return time.Hour }}})
		var oe *agent.OpenError
		if !errors.As(err, &oe) || creates.Load() != 1 || time.Since(start) > 5*time.Second {
			t.Fatalf("%v after %d creates in %v", err, creates.Load(), time.Since(start))
		}
	})
}
