package inspect_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/inspect"
)

// chromium finds Debian's chromium (apt-get install chromium), or skips;
// under CI=true (where .ci/run installs it) a missing browser fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is required under CI=true (apt-get install chromium)")
	}
	t.Skip("no chromium (apt-get install chromium) to test the viewer in")
	return ""
}

// browser is the package's one headless Chromium, started by the first test
// that asks for a tab and closed by TestMain: starting one costs about 1.2 s
// of CPU, which four tests paid each.
var browser struct {
	once sync.Once
	ctx  context.Context // its first tab's: the tests' tabs are its children
	err  error
	stop func()
}

// tab opens a tab of the shared Chromium in a browser context of its own
// (cookies and storage apart, as in a browser of its own) with a w×h
// viewport; its actions are bounded by limit, and it closes with t.
func tab(t *testing.T, w, h int64, limit time.Duration) context.Context {
	t.Helper()
	exe := chromium(t)
	browser.once.Do(func() {
		dir, err := os.MkdirTemp("", "rollbox-inspect-chromium-")
		if err != nil {
			browser.err = err
			return
		}
		actx, acancel := chromedp.NewExecAllocator(context.Background(),
			chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
			chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true),
			chromedp.UserDataDir(dir))
		bctx, bcancel := chromedp.NewContext(actx)
		browser.ctx = bctx
		browser.stop = func() { bcancel(); acancel(); os.RemoveAll(dir) }
		browser.err = chromedp.Do(bctx) // starts it (no timeout here: it would stop the browser)
	})
	if browser.err != nil {
		t.Fatalf("starting chromium: %v", browser.err)
	}
	tctx, tcancel := chromedp.NewContext(browser.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(tcancel)
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(w, h)); err != nil {
		t.Fatalf("opening a tab: %v", err)
	}
	ctx, cancel := context.WithTimeout(tctx, limit)
	t.Cleanup(cancel)
	return ctx
}

// stopBrowser closes the shared Chromium, if a test started it.
func stopBrowser() {
	if browser.stop != nil {
		browser.stop()
	}
}

