package inspect_test

import (
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rollbox/rollbox/internal/inspect"
)

const testRollout = "r20260101T000000-viewer"

// copyRun copies the test run's episodes (those whose file matches glob)
// into dst/episodes as the run rollout, and its summary.json when
// withSummary.
func copyRun(t *testing.T, src, dst, glob, rollout string, withSummary bool) int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(src, "episodes", glob))
	os.MkdirAll(filepath.Join(dst, "episodes"), 0o755)
	for _, f := range files {
		b, _ := os.ReadFile(f)
		b = []byte(strings.ReplaceAll(string(b), testRollout, rollout))
		os.WriteFile(filepath.Join(dst, "episodes", strings.ReplaceAll(filepath.Base(f), testRollout, rollout)), b, 0o644)
	}
	if withSummary {
		b, _ := os.ReadFile(filepath.Join(src, "summary.json"))
		os.WriteFile(filepath.Join(dst, "summary.json"), []byte(strings.ReplaceAll(string(b), testRollout, rollout)), 0o644)
	}
	return len(files)
}

func TestRunsAreListedApartAndASummaryCountsOnlyForItsOwnRun(t *testing.T) {
	src := testRun(t)
	// Two rollbox run directories under one out/, and a directory two runs
	// wrote into (the second run's summary.json replaced the first's).
	parent := t.TempDir()
	na := copyRun(t, src, filepath.Join(parent, "r-a"), "*fix-add*.json", "r-a", true)
	nb := copyRun(t, src, filepath.Join(parent, "r-b"), "*sum-of-squares*.json", "r-b", true)
	mixed := t.TempDir()
	copyRun(t, src, mixed, "*fix-add*.json", "r-a", false)
	copyRun(t, src, mixed, "*sum-of-squares*.json", "r-b", true)

	for _, tt := range []struct {
		name, dir   string
		withSummary map[string]bool
	}{
		{"a directory of runs", parent, map[string]bool{"r-a": true, "r-b": true}},
		{"one directory two runs wrote into", mixed, map[string]bool{"r-a": false, "r-b": true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := inspect.NewServer(tt.dir)
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(srv.Handler())
			defer ts.Close()
			l := getList(t, ts.URL, "")
			if l.Total != na+nb || len(l.Runs) != 2 || (l.Run != nil && string(l.Run) != "null") {
				t.Fatalf("total %d, runs %d, run %s; want %d episodes of 2 runs and no one summary for both", l.Total, len(l.Runs), l.Run, na+nb)
			}
			for _, r := range l.Runs {
				want := map[string]int{"r-a": na, "r-b": nb}[r.RolloutID]
				if r.Episodes != want || r.Scored != want || r.RewardMean == nil {
					t.Errorf("run %s: %+v, want %d episodes", r.RolloutID, r, want)
				}
				if has := r.Summary != nil && string(r.Summary) != "null"; has != tt.withSummary[r.RolloutID] ||
					(has && !strings.Contains(string(r.Summary), `"rollout_id":"`+r.RolloutID+`"`)) {
					t.Errorf("run %s has summary %s", r.RolloutID, r.Summary)
				}
			}
			one := getList(t, ts.URL, "?rollout=r-b")
			if len(one.Episodes) != nb {
				t.Fatalf("?rollout=r-b: %d episodes, want %d", len(one.Episodes), nb)
			}
			for _, e := range one.Episodes {
				if e.RolloutID != "r-b" {
					t.Errorf("?rollout=r-b lists %s of %s", e.ID, e.RolloutID)
				}
			}
		})
	}

	t.Run("in the browser, a run is picked and shown alone", func(t *testing.T) {
		chromium(t)
		srv, _ := inspect.NewServer(mixed)
		ts := httptest.NewServer(srv.Handler())
		defer ts.Close()
		bctx := tab(t, 800, 600, 60*time.Second) // headless Chromium's default window
		eval := func(js string) string {
			t.Helper()
			v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
			if err != nil {
				t.Fatalf("evaluate %s: %v", js, err)
			}
			return v
		}
		if err := chromedp.Do(bctx, chromedp.Navigate(ts.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`body[data-ready="true"] li.ep`))); err != nil {
			t.Fatal(err)
		}
		if got := eval(`document.getElementById("f-run-row").hidden ? "hidden" : "shown"`); got != "shown" {
			t.Fatalf("the run picker is %s with two runs", got)
		}
		if got := eval(`document.getElementById("run").textContent`); !strings.Contains(got, "2 runs") {
			t.Errorf("the top bar says %q, want the two runs apart", got)
		}
		eval(`(() => { const e = document.getElementById("f-run"); e.value = "r-b"; e.dispatchEvent(new Event("input", {bubbles: true})); return "" })()`)
		rows := eval(`[...document.querySelectorAll("li.ep")].map(e => e.dataset.episodeId).join(" ")`)
		if n := len(strings.Fields(rows)); n != nb || strings.Contains(rows, "r-a") {
			t.Errorf("after picking r-b the list shows %q", rows)
		}
		if got := eval(`document.getElementById("run").textContent`); !strings.Contains(got, "run r-b") || !strings.Contains(got, fmt.Sprintf("%d episodes", nb)) {
			t.Errorf("the top bar says %q for run r-b", got)
		}
		if got := eval(`location.hash`); !strings.Contains(got, "rollout=r-b") {
			t.Errorf("the URL %q does not keep the run", got)
		}
	})
}
