package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/auditlog"
)

type stepAnswer struct {
	Results []struct {
		Output string `json:"output"`
	}
	Done bool
}

func bash(s *service, id, command string) (int, stepAnswer) {
	var r stepAnswer
	code, _ := s.do("POST", "/v1/episodes/"+id+"/step", map[string]any{"tool_calls": []map[string]any{
		{"name": "bash", "arguments": map[string]any{"command": command}}}}, &r)
	return code, r
}

// A fork of an open episode is n open episodes whose records start with
// the parent's steps (forked_from names the parent and the step) and whose
// sandboxes hold the parent's files; each goes on on its own, and so does
// the parent.
func TestForkBranchesAnOpenEpisodeIntoIndependentOnes(t *testing.T) {
	be, own := ownWasm(t)
	s := startService(t, "", own)
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": task("fork")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	if code, r := bash(s, opened.ID, "echo prefix > /work/state.txt; echo set up"); code != 200 || r.Results[0].Output != "set up\n" {
		t.Fatalf("prefix step: %d %+v", code, r)
	}
	var forked runtime.ForkResult
	if code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/fork", map[string]any{"n": 3}, &forked); code != 201 || len(forked.IDs) != 3 {
		t.Fatalf("fork: %d %+v", code, forked)
	}
	for i, id := range forked.IDs {
		var tr trajectory.Trajectory
		if code, _ := s.do("GET", "/v1/episodes/"+id, nil, &tr); code != 200 {
			t.Fatalf("GET child %d: %d", i, code)
		}
		if tr.ForkedFrom == nil || tr.ForkedFrom.EpisodeID != opened.ID || tr.ForkedFrom.Step != 2 || len(tr.Steps) != 2 || tr.EpisodeID != id {
			t.Errorf("child %d: forked_from %+v, %d steps", i, tr.ForkedFrom, len(tr.Steps))
		}
		if code, r := bash(s, id, fmt.Sprintf("cat /work/state.txt; echo child%d > /work/state.txt", i)); code != 200 || r.Results[0].Output != "prefix\n" {
			t.Errorf("child %d sees %d %+v, want the parent's file", i, code, r)
		}
	}
	if _, r := bash(s, opened.ID, "cat /work/state.txt"); r.Results[0].Output != "prefix\n" {
		t.Errorf("the parent sees %+v after its children wrote", r)
	}
	if _, r := bash(s, forked.IDs[1], "cat /work/state.txt"); r.Results[0].Output != "child1\n" {
		t.Errorf("child 1 sees %+v", r)
	}
	var fin struct{ Reward *trajectory.Reward }
	if code, _ := s.do("POST", "/v1/episodes/"+forked.IDs[0]+"/finish", map[string]any{"answer": "done"}, &fin); code != 200 || fin.Reward == nil || *fin.Reward.Total != 1 {
		t.Fatalf("finish child 0: %d %+v", code, fin.Reward)
	}
	doc, err := os.ReadFile(filepath.Join(s.data, "episodes", forked.IDs[0]+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := trajectory.Validate(doc); err != nil {
		t.Errorf("a forked record does not validate: %v", err)
	}
	tr, err := trajectory.Decode(doc)
	if err != nil {
		t.Fatal(err)
	}
	if tr.ForkedFrom == nil || len(tr.Steps) != 4 || !strings.Contains(tr.Steps[1].Output, "set up") {
		t.Errorf("child 0's record: forked_from %+v, %d steps", tr.ForkedFrom, len(tr.Steps))
	}
	var parent trajectory.Trajectory
	s.do("GET", "/v1/episodes/"+opened.ID, nil, &parent)
	if len(parent.Steps) != 4 || parent.ForkedFrom != nil {
		t.Errorf("the parent has %d steps, forked_from %+v: its children's steps leaked in", len(parent.Steps), parent.ForkedFrom)
	}
	for _, id := range append(forked.IDs[1:], opened.ID) {
		s.do("DELETE", "/v1/episodes/"+id, nil, nil)
	}
	if live := be.Live(); len(live) != 0 {
		t.Errorf("sandboxes left open: %v", live)
	}
}

func TestForkRefusesBadInputAndMakesNothing(t *testing.T) {
	be, own := ownWasm(t)
	s := startService(t, "", own, func(o *runtime.Options) { o.Limits.MaxEnvEpisodes = 4 })
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": task("fork-bad")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	var done struct{ ID string }
	s.do("POST", "/v1/episodes", map[string]any{"task": task("fork-done")}, &done)
	s.do("POST", "/v1/episodes/"+done.ID+"/finish", map[string]any{"answer": "done"}, nil)
	files := func() int { m, _ := filepath.Glob(filepath.Join(s.data, "episodes", "*")); return len(m) }
	before, liveBefore := files(), len(be.Live())
	tests := []struct {
		name   string
		id     string
		body   any
		status int
		field  string
		says   string
	}{
		{"an unknown episode", "e-nope", map[string]any{"n": 2}, http.StatusNotFound, "id", "e-nope"},
		{"an ended episode", done.ID, map[string]any{"n": 2}, http.StatusConflict, "id", done.ID + " has ended (finished)"},
		{"n of 0", opened.ID, map[string]any{"n": 0}, http.StatusBadRequest, "n", "between 1 and 256"},
		{"no n", opened.ID, map[string]any{}, http.StatusBadRequest, "n", "between 1 and"},
		{"an unknown field", opened.ID, map[string]any{"n": 1, "count": 2}, http.StatusBadRequest, "count", ""},
		{"more than the capacity left", opened.ID, map[string]any{"n": 4}, http.StatusTooManyRequests, "n", "3 more environment episodes can be open"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e apiErr
			code, _ := s.do("POST", "/v1/episodes/"+tt.id+"/fork", tt.body, &e)
			if code != tt.status || e.Error.Field != tt.field || !strings.Contains(e.Error.Message, tt.says) {
				t.Errorf("%d %+v, want %d naming %s: %q", code, e.Error, tt.status, tt.field, tt.says)
			}
		})
	}
	if after, live := files(), len(be.Live()); after != before || live != liveBefore {
		t.Errorf("refused forks made something: %d -> %d files, %d -> %d sandboxes", before, after, liveBefore, live)
	}
}

