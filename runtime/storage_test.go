package runtime_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/internal/tmpfs"
	"github.com/rollbox/rollbox/runtime"
)

// TestADataDirThatFillsMidRolloutLosesNothing runs a rollout on a small
// tmpfs that another writer fills while episodes run, then frees. Every
// episode ends with a durable record or as record_error (counted, listed,
// streamed, skipped by exports with their names), the service refuses new
// work and says why while the disk is full, no journal is left behind, and
// a restart on the same directory agrees.
func TestADataDirThatFillsMidRolloutLosesNothing(t *testing.T) {
	data := tmpfs.Mount(t, 6<<20)
	filler := filepath.Join(data, "filler")
	var ended atomic.Int64
	p := startPolicy(t, fakepolicy.Config{
		Responder: func(req *fakepolicy.Request) fakepolicy.Reply {
			if req.AssistantTurns() < 2 {
				return fakepolicy.Reply{Content: strings.Repeat("thinking ", 200),
					ToolCalls: []fakepolicy.ToolCall{{Name: "bash", Arguments: `{"command":"cat hello.txt; seq 1 300"}`}}}
			}
			ended.Add(1)
			return fakepolicy.Reply{ToolCalls: []fakepolicy.ToolCall{{Name: "finish", Arguments: `{"answer":"done"}`}}}
		},
	})
	limits := func(o *runtime.Options) {
		o.Limits.MaxRunning = 12
		o.Limits.DiskReserve = 256 << 10
		o.Limits.StorageCheckEvery = 20 * time.Millisecond
	}
	s := startService(t, data, limits)
	tasks := make([]any, 20)
	for i := range tasks {
		tasks[i] = task("fill-" + strconv.Itoa(i))
	}
	const total = 200
	id := s.submit(rolloutBody(p, total/len(tasks), tasks...))
	for ended.Load() < 40 {
		time.Sleep(5 * time.Millisecond)
	}
	tmpfs.Fill(t, filler, 1<<30)
	// Full (or, once the episodes that met it gave back their journals,
	// below the reserve): new work is refused, and /healthz says why.
	h := s.waitHealth(5*time.Second, func(h health, code int) bool { return h.Storage.State != runtime.StorageOK })
	if (h.Storage.State == runtime.StorageFull) != (h.Status == runtime.HealthUnavailable) || h.Status == runtime.HealthOK || len(h.Problems) == 0 {
		t.Errorf("healthz on a full disk: %+v", h)
	}
	var e apiErr
	if code, _ := s.do("POST", "/v1/rollouts", rolloutBody(p, 1, task("refused")), &e); code != http.StatusInsufficientStorage || e.Error.Code != "insufficient_storage" {
		t.Errorf("POST on a full disk: %d %+v", code, e)
	}
	time.Sleep(300 * time.Millisecond) // the episodes running meet the full disk
	mid := s.status(id)
	if mid.EpisodesDone == total {
		t.Fatal("the rollout ended before the disk was freed: it did not meet a full disk")
	}
	os.Remove(filler)
	st := s.waitState(id, 2*time.Minute, func(st status) bool { return st.State == runtime.RolloutDone })
	t.Logf("ends %v (queued while full: %d)", st.Ends, mid.Queued)
	if st.EpisodesDone != total || st.Ends["finished"]+st.Ends["record_error"] != total {
		t.Errorf("status %+v", st)
	}
	if st.Ends["record_error"] == 0 {
		t.Errorf("no episode met the full disk: %v", st.Ends)
	}

	check := func(s *service) {
		t.Helper()
		// The stream has a line for every episode; each is a durable record
		// or a record_error naming why it has none.
		lines := s.episodes(id, "?stream=1")
		if len(lines) != total {
			t.Fatalf("stream: %d lines, want %d", len(lines), total)
		}
		recordErrors := 0
		for _, e := range lines {
			_, err := os.Stat(filepath.Join(data, "episodes", e.EpisodeID+".json"))
			switch e.Termination.Reason {
			case trajectory.EndRecordError:
				recordErrors++
				if e.Reward != nil || e.Termination.Message == "" {
					t.Errorf("%s: record_error with reward %v, message %q", e.EpisodeID, e.Reward, e.Termination.Message)
				}
				// Its journal met the full disk; its end is written when the
				// disk takes it again by then (agent's failRecord), as a
				// record_error record with no reward, which exports skip.
				if err == nil {
					if tr, rerr := trajectory.Read(filepath.Join(data, "episodes", e.EpisodeID+".json")); rerr != nil ||
						tr.Termination == nil || tr.Termination.Reason != trajectory.EndRecordError || tr.Reward != nil {
						t.Errorf("%s: record_error in the index, but its file is %v %+v", e.EpisodeID, rerr, tr)
					}
				}
			case trajectory.EndFinished:
				if err != nil || e.Reward == nil || e.Group == nil {
					t.Errorf("%s: finished without its record (%v) or reward", e.EpisodeID, err)
				}
			default:
				t.Errorf("%s: %s", e.EpisodeID, e.Termination.Reason)
			}
		}
		if recordErrors != st.Ends["record_error"] {
			t.Errorf("%d record_error lines, status says %d", recordErrors, st.Ends["record_error"])
		}
		var sum runtime.Summary
		s.do("GET", "/v1/rollouts/"+id+"/summary", nil, &sum)
		if sum.Episodes != total || sum.Ends["record_error"] != recordErrors || len(sum.Unrecorded) != recordErrors {
			t.Errorf("summary: %d episodes, ends %v, %d unrecorded", sum.Episodes, sum.Ends, len(sum.Unrecorded))
		}
		for _, format := range []string{"jsonl", "parquet"} {
			resp, err := http.Get(s.url + "/v1/rollouts/" + id + "/export?format=" + format)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			skipped, _ := strconv.Atoi(resp.Header.Get("Rollbox-Skipped"))
			names := strings.Split(resp.Header.Get("Rollbox-Skipped-Episodes"), ",")
			n := 0
			if format == "jsonl" {
				n = bytes.Count(body, []byte("\n"))
			} else if rows, err := runtime.ReadParquet(bytes.NewReader(body), int64(len(body))); err == nil {
				n = len(rows)
			}
			if resp.StatusCode != 200 || n != total-recordErrors || skipped != recordErrors || len(names) != recordErrors {
				t.Errorf("export %s: %d with %d rows, %d skipped (%d named), want %d and %d", format, resp.StatusCode, n, skipped, len(names), total-recordErrors, recordErrors)
			}
		}
		if j, _ := filepath.Glob(filepath.Join(data, "episodes", "*.partial")); len(j) > 0 {
			t.Errorf("journals left: %v", j)
		}
		if tmp, _ := filepath.Glob(filepath.Join(data, "episodes", "*.tmp")); len(tmp) > 0 {
			t.Errorf("half-written records left: %v", tmp)
		}
	}
	check(s)
	// GET of one record_error episode answers what the index knows.
	var lines []*trajectory.Trajectory
	lines = s.episodes(id, "")
	for _, e := range lines {
		if e.Termination.Reason == trajectory.EndRecordError {
			var tr trajectory.Trajectory
			if code, _ := s.do("GET", "/v1/episodes/"+e.EpisodeID, nil, &tr); code != 200 || tr.Termination.Reason != trajectory.EndRecordError {
				t.Errorf("GET %s: %d %+v", e.EpisodeID, code, tr.Termination)
			}
			break
		}
	}

	// A restart on the same directory agrees.
	s.http.Close()
	if err := s.srv.Close(); err != nil {
		t.Fatal(err)
	}
	check(startService(t, data, limits))
}

func decodeJSON(b []byte, v any) error { return json.Unmarshal(b, v) }
