package judge

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseReadsJSONOrTextScoresOnTheScale(t *testing.T) {
	ten := Scale{Min: 1, Max: 10}
	labels := Scale{Labels: []Label{{"poor", 0}, {"fair", 1}, {"good", 2}}}
	for _, tt := range []struct {
		name   string
		text   string
		scale  Scale
		raw    string
		score  float64
		reason string
		how    string
	}{
		{"a plain JSON object", `{"score": 7, "reason": "mostly right"}`, ten, "7", 6.0 / 9, "mostly right", ParsedJSON},
		{"JSON in a code fence with prose", "Here is my evaluation:\n```json\n{\"rating\": \"8/10\", \"explanation\": \"clean\"}\n```\nThanks.", ten, "8/10", 7.0 / 9, "clean", ParsedJSON},
		{"JSON nested under the rubric's name", `{"correctness": {"score": 10, "reason": "all tests"}}`, ten, "10", 1, "all tests", ParsedJSON},
		{"JSON with a scores map", `{"scores": {"correctness": 4}, "reason": "weak"}`, ten, "4", 3.0 / 9, "weak", ParsedJSON},
		{"the last JSON object wins", `draft {"score": 2} final {"score": 9, "reason": "on reflection"}`, ten, "9", 8.0 / 9, "on reflection", ParsedJSON},
		{"a numeric string", `{"score": "5", "reason": "meh"}`, ten, "5", 4.0 / 9, "meh", ParsedJSON},
		{"Score: 7/10 text", "The code is fine but untested.\nScore: 7/10", ten, "7/10", 6.0 / 9, "The code is fine but untested.\nScore: 7/10", ParsedText},
		{"bold markdown and out of", "**Rating**: 8 out of 10\nReason: tidy diff", ten, "8/10", 7.0 / 9, "tidy diff", ParsedText},
		{"the last score line wins", "Score: 3/10 at first glance.\nAfter reading the tests, Score: 6/10", ten, "6/10", 5.0 / 9, "", ParsedText},
		{"a bare fraction at the end", "Overall I would give this a 9/10.", ten, "9/10", 8.0 / 9, "", ParsedText},
		{"a think block is ignored", "<think>Score: 1/10? no.</think>{\"score\": 6}", ten, "6", 5.0 / 9, "", ParsedJSON},
		{"a label in JSON", `{"verdict": "Good", "reason": "solid"}`, labels, "good", 1, "solid", ParsedJSON},
		{"a label in text", "Verdict: fair, because half of it works", labels, "fair", 0.5, "", ParsedText},
		{"a label's value as a number", `{"score": 0}`, labels, "0", 0, "", ParsedJSON},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(tt.text, "correctness", tt.scale)
			if err != nil {
				t.Fatal(err)
			}
			if p.Raw != tt.raw || math.Abs(p.Score-tt.score) > 1e-9 || p.How != tt.how {
				t.Errorf("got %+v, want raw %q score %v how %s", p, tt.raw, tt.score, tt.how)
			}
			if tt.reason != "" && p.Reason != tt.reason {
				t.Errorf("reason %q, want %q", p.Reason, tt.reason)
			}
		})
	}
}

func TestParseRefusesGarbageAndScoresOffTheScale(t *testing.T) {
	ten := Scale{Min: 1, Max: 10}
	labels := Scale{Labels: []Label{{"poor", 0}, {"good", 1}}}
	for _, tt := range []struct {
		name, text string
		scale      Scale
		want       string
	}{
		{"no score at all", "I cannot evaluate this.", ten, "no score"},
		{"empty", "", ten, "no score"},
		{"a score above the scale", `{"score": 11}`, ten, "outside the scale"},
		{"a score below the scale", "Score: 0/10", ten, "outside the scale"},
		{"a fraction of another scale", "Score: 4/5", ten, "not on the scale"},
		{"a label not on the scale", `{"score": "excellent"}`, labels, "no score"},
		{"a number not among the labels", `{"score": 0.5}`, labels, "not a value of the scale"},
		{"a truncated JSON object", `{"score": 7, "reason": "cut off`, ten, "no score"},
		{"only a think block", "<think>Score: 9/10</think>", ten, "no score"},
		{"binary noise", "\x00\xff\xfe{{{", ten, "no score"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(tt.text, "correctness", tt.scale)
			if err == nil {
				t.Fatalf("parsed %+v", p)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want %q", err, tt.want)
			}
			if tt.want == "no score" && !errors.Is(err, ErrNoScore) {
				t.Errorf("err %v is not ErrNoScore", err)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"score": 7}`, "Score: 7/10", "<think>x</think>9/10", `{"a":{"score":"3"}}`, "{{{"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s, "r", Scale{Min: 1, Max: 10})
		if err == nil && (p.Score < 0 || p.Score > 1 || math.IsNaN(p.Score)) {
			t.Fatalf("score %v off 0..1 from %q", p.Score, s)
		}
	})
}
