package testreport

import (
	"errors"
	"strings"
	"testing"
)

func TestHarborRewardFiles(t *testing.T) {
	f := func(s string) []byte { return []byte(s) }
	for _, tc := range []struct {
		name       string
		json, text []byte
		score      float64
		scores     map[string]float64
		err        string
	}{
		{name: "reward.txt holds the score", text: f("1\n"), score: 1},
		{name: "a fractional score", text: f(" 0.25 "), score: 0.25},
		{name: "reward.json wins over reward.txt", json: f(`{"reward": 0.5, "passed": 3, "note": "x", "ok": true}`), text: f("1"), score: 0.5, scores: map[string]float64{"passed": 3}},
		{name: "reward.json without reward falls back to reward.txt", json: f(`{"passed": 2}`), text: f("0"), score: 0, scores: map[string]float64{"passed": 2}},
		{name: "no file", err: "neither reward.json nor reward.txt"},
		{name: "an empty reward.txt", text: f("\n"), err: "reward.txt is empty"},
		{name: "words in reward.txt", text: f("PASSED"), err: `holds "PASSED"`},
		{name: "a non-finite score", text: f("NaN"), err: "not a finite number"},
		{name: "reward.json not an object", json: f(`[1]`), err: "not a JSON object"},
		{name: "reward.json without reward and no reward.txt", json: f(`{"passed": 1}`), err: `no numeric "reward"`},
		{name: "a string reward is not a score", json: f(`{"reward": "1"}`), err: `no numeric "reward"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseHarbor(tc.json, tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrMalformed) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Score == nil || *r.Score != tc.score || !r.Complete || len(r.Cases) != 0 {
				t.Fatalf("report %+v", r)
			}
			for k, v := range tc.scores {
				if r.Scores[k] != v {
					t.Errorf("scores %v, want %v", r.Scores, tc.scores)
				}
			}
			if len(r.Scores) != len(tc.scores) {
				t.Errorf("scores %v, want %v", r.Scores, tc.scores)
			}
		})
	}
}
