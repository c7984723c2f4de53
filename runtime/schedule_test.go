package runtime_test

import (
	"bufio"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// firstGroup submits a rollout and reads its stream: how many policy turns
// had been answered when the first complete group arrived, and when it and
// the last arrived.
func firstGroup(t *testing.T, s *service, body map[string]any, turns *atomic.Int64) (turnsBefore int64, first, all time.Duration) {
	t.Helper()
	turns.Store(0)
	start := time.Now()
	id := s.submit(body)
	resp, err := http.Get(s.url + "/v1/rollouts/" + id + "/episodes?stream=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); n++ {
		if n == 0 {
			turnsBefore, first = turns.Load(), time.Since(start)
		}
	}
	return turnsBefore, first, time.Since(start)
}

// With groups scheduling a group's episodes go first together, so the first
// complete group streams after few policy turns; with episodes scheduling
// every episode advances at once and it streams near the end. Counted in
// policy turns, not in time: the order is the scheduler's, the time the
// host's (the time to the first group and the throughput are the
// bench's: rollbox bench --schedule).
func TestGroupMajorSchedulingStreamsCompleteGroupsEarly(t *testing.T) {
	const groups, size, turns = 24, 4, 4
	var answered atomic.Int64
	respond := fakepolicy.BashThenFinish(turns - 1)
	p := startPolicy(t, fakepolicy.Config{Latency: 40 * time.Millisecond, Responder: func(req *fakepolicy.Request) fakepolicy.Reply {
		answered.Add(1)
		return respond(req)
	}})
	s := startService(t, "", func(o *runtime.Options) { o.Limits.PolicyConcurrency = 8 })
	tasks := make([]any, groups)
	for i := range tasks {
		tk := task(fmt.Sprintf("g%d", i))
		tk["limits"] = map[string]any{"max_turns": turns + 1}
		tasks[i] = tk
	}
	var before [2]int64
	for i, schedule := range []string{runtime.ScheduleEpisodes, runtime.ScheduleGroups} {
		body := rolloutBody(p, size, tasks...)
		body["schedule"] = schedule
		var first, all time.Duration
		before[i], first, all = firstGroup(t, s, body, &answered)
		t.Logf("schedule %-8s: first complete group after %d of %d policy turns (%s), all %d groups after %s", schedule, before[i], groups*size*turns, first, groups, all)
	}
	if before[1]*2 > before[0] {
		t.Errorf("the first complete group streamed after %d policy turns with groups scheduling, %d without: want at most half as many", before[1], before[0])
	}
	// The default for a rollout with groups is groups; a bad one is a 400.
	var e apiErr
	body := rolloutBody(p, 2, task("x"))
	body["schedule"] = "random"
	if code, _ := s.do("POST", "/v1/rollouts", body, &e); code != 400 || e.Error.Field != "schedule" {
		t.Errorf("a bad schedule: %d %+v", code, e)
	}
}
