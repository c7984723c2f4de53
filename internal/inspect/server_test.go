package inspect_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/inspect"
)

func TestTheRunHasEveryKindOfTroubleTheViewerShows(t *testing.T) {
	trs := readRun(t, testRun(t))
	if len(trs) != 22 {
		t.Fatalf("%d episodes", len(trs))
	}
	kinds, ends := map[string]bool{}, map[string]bool{}
	for _, tr := range trs {
		for k := range tr.Stats.ToolErrors {
			kinds[k] = true
		}
		ends[tr.Termination.Reason] = true
	}
	for _, k := range []string{"nonzero_exit", "output_truncated", "timeout", "bad_arguments", "unknown_tool"} {
		if !kinds[k] {
			t.Errorf("no %s in the run (have %v)", k, kinds)
		}
	}
	if !ends["finished"] || !ends["policy_error"] {
		t.Errorf("ends %v", ends)
	}
	fired := map[string]int{}
	unscored := 0
	for _, tr := range trs {
		for _, m := range tr.Monitors.Triggered() {
			fired[m]++
		}
		if tr.Reward != nil && tr.Reward.ErrorKind == trajectory.RewardJudgeError {
			unscored++
		}
	}
	if fired["test_tampering"] != 2 || fired["judge_disagreement"] != 2 || unscored != 2 {
		t.Errorf("monitors fired %v, %d unscored by a judge", fired, unscored)
	}
}

func getList(t *testing.T, base, query string) *inspect.List {
	t.Helper()
	resp, err := http.Get(base + "/api/episodes" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /api/episodes%s: %s %s", query, resp.Status, b)
	}
	var l inspect.List
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	return &l
}

func TestTheAPIListsAndFiltersEpisodesAndServesEachOne(t *testing.T) {
	dir := testRun(t)
	srv, err := inspect.NewServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	all := getList(t, ts.URL, "")
	if all.Total != 22 || len(all.Episodes) != 22 || !strings.Contains(string(all.Run), `"rollout_id"`) {
		t.Fatalf("list: total %d, %d episodes, run %s", all.Total, len(all.Episodes), all.Run)
	}
	tests := []struct {
		name  string
		query url.Values
		keep  func(e *inspect.Episode) bool
	}{
		{"by task", url.Values{"task": {"fix-add"}}, func(e *inspect.Episode) bool { return e.TaskID == "fix-add" }},
		{"by end reason", url.Values{"end": {"policy_error"}}, func(e *inspect.Episode) bool { return e.End == "policy_error" }},
		{"by tool error kind", url.Values{"error": {"timeout"}}, func(e *inspect.Episode) bool { return e.ToolErrors["timeout"] > 0 }},
		{"without tool errors", url.Values{"error": {"none"}}, func(e *inspect.Episode) bool { return len(e.ToolErrors) == 0 }},
		{"by reward range", url.Values{"min_reward": {"0.5"}, "max_reward": {"1"}}, func(e *inspect.Episode) bool {
			return e.Reward != nil && *e.Reward >= 0.5 && *e.Reward <= 1
		}},
		{"by a monitor that fired", url.Values{"monitor": {"test_tampering"}}, func(e *inspect.Episode) bool { return e.Monitors["test_tampering"] > 0 }},
		{"by any monitor", url.Values{"monitor": {"any"}}, func(e *inspect.Episode) bool { return len(e.Triggered) > 0 }},
		{"by no monitor", url.Values{"monitor": {"none"}}, func(e *inspect.Episode) bool { return len(e.Triggered) == 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := getList(t, ts.URL, "?"+tt.query.Encode())
			want := 0
			for _, e := range all.Episodes {
				if tt.keep(e) {
					want++
				}
			}
			if want == 0 || len(got.Episodes) != want {
				t.Fatalf("%d episodes, want %d", len(got.Episodes), want)
			}
			for _, e := range got.Episodes {
				if !tt.keep(e) {
					t.Errorf("%s does not match", e.ID)
				}
			}
		})
	}

	id := all.Episodes[0].ID
	resp, err := http.Get(ts.URL + "/api/episodes/" + url.PathEscape(id))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if tr, err := trajectory.Decode(b); err != nil || tr.EpisodeID != id {
		t.Errorf("GET one episode: %v %s", err, b[:min(len(b), 200)])
	}
	for _, bad := range []string{"/api/episodes/nope", "/api/episodes/..%2Fsummary", "/api/episodes?end=exploded", "/api/episodes?min_reward=high", "/api/episodes?monitor=speed", "/nowhere"} {
		resp, err := http.Get(ts.URL + bad)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode < 400 || resp.StatusCode >= 500 || e.Error.Message == "" {
			t.Errorf("GET %s: %s %+v", bad, resp.Status, e)
		}
	}
	// The page and its assets are embedded and reference nothing outside.
	for _, p := range []string{"/", "/static/app.js", "/static/style.css"} {
		resp, err := http.Get(ts.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) < 500 || outsideRef.Match(b) {
			t.Errorf("GET %s: %s, %d bytes (or an outside URL)", p, resp.Status, len(b))
		}
	}
}

// outsideRef is a reference the browser would fetch from elsewhere.
var outsideRef = regexp.MustCompile(`(src|href)=["']?(https?:)?//|url\(["']?(https?:)?//|@import|fetch\(["']https?:`)

func TestTheServerTakesAnEpisodesDirAndSkipsWhatIsNotATrajectory(t *testing.T) {
	dir := t.TempDir()
	src := testRun(t)
	files, _ := filepath.Glob(filepath.Join(src, "episodes", "*fix-add*.json"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644)
	}
	os.WriteFile(filepath.Join(dir, "newer.json"), []byte(`{"schema": "rollbox.trajectory/v9"}`), 0o644)
	srv, err := inspect.NewServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := srv.Load()
	if err != nil || l.Total != 2 || len(l.Skipped) != 1 || !strings.Contains(l.Skipped[0].Error, "newer") {
		t.Errorf("%v %+v", err, l)
	}
	if _, err := inspect.NewServer(filepath.Join(dir, "nope")); err == nil {
		t.Error("a missing directory was accepted")
	}
}