// failingFork is the real WASM backend whose sandboxes' forks fail after
// making some children: a backend failing midway.
type failingFork struct{ sandbox.Backend }

func (b failingFork) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := b.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return failingBox{sb}, nil
}

type failingBox struct{ sandbox.Sandbox }

func (f failingBox) Fork(ctx context.Context, n int) ([]sandbox.Sandbox, error) {
	kids, err := f.Sandbox.(sandbox.Forker).Fork(ctx, n-1)
	if err == nil {
		sandbox.CloseAll(kids) // the backend's own all-or-nothing
	}
	return nil, fmt.Errorf("fork: the engine went away after %d of %d: %w", n-1, n, sandbox.ErrEngineUnavailable)
}

func TestAForkThatFailsMidwayMakesNoEpisodeAndIsInfrastructure(t *testing.T) {
	be, own := ownWasm(t)
	s := startService(t, "", own, func(o *runtime.Options) {
		o.Backends = runtime.BackendFunc(func(context.Context, string) (sandbox.Backend, error) { return failingFork{be}, nil })
	})
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": task("fork-fail")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	entries, _ := os.ReadDir(filepath.Join(s.data, "episodes"))
	var e apiErr
	if code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/fork", map[string]any{"n": 3}, &e); code != http.StatusServiceUnavailable ||
		!strings.Contains(e.Error.Message, "nothing was made") {
		t.Fatalf("%d %+v", code, e)
	}
	after, _ := os.ReadDir(filepath.Join(s.data, "episodes"))
	if len(after) != len(entries) || len(be.Live()) != 1 {
		t.Errorf("a failed fork left %d records (had %d) and %d sandboxes", len(after), len(entries), len(be.Live()))
	}
	if code, r := bash(s, opened.ID, "echo still here"); code != 200 || r.Results[0].Output != "still here\n" {
		t.Errorf("the parent after a failed fork: %d %+v", code, r)
	}
}

// What an episode's own commands left in its sandbox can make a fork
// impossible (on Docker a file over the 64 MiB a fork copies). That is
// the episode's doing: a 409 naming the file, never a 503 counted as an
// infrastructure failure (the trainer would retry it, and count the
// agent's act as the infrastructure's), and the parent goes on.
func TestAForkTheEpisodesOwnFilesPreventIsAConflictNotInfrastructure(t *testing.T) {
	src := dockerBackends(t)
	s := startService(t, "", func(o *runtime.Options) { o.Backends = src })
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": dockerTask("fork-big")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	t.Cleanup(func() { s.do("DELETE", "/v1/episodes/"+opened.ID, nil, nil) })
	if code, r := bash(s, opened.ID, "head -c 70000000 /dev/zero > /work/big && echo made"); code != 200 || r.Results[0].Output != "made\n" {
		t.Fatalf("step: %d %+v", code, r)
	}
	metric := func() string {
		for _, l := range strings.Split(s.metrics(), "\n") {
			if strings.HasPrefix(l, `rollbox_sandbox_create_failures_total{backend="docker"}`) {
				return l
			}
		}
		return "none"
	}
	failures := metric()
	var e apiErr
	code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/fork", map[string]any{"n": 2}, &e)
	if code != http.StatusConflict || e.Error.Field != "id" || !strings.Contains(e.Error.Message, "/work/big") {
		t.Errorf("fork: %d %+v, want 409 naming /work/big", code, e.Error)
	}
	if after := metric(); after != failures {
		t.Errorf("the refused fork was counted as a sandbox failure: %v -> %v", failures, after)
	}
	if code, r := bash(s, opened.ID, "echo still here"); code != 200 || r.Results[0].Output != "still here\n" {
		t.Errorf("the parent after the refused fork: %d %+v", code, r)
	}
}

