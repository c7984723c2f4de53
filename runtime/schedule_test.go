package runtime_test

import (
	"bufio"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// firstGroup submits a rollout and reads its stream: when the first
// complete group arrived and when the last did, from the submission.
func firstGroup(t *testing.T, s *service, body map[string]any) (first, all time.Duration) {
	t.Helper()
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
			first = time.Since(start)
		}
	}
	return first, time.Since(start)
}

func TestGroupMajorSchedulingStreamsCompleteGroupsEarly(t *testing.T) {
	const groups, size, turns = 24, 4, 4
	p := startPolicy(t, fakepolicy.Config{Latency: 40 * time.Millisecond, Responder: fakepolicy.BashThenFinish(turns - 1)})
	s := startService(t, "", func(o *runtime.Options) { o.Limits.PolicyConcurrency = 8 })
	tasks := make([]any, groups)
	for i := range tasks {
		tk := task(fmt.Sprintf("g%d", i))
		tk["limits"] = map[string]any{"max_turns": turns + 1}
		tasks[i] = tk
	}
	var first, all [2]time.Duration
	for i, schedule := range []string{runtime.ScheduleEpisodes, runtime.ScheduleGroups} {
		body := rolloutBody(p, size, tasks...)
		body["schedule"] = schedule
		first[i], all[i] = firstGroup(t, s, body)
		t.Logf("schedule %-8s: first complete group after %s, all %d groups after %s", schedule, first[i], groups, all[i])
	}
	if first[1]*2 > first[0] {
		t.Errorf("the first group took %s with groups scheduling, %s without: want it at least twice as early", first[1], first[0])
	}
	if all[1] > all[0]*13/10 {
		t.Errorf("groups scheduling took %s in all, episodes %s: more than 30%% slower", all[1], all[0])
	}
	// The default for a rollout with groups is groups; a bad one is a 400.
	var e apiErr
	body := rolloutBody(p, 2, task("x"))
	body["schedule"] = "random"
	if code, _ := s.do("POST", "/v1/rollouts", body, &e); code != 400 || e.Error.Field != "schedule" {
		t.Errorf("a bad schedule: %d %+v", code, e)
	}
}
