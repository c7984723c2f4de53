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
			if math.Abs(r.Total-tt.want) > 1e-9 {
				t.Errorf("total = %v, want %v", r.Total, tt.want)
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
	if math.Abs(r.Total-want) > 1e-9 {
		t.Errorf("total = %v, want %v", r.Total, want)
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
			if math.Abs(r.Total-tt.want) > 1e-9 {
				t.Errorf("total = %v (components %v), want %v", r.Total, r.Components, tt.want)
			}
		})
	}
}
