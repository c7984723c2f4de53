package loadgen

import "testing"

func TestServerTimingReadsTheNamedMetricsDuration(t *testing.T) {
	for _, tt := range []struct {
		h    string
		want float64
	}{
		{"service;dur=12.5", 12.5},
		{"db;dur=3, service;desc=\"x\";dur=0.25", 0.25},
		{"", -1},
		{"other;dur=4", -1},
		{"service;dur=bad", -1},
	} {
		if got := serverTiming(tt.h, "service"); got != tt.want {
			t.Errorf("serverTiming(%q) = %v, want %v", tt.h, got, tt.want)
		}
	}
}
