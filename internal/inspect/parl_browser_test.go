package inspect_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/scripted"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/inspect"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// The viewer shows an orchestrator episode's tree (examples/parl, the
// spurious-parallelism orchestrator): its stages and sub-agents with their
// ends, the critical path starred and the critical steps summed; a
// sub-agent opens its own record, which links back to its parent.
func TestTheViewerShowsAnOrchestratorsTreeAndCriticalPath(t *testing.T) {
	chromium(t)
	tasks, err := agent.LoadTasks("../../examples/parl/tasks.jsonl", nil)
	if err != nil {
		t.Fatal(err)
	}
	orch, err := scripted.Load("../../examples/parl/policy-spurious.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	subs, err := scripted.Load("../../examples/parl/subagents.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := runtime.RunBatch(ctx, runtime.BatchConfig{Tasks: tasks, OutDir: dir, Backend: "wasm", NewSandbox: wasmtest.Factory(t),
		Policy: orch, PolicyInfo: trajectory.Policy{Kind: "scripted"},
		SubagentPolicy: func(*agent.Task) (agent.Policy, trajectory.Policy, error) {
			return subs, trajectory.Policy{Kind: "scripted"}, nil
		}}); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "episodes", "*.json"))
	tr, err := trajectory.Read(files[0])
	if err != nil {
		t.Fatal(err)
	}
	srv, err := inspect.NewServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	end, _ := ctx.Deadline()
	bctx := tab(t, 1440, 960, time.Until(end))
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		return v
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(ts.URL+"/#/e/"+tr.EpisodeID),
		chromedp.WaitVisible(chromedp.CSS(`article.episode #subagents-card`))); err != nil {
		t.Fatal(err)
	}
	if n := eval(`String(document.querySelectorAll("li.ep").length)`); n != "1" {
		t.Errorf("%s episodes listed: sub-episodes are not the run's", n)
	}
	if got := eval(`document.querySelector("#critical-steps .v").textContent`); got != "5" {
		t.Errorf("critical steps shown %q", got)
	}
	if got := eval(`document.getElementById("critical-sum").textContent`); got != "critical steps = 1+3 + 1 (after the last stage) = 5" {
		t.Errorf("critical sum %q", got)
	}
	rows := eval(`[...document.querySelectorAll("#subagent-tree li.sub")].map(e => e.dataset.subagent + " " + e.dataset.critical + " " + e.querySelector("[data-end]").dataset.end).join("\n")`)
	var want []string
	for _, sa := range tr.Subagents {
		want = append(want, fmt.Sprintf("%s %v %s", sa.EpisodeID, sa.Critical, sa.End))
	}
	if rows != strings.Join(want, "\n") {
		t.Errorf("tree rows:\n%s\nwant:\n%s", rows, strings.Join(want, "\n"))
	}
	first := tr.Subagents[0].EpisodeID
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`li.sub[data-subagent="%s"] a`, first))),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`article.episode[data-episode-id="%s"] #parent a`, first)))); err != nil {
		t.Fatal(err)
	}
	if got := eval(`document.querySelector("#parent a").textContent`); got != tr.EpisodeID {
		t.Errorf("the sub-episode's parent link %q", got)
	}
}