// A fork the episode's own commands make its sandbox fail (a 60 MB file in
// a 96 MB sandbox: the guest reading it for the copy is OOM-killed) is the
// episode's doing, a 409, not a 503 asking the trainer to retry (which it
// did forever: the broken verdict sticks) or to drop the group; and the
// episode's next step ends it sandbox_abuse, scored 0.
func TestAForkTheEpisodesCommandsBreakIsAConflictNotInfrastructure(t *testing.T) {
	src := dockerBackends(t)
	s := startService(t, "", func(o *runtime.Options) { o.Backends = src })
	tk := dockerTask("fork-oom")
	tk["sandbox"].(map[string]any)["limits"] = map[string]any{"memory_mb": 96, "disk_mb": 64}
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": tk}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	t.Cleanup(func() { s.do("DELETE", "/v1/episodes/"+opened.ID, nil, nil) })
	if code, r := bash(s, opened.ID, "head -c 60000000 /dev/urandom > /work/big && echo made"); code != 200 || r.Results[0].Output != "made\n" {
		t.Fatalf("step: %d %+v", code, r)
	}
	var e apiErr
	code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/fork", map[string]any{"n": 2}, &e)
	t.Logf("fork: %d %s", code, e.Error.Message)
	if code != http.StatusConflict {
		t.Errorf("fork: %d %+v, want 409: the episode's own commands broke its sandbox", code, e.Error)
	}
	var st struct {
		Done        bool
		Termination struct{ Reason string }
	}
	s.do("POST", "/v1/episodes/"+opened.ID+"/step", map[string]any{"tool_calls": []map[string]any{
		{"name": "bash", "arguments": map[string]any{"command": "echo still here"}}}}, &st)
	if !st.Done || st.Termination.Reason != trajectory.EndSandboxAbuse {
		t.Errorf("the parent's next step: %+v, want it ended %s (scored 0)", st, trajectory.EndSandboxAbuse)
	}
}

// An episode whose commands made more files than a copying fork takes
// (sandbox.MaxCopyEntries: the count is the agent's to choose, and each
// file costs the copy a guest request per child) gets a 409 at once,
// before any child is made, not a fork that holds the episode for minutes.
func TestAForkOfMoreFilesThanACopyTakesIsRefusedAtOnce(t *testing.T) {
	src := dockerBackends(t)
	s := startService(t, "", func(o *runtime.Options) { o.Backends = src })
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": dockerTask("fork-many")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	t.Cleanup(func() { s.do("DELETE", "/v1/episodes/"+opened.ID, nil, nil) })
	cmd := fmt.Sprintf("mkdir /work/many && cd /work/many && seq 1 %d | xargs touch && echo made", sandbox.MaxCopyEntries+1000)
	if code, r := bash(s, opened.ID, cmd); code != 200 || r.Results[0].Output != "made\n" {
		t.Fatalf("step: %d %+v", code, r)
	}
	start := time.Now()
	var e apiErr
	code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/fork", map[string]any{"n": 2}, &e)
	took := time.Since(start)
	if code != http.StatusConflict || e.Error.Field != "id" || !strings.Contains(e.Error.Message, fmt.Sprint(sandbox.MaxCopyEntries)) {
		t.Errorf("fork: %d %+v, want 409 naming the %d-file limit", code, e.Error, sandbox.MaxCopyEntries)
	}
	if took > 5*time.Second {
		t.Errorf("the refusal took %v", took)
	}
	if code, r := bash(s, opened.ID, "echo still here"); code != 200 || r.Results[0].Output != "still here\n" {
		t.Errorf("the parent after the refused fork: %d %+v", code, r)
	}
}

// The audit log names the episode each command ran for: a fork's
// commands are its own episode's, not the parent's (a security team
// reading the log would blame the parent for what a fork ran).
func TestTheAuditLogNamesAForksOwnEpisode(t *testing.T) {
	be, _ := ownWasm(t)
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := auditlog.Open(path, auditlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	audited := auditlog.Wrap(be, l)
	s := startService(t, "", func(o *runtime.Options) {
		o.Backends = runtime.BackendFunc(func(context.Context, string) (sandbox.Backend, error) { return audited, nil })
	})
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": task("fork-audit")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	bash(s, opened.ID, "echo parent-command")
	var forked runtime.ForkResult
	if code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/fork", map[string]any{"n": 2}, &forked); code != 201 {
		t.Fatalf("fork: %d", code)
	}
	for i, id := range forked.IDs {
		bash(s, id, fmt.Sprintf("echo child-command-%d", i))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]string{} // shell line -> episode
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec auditlog.Record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Op == auditlog.OpExec {
			ran[rec.Shell] = rec.Episode
		}
	}
	if got := ran["echo parent-command"]; got != opened.ID {
		t.Errorf("the parent's command is logged for %q, want %s", got, opened.ID)
	}
	for i, id := range forked.IDs {
		if got := ran[fmt.Sprintf("echo child-command-%d", i)]; got != id {
			t.Errorf("fork %d's command is logged for %q, want its own episode %s", i, got, id)
		}
	}
}
