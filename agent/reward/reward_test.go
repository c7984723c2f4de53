package reward

import (
	"context"
	"math"
	"testing"
)

func TestFbetaWeighsRecallOverPrecision(t *testing.T) {
	s := Spec{Type: "fbeta", Relevant: []string{"a", "b", "c", "d"}}
	tests := []struct {
		name string
		ids  []string
		want float64
	}{
		{"all relevant and nothing else", []string{"a", "b", "c", "d"}, 1},
		{"nothing given", nil, 0},
		{"all relevant plus as many wrong", []string{"a", "b", "c", "d", "w", "x", "y", "z"}, (17 * 0.5 * 1) / (16*0.5 + 1)},
		{"half the relevant ones only", []string{"a", "b"}, (17 * 1 * 0.5) / (16*1 + 0.5)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Evaluate(context.Background(), s, Input{IDs: tt.ids})
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(*r.Total-tt.want) > 1e-9 {
				t.Errorf("total = %v, want %v", *r.Total, tt.want)
			}
		})
	}
}

func TestFbetaProcessTermsAreRecorded(t *testing.T) {
	s := Spec{Type: "fbeta", Relevant: []string{"a", "b"}, TrajectoryRecallWeight: 0.5, PrunePenalty: 0.1, PruneFree: 1}
	r, err := Evaluate(context.Background(), s, Input{IDs: []string{"a"}, SeenIDs: []string{"a", "b", "x"}, PruneSizes: []int{1, 1, 1, 3}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Components["trajectory_recall"] != 1 || math.Abs(r.Components["prune_penalty"]+0.2) > 1e-9 {
		t.Errorf("components = %v", r.Components)
	}
	want := r.Components["fbeta"] + 0.5 - 0.2
	if math.Abs(*r.Total-want) > 1e-9 {
		t.Errorf("total = %v, want %v", *r.Total, want)
	}
}

func TestExactRegexAndCompositeScoreTheAnswer(t *testing.T) {
	ans := func(s string) *string { return &s }
	tests := []struct {
		name   string
		spec   Spec
		answer *string
		want   float64
	}{
		{"exact ignores surrounding whitespace", Spec{Type: "exact", Answer: "42"}, ans(" 42\n"), 1},
		{"exact is case-sensitive by default", Spec{Type: "exact", Answer: "Paris"}, ans("paris"), 0},
		{"exact may fold case", Spec{Type: "exact", Answer: "Paris", CaseInsensitive: true}, ans("paris"), 1},
		{"no answer scores zero", Spec{Type: "exact", Answer: "42"}, nil, 0},
		{"regex matches", Spec{Type: "regex", Pattern: `^\d+$`}, ans("123"), 1},
		{"regex refuses", Spec{Type: "regex", Pattern: `^\d+$`}, ans("12a"), 0},
		{"composite weighs its parts", Spec{Type: "composite", Parts: []Part{
			{Name: "right", Weight: 3, Reward: Spec{Type: "exact", Answer: "x"}},
			{Name: "short", Weight: 1, Reward: Spec{Type: "regex", Pattern: `^.{0,3}$`}},
		}}, ans("y"), 0.25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.spec.Validate("reward"); err != nil {
				t.Fatal(err)
			}
			r, err := Evaluate(context.Background(), tt.spec, Input{Answer: tt.answer})
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(*r.Total-tt.want) > 1e-9 {
				t.Errorf("total = %v (components %v), want %v", *r.Total, r.Components, tt.want)
			}
		})
	}
}

func TestFbetaCountsAChunkAsItsRelevantDocumentOnce(t *testing.T) {
	s := Spec{Type: "fbeta", Relevant: []string{"net/http", "bufio"}, TrajectoryRecallWeight: 0.25}
	r, err := Evaluate(context.Background(), s, Input{
		IDs:     []string{"net/http#2", "net/http#3", "bufio"},
		SeenIDs: []string{"net/http#1", "bufio#7", "other#1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Components["precision"] != 1 || r.Components["recall"] != 1 || r.Components["trajectory_recall"] != 1 {
		t.Errorf("components = %v", r.Components)
	}
	if math.Abs(*r.Total-1.25) > 1e-9 {
		t.Errorf("total = %v", *r.Total)
	}
	// A chunk-like id of a document that is not relevant stays itself.
	r, _ = Evaluate(context.Background(), s, Input{IDs: []string{"bufio", "net/url#1", "bufio#x"}})
	if math.Abs(r.Components["precision"]-1.0/3) > 1e-9 {
		t.Errorf("precision = %v", r.Components["precision"])
	}
}

func TestFbetaRecordsEveryComponentEvenUnweighted(t *testing.T) {
	r, err := Evaluate(context.Background(), Spec{Type: "fbeta", Relevant: []string{"a", "b"}},
		Input{IDs: []string{"a"}, SeenIDs: []string{"a", "b"}, PruneSizes: []int{1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"fbeta", "precision", "recall", "trajectory_recall", "prune_penalty"} {
		if _, ok := r.Components[k]; !ok {
			t.Errorf("component %s missing: %v", k, r.Components)
		}
	}
	if r.Components["trajectory_recall"] != 1 || r.Components["prune_penalty"] != 0 || math.Abs(*r.Total-r.Components["fbeta"]) > 1e-9 {
		t.Errorf("unweighted terms changed the total: %v", r)
	}
	// beta 4 by default: recall counts 16 times precision.
	if want := 17 * 1 * 0.5 / (16*1 + 0.5); math.Abs(r.Components["fbeta"]-want) > 1e-9 {
		t.Errorf("fbeta = %v, want %v", r.Components["fbeta"], want)
	}
}
