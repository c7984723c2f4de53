package testreport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
)

// Harbor's verifier files, in the directory a Harbor test script writes
// them to (/logs/verifier): reward.json (an object of named numbers, the
// score its "reward") is read first; reward.txt (one number) otherwise, or
// when reward.json has no "reward".
const (
	HarborRewardJSON = "reward.json"
	HarborRewardText = "reward.txt"
)

// maxScores bounds the named numbers kept from a reward.json.
const maxScores = 64

// ParseHarbor reads Harbor's reward files: rewardJSON and rewardText are
// their contents, nil when the file does not exist. The report names no
// test: its Score is the reward, Scores the other numbers of reward.json.
//
// # Errors
//
// Neither file, an empty or unreadable one, a reward.json that is not an
// object, or a score that is not a finite number.
func ParseHarbor(rewardJSON, rewardText []byte) (*Report, error) {
	r := &Report{Format: Harbor, Complete: true, Scores: map[string]float64{}}
	if rewardJSON != nil {
		if len(bytes.TrimSpace(rewardJSON)) == 0 {
			return nil, fmt.Errorf("%w: %s is empty", ErrMalformed, HarborRewardJSON)
		}
		var obj map[string]any
		if err := json.Unmarshal(rewardJSON, &obj); err != nil {
			return nil, fmt.Errorf("%w: %s is not a JSON object: %v", ErrMalformed, HarborRewardJSON, err)
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v, ok := obj[k].(float64) // booleans and strings are not scores (as Harbor)
			if !ok {
				continue
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("%w: %s: %q is not a finite number", ErrMalformed, HarborRewardJSON, k)
			}
			if k == "reward" {
				r.Score = &v
			} else if len(r.Scores) < maxScores {
				r.Scores[k] = v
			}
		}
		if r.Score != nil {
			return r, nil
		}
		if rewardText == nil {
			return nil, fmt.Errorf("%w: %s has no numeric \"reward\" and there is no %s", ErrMalformed, HarborRewardJSON, HarborRewardText)
		}
	}
	if rewardText == nil {
		return nil, fmt.Errorf("%w: neither %s nor %s was written", ErrMalformed, HarborRewardJSON, HarborRewardText)
	}
	s := string(bytes.TrimSpace(rewardText))
	if s == "" {
		return nil, fmt.Errorf("%w: %s is empty", ErrMalformed, HarborRewardText)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		if len(s) > 40 {
			s = s[:40] + "..."
		}
		return nil, fmt.Errorf("%w: %s holds %q, not a finite number", ErrMalformed, HarborRewardText, s)
	}
	r.Score = &v
	return r, nil
}