// The viewer as a person sees it: a headless Chromium loads the list,
// filters it, opens an episode and reads its timeline and reward. With
// ROLLBOX_VIEWER_SCREENSHOT=FILE it saves a PNG of the page (docs/viewer.png).
func TestTheViewerInHeadlessChromium(t *testing.T) {
	chromium(t)
	dir := testRun(t)
	trs := readRun(t, dir)
	srv, err := inspect.NewServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	bctx := tab(t, 1440, 960, 90*time.Second)
	var consoleErrs []string
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		return v
	}
	// setFilter changes a control as a person would, firing its input event.
	setFilter := func(id, value string) {
		t.Helper()
		eval(fmt.Sprintf(`(() => { const e = document.getElementById(%q); e.value = %q; e.dispatchEvent(new Event("input", {bubbles: true})); return "" })()`, id, value))
	}
	rows := func() []string {
		t.Helper()
		v := eval(`[...document.querySelectorAll("li.ep")].map(e => e.dataset.episodeId).join("\n")`)
		if v == "" {
			return nil
		}
		return strings.Split(v, "\n")
	}

	if err := chromedp.Do(bctx,
		chromedp.EmulateViewport(1440, 960),
		chromedp.Navigate(ts.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`body[data-ready="true"] li.ep`)),
	); err != nil {
		t.Fatalf("loading the page: %v", err)
	}

	t.Run("the list shows every episode with its end, reward and errors", func(t *testing.T) {
		got := rows()
		if len(got) != len(trs) {
			t.Fatalf("%d rows, want %d", len(got), len(trs))
		}
		if c := eval(`document.getElementById("count").textContent`); c != fmt.Sprintf("showing %d of %d", len(trs), len(trs)) {
			t.Errorf("count %q", c)
		}
		for _, id := range got {
			tr := trs[id]
			if tr == nil {
				t.Fatalf("row for an unknown episode %q", id)
			}
			sel := fmt.Sprintf(`document.querySelector('li.ep[data-episode-id="%s"]')`, id)
			if end := eval(sel + `.querySelector("[data-end]").dataset.end`); end != tr.Termination.Reason {
				t.Errorf("%s: end %q, want %q", id, end, tr.Termination.Reason)
			}
			want := "—"
			if v, ok := tr.Value(); ok {
				want = strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
			} else if tr.Reward != nil {
				want = "unscored"
			}
			if r := eval(sel + `.querySelector(".reward-value").textContent`); r != want {
				t.Errorf("%s: reward %q, want %q", id, r, want)
			}
			for kind := range tr.Stats.ToolErrors {
				if eval(sel+fmt.Sprintf(`.querySelector('[data-error="%s"]') ? "y" : "n"`, kind)) != "y" {
					t.Errorf("%s: no %s badge", id, kind)
				}
			}
		}
	})

	t.Run("filters narrow the list", func(t *testing.T) {
		count := func(keep func(*trajectory.Trajectory) bool) int {
			n := 0
			for _, tr := range trs {
				if keep(tr) {
					n++
				}
			}
			return n
		}
		check := func(what string, keep func(*trajectory.Trajectory) bool) {
			t.Helper()
			got := rows()
			if want := count(keep); len(got) != want || want == 0 {
				t.Errorf("%s: %d rows, want %d", what, len(got), want)
			}
			for _, id := range got {
				if !keep(trs[id]) {
					t.Errorf("%s: %s shown", what, id)
				}
			}
		}
		setFilter("f-task", "fix-add")
		check("task fix-add", func(tr *trajectory.Trajectory) bool { return tr.TaskID == "fix-add" })
		setFilter("f-task", "")
		setFilter("f-error", "timeout")
		check("tool error timeout", func(tr *trajectory.Trajectory) bool { return tr.Stats.ToolErrors["timeout"] > 0 })
		setFilter("f-error", "")
		setFilter("f-min", "0.5")
		check("reward at least 0.5", func(tr *trajectory.Trajectory) bool { v, ok := tr.Value(); return ok && v >= 0.5 })
		setFilter("f-min", "")
		fired := func(name string) func(*trajectory.Trajectory) bool {
			return func(tr *trajectory.Trajectory) bool { return tr.Monitors.Values()[name] > 0 }
		}
		setFilter("f-monitor", "test_tampering")
		check("monitor test_tampering", fired("test_tampering"))
		if !strings.Contains(eval(`location.hash`), "monitor=test_tampering") {
			t.Errorf("the monitor filter is not in the URL: %s", eval(`location.hash`))
		}
		for _, id := range rows() {
			if eval(fmt.Sprintf(`document.querySelector('li.ep[data-episode-id="%s"] [data-monitor="test_tampering"]') ? "y" : "n"`, id)) != "y" {
				t.Errorf("%s: no test_tampering badge", id)
			}
		}
		setFilter("f-monitor", "judge_disagreement")
		check("monitor judge_disagreement", fired("judge_disagreement"))
		setFilter("f-monitor", "any")
		check("any monitor", func(tr *trajectory.Trajectory) bool { return len(tr.Monitors.Triggered()) > 0 })
		setFilter("f-monitor", "")
		if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#f-end button[data-end="policy_error"]`))); err != nil {
			t.Fatal(err)
		}
		check("end policy_error", func(tr *trajectory.Trajectory) bool { return tr.Termination.Reason == "policy_error" })
		if !strings.Contains(eval(`location.hash`), "end=policy_error") {
			t.Errorf("the filter is not in the URL: %s", eval(`location.hash`))
		}
		if err := chromedp.Do(bctx, chromedp.Click(chromedp.ID("f-clear"))); err != nil {
			t.Fatal(err)
		}
		check("no filter", func(*trajectory.Trajectory) bool { return true })
	})

	t.Run("an episode opens on a timeline with its reward", func(t *testing.T) {
		var tr *trajectory.Trajectory
		for id, x := range trs {
			if x.TaskID == "noisy-logs" && strings.HasSuffix(id, ".0") {
				tr = x
			}
		}
		if err := chromedp.Do(bctx,
			chromedp.Click(chromedp.CSS(fmt.Sprintf(`li.ep[data-episode-id="%s"]`, tr.EpisodeID))),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`article.episode[data-episode-id="%s"] #timeline`, tr.EpisodeID))),
		); err != nil {
			t.Fatal(err)
		}
		tools, models := 0, 0
		for _, s := range tr.Steps {
			if s.Type == trajectory.StepTool {
				tools++
			} else {
				models++
			}
		}
		if n := eval(`String(document.querySelectorAll('#timeline li[data-type="tool"]').length)`); n != fmt.Sprint(tools) {
			t.Errorf("%s tool items, want %d", n, tools)
		}
		if n := eval(`String(document.querySelectorAll('#timeline li[data-type="model"]').length)`); n != fmt.Sprint(models) {
			t.Errorf("%s model items, want %d", n, models)
		}
		for _, kind := range []string{"output_truncated", "timeout", "bad_arguments", "unknown_tool"} {
			if eval(fmt.Sprintf(`document.querySelector('#timeline li[data-error="%s"]') ? "y" : "n"`, kind)) != "y" {
				t.Errorf("no highlighted %s step", kind)
			}
		}
		if eval(`document.querySelector('#timeline li[data-kind="tool_output_truncated"]') ? "y" : "n"`) != "y" {
			t.Error("the truncation context event is not on the timeline")
		}
		if got := eval(`document.getElementById("reward-total").textContent`); got != "1" {
			t.Errorf("reward shown %q, want 1", got)
		}
		if got := eval(`document.querySelector('#reward-card .component[data-name="exact"] .v').textContent`); got != "1" {
			t.Errorf("component exact shown %q", got)
		}
		// An output expands, with the truncation marker highlighted.
		if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#timeline li[data-error="output_truncated"] details.out summary`)),
			chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-error="output_truncated"] pre.output .trunc`))); err != nil {
			t.Fatal(err)
		}
		if got := eval(`document.querySelector('#timeline li[data-error="output_truncated"] pre.output').innerText`); !strings.Contains(got, "ERROR disk full") {
			t.Errorf("expanded output: %.200q", got)
		}
		if !strings.Contains(eval(`location.hash`), "e/"+tr.EpisodeID) {
			t.Errorf("the episode is not in the URL: %s", eval(`location.hash`))
		}
	})

	t.Run("a verifier and a failing episode show what went wrong", func(t *testing.T) {
		var tr *trajectory.Trajectory
		for id, x := range trs {
			if x.TaskID == "fix-fizzbuzz" && strings.HasSuffix(id, ".0") {
				tr = x
			}
		}
		if err := chromedp.Do(bctx,
			chromedp.Navigate(ts.URL+"/#/e/"+tr.EpisodeID),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`article.episode[data-episode-id="%s"] #timeline`, tr.EpisodeID))),
		); err != nil {
			t.Fatal(err)
		}
		if got := eval(`document.getElementById("reward-total").textContent`); got != "0" {
			t.Errorf("reward %q", got)
		}
		if got := eval(`document.getElementById("reward-card").innerText`); !strings.Contains(got, "verifier") || !strings.Contains(got, "exit 1") {
			t.Errorf("reward card: %q", got)
		}
		if n := eval(`String(document.querySelectorAll('#timeline li[data-error="nonzero_exit"]').length)`); n != "2" {
			t.Errorf("%s failing steps highlighted, want 2", n)
		}
	})

	t.Run("a judged episode shows each rubric, each judge's answers and its monitors", func(t *testing.T) {
		open := func(task string) *trajectory.Trajectory {
			t.Helper()
			var tr *trajectory.Trajectory
			for id, x := range trs {
				if x.TaskID == task && strings.HasSuffix(id, ".0") {
					tr = x
				}
			}
			if err := chromedp.Do(bctx,
				chromedp.Navigate(ts.URL+"/#/e/"+tr.EpisodeID),
				chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`article.episode[data-episode-id="%s"] #timeline`, tr.EpisodeID))),
			); err != nil {
				t.Fatal(err)
			}
			return tr
		}
		tr := open("judged")
		want := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", *tr.Reward.Total), "0"), ".")
		if got := eval(`document.getElementById("reward-total").textContent`); got != want {
			t.Errorf("reward %q, want %q", got, want)
		}
		if got := eval(`document.querySelector('#judge .component[data-rubric="correct"]').innerText`); !strings.Contains(got, "a 1") || !strings.Contains(got, "b 0.2") {
			t.Errorf("rubric correct: %q", got)
		}
		if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#judge details[data-judge="b"] summary`)),
			chromedp.WaitVisible(chromedp.CSS(`#judge details[data-judge="b"] pre.output`))); err != nil {
			t.Fatal(err)
		}
		if got := eval(`document.querySelector('#judge details[data-judge="b"]').innerText`); !strings.Contains(got, "Score: 2/10") || !strings.Contains(got, "2/10 → 0.2") {
			t.Errorf("judge b's answers: %q", got)
		}
		if eval(`document.querySelector('#monitor-card [data-monitor="judge_disagreement"][data-fired="true"]') ? "y" : "n"`) != "y" ||
			eval(`document.querySelector('.head [data-monitor="judge_disagreement"]') ? "y" : "n"`) != "y" {
			t.Errorf("judge_disagreement is not shown fired: %q", eval(`document.getElementById("monitor-card").innerText`))
		}
		open("judge-down")
		if got := eval(`document.getElementById("reward-total").textContent`); got != "unscored" {
			t.Errorf("an unscored reward shows %q", got)
		}
		if got := eval(`document.getElementById("reward-error").innerText`); !strings.Contains(got, "judge error") || !strings.Contains(got, "never counted 0") {
			t.Errorf("reward error: %q", got)
		}
		if got := eval(`document.getElementById("judge").innerText`); !strings.Contains(got, "judge down") || !strings.Contains(got, "HTTP 500") {
			t.Errorf("judge section: %q", got)
		}
	})

	// The picture for the README: a search episode (a reward of several
	// components, context events) in the list of the whole run.
	shot := os.Getenv("ROLLBOX_VIEWER_EPISODE")
	for id, x := range trs {
		if shot == "" && x.TaskID == "compressors" && strings.HasSuffix(id, ".1") {
			shot = id
		}
	}
	png, err := chromedp.Run(bctx, func(ctx context.Context, tg *chromedp.Target) ([]byte, error) {
		if err := chromedp.Do(ctx,
			chromedp.Navigate("about:blank"),
			chromedp.Navigate(ts.URL+"/#/e/"+shot),
			chromedp.WaitVisible(chromedp.CSS(`#timeline`)),
		); err != nil {
			return nil, err
		}
		return chromedp.CaptureScreenshot()(ctx, tg)
	})
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if len(png) < 10000 || string(png[1:4]) != "PNG" {
		t.Errorf("screenshot of %d bytes", len(png))
	}
	if p := os.Getenv("ROLLBOX_VIEWER_SCREENSHOT"); p != "" {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_ = consoleErrs
}
