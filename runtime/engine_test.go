package runtime_test

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
)

// infraRetries reads rollbox_infra_retries_total{backend="wasm"}.
func (s *service) infraRetries() int {
	m := regexp.MustCompile(`rollbox_infra_retries_total\{backend="wasm"\} (\d+)`).FindStringSubmatch(s.metrics())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestAnEnvironmentEpisodeWaitingToRetryItsOpenStopsWhenTheServiceCloses(t *testing.T) {
	flaky := &flakyBackends{inner: wasmBackends(t)}
	flaky.fail.Store(1000) // every create fails: the open is retried until the attempts run out
	s := startService(t, "", func(o *runtime.Options) { o.Backends = flaky; o.Limits.InfraAttempts = 20 })
	answered := make(chan time.Time, 1)
	go func() {
		s.do("POST", "/v1/episodes", map[string]any{"task": task("env")}, nil)
		answered <- time.Now()
	}()
	// The third retry has just been counted: its pause (3 × 200 ms) begins.
	deadline := time.Now().Add(20 * time.Second)
	for s.infraRetries() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the open was not retried three times")
		}
		time.Sleep(5 * time.Millisecond)
	}
	closed := time.Now()
	s.srv.Close()
	select {
	case at := <-answered:
		if waited := at.Sub(closed); waited > 300*time.Millisecond {
			t.Errorf("the request answered %v after the service closed: the retry's pause ignored the cancellation", waited)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not answer after the service closed")
	}
}

func TestAStreamReportsAnEpisodeWhoseRecordCannotBeReadInsteadOfSkippingIt(t *testing.T) {
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	s := startService(t, "")
	id := s.submit(rolloutBody(p, 2, task("a"), task("b")))
	s.waitState(id, 30*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	lost := id + ".a.1"
	if err := os.WriteFile(filepath.Join(s.data, "episodes", lost+".json"), []byte("{torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"", "?stream=1"} {
		t.Run("episodes"+q, func(t *testing.T) {
			resp, err := http.Get(s.url + "/v1/rollouts/" + id + "/episodes" + q)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var ids []string
			found := false
			for _, line := range readNDJSON(t, resp.Body) { // each line a valid trajectory
				ids = append(ids, line.EpisodeID)
				if line.EpisodeID == lost {
					found = true
					if line.Termination == nil || line.Termination.Reason != trajectory.EndRecordError || line.Reward != nil {
						t.Errorf("the unreadable episode's line: termination %+v reward %+v, want record_error, unscored", line.Termination, line.Reward)
					}
				}
			}
			if len(ids) != 4 || !found {
				t.Errorf("lines for %v, want all 4 episodes with %s reported", ids, lost)
			}
		})
	}
}
