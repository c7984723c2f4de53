package agent_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/tools"
)

// The trajectory's JSON Schema spells the closed lists the code defines
// once: tool error kinds (tools.ErrorKinds) and ends (trajectory.EndReasons).
func TestTheTrajectorySchemaListsTheSameErrorKindsAndEnds(t *testing.T) {
	type enum struct {
		Enum []any `json:"enum"`
	}
	var schema struct {
		Defs struct {
			ErrorKind enum `json:"error_kind"`
		} `json:"$defs"`
		Properties struct {
			Segments struct {
				Items struct {
					Properties struct {
						Reason enum `json:"reason"`
					} `json:"properties"`
				} `json:"items"`
			} `json:"segments"`
			Termination struct {
				Properties struct {
					Reason enum `json:"reason"`
				} `json:"properties"`
			} `json:"termination"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(trajectory.JSONSchema, &schema); err != nil {
		t.Fatal(err)
	}
	var kinds, ends []string
	for _, v := range schema.Defs.ErrorKind.Enum {
		if s, ok := v.(string); ok {
			kinds = append(kinds, s)
		}
	}
	for _, v := range schema.Properties.Termination.Properties.Reason.Enum {
		s, _ := v.(string)
		ends = append(ends, s)
	}
	var want []string
	for _, k := range tools.ErrorKinds() {
		want = append(want, string(k))
	}
	if !slices.Equal(kinds, want) {
		t.Errorf("schema error_kind %v, tools.ErrorKinds %v", kinds, want)
	}
	var segs []string
	for _, v := range schema.Properties.Segments.Items.Properties.Reason.Enum {
		s, _ := v.(string)
		segs = append(segs, s)
	}
	if !slices.Equal(segs, trajectory.SegmentReasons()) {
		t.Errorf("schema segment reason %v, trajectory.SegmentReasons %v", segs, trajectory.SegmentReasons())
	}
	if !slices.Equal(ends, trajectory.EndReasons()) {
		t.Errorf("schema reason %v, trajectory.EndReasons %v", ends, trajectory.EndReasons())
	}
}

// The schema's reward error kinds and monitors are the code's lists.
func TestTheTrajectorySchemaListsTheSameRewardErrorKindsAndMonitors(t *testing.T) {
	var schema struct {
		Properties struct {
			Reward struct {
				Properties struct {
					ErrorKind struct {
						Enum []string `json:"enum"`
					} `json:"error_kind"`
				} `json:"properties"`
			} `json:"reward"`
			Monitors struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"monitors"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(trajectory.JSONSchema, &schema); err != nil {
		t.Fatal(err)
	}
	if got := schema.Properties.Reward.Properties.ErrorKind.Enum; !slices.Equal(got, trajectory.RewardErrorKinds()) {
		t.Errorf("schema reward.error_kind %v, trajectory.RewardErrorKinds %v", got, trajectory.RewardErrorKinds())
	}
	var names []string
	for n := range schema.Properties.Monitors.Properties {
		names = append(names, n)
	}
	slices.Sort(names)
	want := slices.Sorted(slices.Values(trajectory.MonitorNames()))
	if !slices.Equal(names, want) {
		t.Errorf("schema monitors %v, trajectory.MonitorNames %v", names, want)
	}
}
