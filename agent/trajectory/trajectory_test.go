package trajectory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/internal/tmpfs"
)

func TestBytesSurviveJSONLosslessly(t *testing.T) {
	for _, b := range [][]byte{[]byte("plain text\n"), {0xff, 0xfe, 0, 'a'}, {}, []byte("é\xc3")} {
		in := Bytes(b)
		data, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var out Bytes
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, b) {
			t.Errorf("%q round-tripped to %q via %s", b, out, data)
		}
	}
}

func TestWriterJournalsStepsAndRecoverMarksInterrupted(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir, &Trajectory{EpisodeID: "ep1", TaskID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	w.SetSandbox(Sandbox{Backend: "wasm"})
	w.Step(Step{Type: StepModel, Content: "hi"})
	w.Step(Step{Type: StepTool, Name: "bash", Output: "out", Stdout: NewBytes([]byte{0xff})})
	// Simulate a crash with a torn last line.
	f, _ := os.OpenFile(filepath.Join(dir, "ep1"+PartialSuffix), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"k":"step","v":{"ty`)
	f.Close()

	got, _, err := RecoverDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("recovered %d", len(got))
	}
	tr, err := Read(filepath.Join(dir, "ep1.json"))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Termination == nil || tr.Termination.Reason != EndInterrupted || len(tr.Steps) != 2 || tr.Sandbox.Backend != "wasm" {
		t.Fatalf("recovered %+v", tr)
	}
	if !bytes.Equal(*tr.Steps[1].Stdout, []byte{0xff}) {
		t.Errorf("stdout %q", *tr.Steps[1].Stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "ep1"+PartialSuffix)); !os.IsNotExist(err) {
		t.Errorf("journal not removed: %v", err)
	}
}

func TestWriterEndWritesTheFinalDocument(t *testing.T) {
	dir := t.TempDir()
	w, _ := NewWriter(dir, &Trajectory{EpisodeID: "ep2"})
	w.Step(Step{Type: StepModel})
	if err := w.End(&Termination{Reason: EndFinished}, &Reward{Total: Score(1), Components: map[string]float64{"tests": 1}}, Stats{Turns: 1}); err != nil {
		t.Fatal(err)
	}
	tr, err := Read(w.Path())
	if err != nil || *tr.Reward.Total != 1 || tr.Schema != Schema {
		t.Fatalf("%+v %v", tr, err)
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, "*.partial")); len(matches) != 0 {
		t.Errorf("journal left: %v", matches)
	}
}

func TestReadRefusesANewerSchema(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.json")
	os.WriteFile(p, []byte(`{"schema": "rollbox.trajectory/v2"}`), 0o644)
	if _, err := Read(p); !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("err = %v", err)
	}
}

func TestARecordThatCannotBeWrittenLeavesNothingBehind(t *testing.T) {
	dir := tmpfs.Mount(t, 256<<10)
	filler := filepath.Join(dir, "filler")
	tmpfs.Fill(t, filler, 1<<30)
	if w, err := NewWriter(dir, &Trajectory{EpisodeID: "full-at-start"}); err == nil {
		t.Fatalf("NewWriter on a full disk: %v", w)
	}
	os.Remove(filler)
	w, err := NewWriter(dir, &Trajectory{EpisodeID: "full-at-end"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Step(Step{Type: StepModel, Content: "hi"}); err != nil {
		t.Fatal(err)
	}
	tmpfs.Fill(t, filler, 1<<30)
	big := strings.Repeat("x", 64<<10) // more than the journal's last page can take
	if err := w.End(&Termination{Reason: EndFinished, Message: big}, nil, Stats{}); err == nil {
		t.Fatal("End on a full disk succeeded")
	}
	os.Remove(filler)
	left, _ := filepath.Glob(filepath.Join(dir, "full-at-*"))
	if len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

func TestRecoverDirDropsEmptyJournalsAndHalfWrittenDocuments(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "empty"+PartialSuffix), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "torn"+PartialSuffix), []byte(`{"k":"head`), 0o644)
	os.WriteFile(filepath.Join(dir, "half.json"+tmpSuffix), []byte(`{"sch`), 0o644)
	w, _ := NewWriter(dir, &Trajectory{EpisodeID: "ended"})
	w.End(&Termination{Reason: EndFinished}, nil, Stats{})
	os.WriteFile(filepath.Join(dir, "ended"+PartialSuffix), []byte(`{"k":"header","v":{"episode_id":"ended"}}`+"\n"), 0o644)

	got, dropped, err := RecoverDir(dir)
	if err != nil || len(got) != 0 {
		t.Fatalf("recovered %d: %v", len(got), err)
	}
	sort.Strings(dropped)
	if strings.Join(dropped, " ") != "empty torn" {
		t.Errorf("dropped %v", dropped)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(names) != 1 || filepath.Base(names[0]) != "ended.json" {
		t.Errorf("left %v", names)
	}
	if tr, err := Read(filepath.Join(dir, "ended.json")); err != nil || tr.Termination.Reason != EndFinished {
		t.Errorf("the ended episode's document was replaced: %+v %v", tr, err)
	}
}

func TestRecoveredStatsCountTruncatedStepsBesideErrorKinds(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir, &Trajectory{EpisodeID: "ep3", TaskID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	nonzero, truncatedKind := "nonzero_exit", "output_truncated"
	w.Step(Step{Type: StepTool, Name: "bash", ErrorKind: &nonzero, Truncated: true, BytesDropped: 900})
	w.Step(Step{Type: StepTool, Name: "bash", ErrorKind: &nonzero})
	w.Step(Step{Type: StepTool, Name: "python", ErrorKind: &truncatedKind, BytesDropped: 10}) // capped, not cut
	w.Step(Step{Type: StepTool, Name: "read_file"})
	if _, _, err := RecoverDir(dir); err != nil {
		t.Fatal(err)
	}
	tr, err := Read(filepath.Join(dir, "ep3.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := Truncations{Total: 2, Tools: map[string]int{"bash": 1, "python": 1}}
	if tr.Stats.Truncated == nil || !reflect.DeepEqual(*tr.Stats.Truncated, want) || tr.Stats.ToolErrors["nonzero_exit"] != 2 {
		t.Errorf("stats: truncated %+v, tool errors %v; want %+v beside nonzero_exit=2", tr.Stats.Truncated, tr.Stats.ToolErrors, want)
	}
}

// A sub-episode's turns are the frozen sub-agent policy's: its token
// segments keep their ids with loss mask 0 throughout, an orchestrator's
// keep 1 on its sampled ids.
func TestASubEpisodesTokenSegmentsAreFrozen(t *testing.T) {
	seg := 0
	steps := []Step{{Type: StepModel, Segment: &seg, PromptIDs: []int64{1, 2}, CompletionIDs: []int64{3, 4}}}
	for _, parent := range []*Parent{nil, {EpisodeID: "o", Step: 1}} {
		w, err := NewWriter(t.TempDir(), &Trajectory{EpisodeID: "e", Parent: parent})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range steps {
			if _, err := w.Step(s); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.End(&Termination{Reason: EndFinished}, nil, Stats{}); err != nil {
			t.Fatal(err)
		}
		got := w.Trajectory().Segments
		want := "[0 0 1 1]"
		if parent != nil {
			want = "[0 0 0 0]"
		}
		if len(got) != 1 || fmt.Sprint(got[0].Ids) != "[1 2 3 4]" || fmt.Sprint(got[0].LossMask) != want {
			t.Errorf("parent %v: segments %+v, want loss mask %s", parent, got, want)
		}
	}
}
