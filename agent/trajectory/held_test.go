package trajectory

import (
	"bytes"
	"encoding/json"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A running episode's steps are in its journal, not in memory: a step is a
// 600-byte struct and the strings it points to (the policy's raw answer
// among them), and thousands of episodes running at once held them all
// until they ended. The record read whole (Trajectory, End, the final
// document) has every step exactly as it was given.
func TestAWriterHoldsItsStepsInTheJournalNotInMemory(t *testing.T) {
	const n, rawSize = 64, 16 << 10
	raw := `{"id":"x","choices":[{"message":{"content":"` + strings.Repeat("a", rawSize) + `"}}]}`
	exit := 0
	steps := func(i int) Step {
		at := time.Unix(1_700_000_000+int64(i), 123456789).UTC()
		if i%2 == 0 {
			return Step{Type: StepModel, Turn: i / 2, StartedAt: at, DurationMS: 12.5, Content: "thinking",
				ToolCalls:    []ToolCall{{ID: "c1", Name: "bash", Arguments: `{"command":"true"}`, Parsed: []byte(`{"command":"true"}`)}},
				FinishReason: "tool_calls", Model: "m", Usage: &Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12},
				Raw: []byte(raw), Attempts: 1, Tokens: TokensReported}
		}
		ok := true
		return Step{Type: StepTool, Turn: i / 2, StartedAt: at, DurationMS: 0.25, CallID: "c1", Name: "bash",
			Arguments: []byte(`{"command":"true"}`), OK: &ok, ExitCode: &exit, Output: "out <&> é",
			Stdout: NewBytes([]byte{0xff, 'x'}), Stderr: NewBytes([]byte("err\n")), Files: map[string]string{"/w/a": "sha"}}
	}
	w, err := NewWriter(t.TempDir(), &Trajectory{EpisodeID: "ep1", TaskID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	before := liveHeap()
	for i := range n {
		if _, err := w.Step(steps(i)); err != nil {
			t.Fatal(err)
		}
	}
	held := int64(liveHeap()) - int64(before)
	runtime.KeepAlive(w)
	if w.Steps() != n {
		t.Errorf("Steps() = %d, want %d", w.Steps(), n)
	}
	t.Logf("%d steps (%d of them with a %d KiB raw answer) written: %d KiB live", n, n/2, rawSize>>10, held>>10)
	if held > n/2*rawSize/4 {
		t.Errorf("the writer holds %d KiB after %d steps whose raw answers are %d KiB in all: it keeps them in memory", held>>10, n, n/2*rawSize>>10)
	}
	// The final document is indented (its raw JSON fields too): it is
	// compared as JSON.
	check := func(what string, got []Step, asJSON bool) {
		t.Helper()
		if len(got) != n {
			t.Fatalf("%s: %d steps, want %d", what, len(got), n)
		}
		for i, st := range got {
			want := steps(i)
			want.Index = i
			if asJSON {
				a, _ := json.Marshal(st)
				b, _ := json.Marshal(want)
				if !bytes.Equal(a, b) {
					t.Errorf("%s: step %d is\n%s\nwant\n%s", what, i, a, b)
				}
				continue
			}
			if !reflect.DeepEqual(st, want) {
				t.Errorf("%s: step %d is\n%+v\nwant\n%+v", what, i, st, want)
			}
		}
	}
	check("Trajectory()", w.Trajectory().Steps, false)
	if _, err := w.Step(steps(n)); err != nil { // after the record was read whole
		t.Fatal(err)
	}
	if err := w.End(&Termination{Reason: EndFinished}, nil, Stats{}); err != nil {
		t.Fatal(err)
	}
	if got := w.Trajectory().Steps; len(got) != n+1 || got[n].Index != n {
		t.Errorf("after a step more and End: %d steps", len(got))
	}
	tr, err := Read(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	check("the final document", tr.Steps[:n], true)
}

// liveHeap is the live heap after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
