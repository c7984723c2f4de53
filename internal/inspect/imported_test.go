package inspect_test

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/inspect"
)

// importedEpisode is a production episode as POST /v1/imports records it:
// a later user message, two signals (one late), a redaction, pending or
// scored.
func importedEpisode(id string, scored bool) *trajectory.Trajectory {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tr := &trajectory.Trajectory{Schema: trajectory.Schema, EpisodeID: id, GroupID: "production.prompt.ab", TaskID: "prompt-ab",
		Task: json.RawMessage(`{"id":"prompt-ab","prompt":"Fix the bug"}`), StartedAt: now, EndedAt: &now,
		Sandbox: trajectory.Sandbox{Backend: "none"}, Policy: trajectory.Policy{Kind: "production", Model: "composer-2"},
		Steps: []trajectory.Step{
			{Type: trajectory.StepModel, Content: "Which file?"},
			{Index: 1, Type: trajectory.StepUser, Turn: 0, Content: "main.go, please"},
			{Index: 2, Type: trajectory.StepModel, Turn: 1, Content: "Fixed."},
		},
		ContextEvents: []trajectory.ContextEvent{}, Termination: &trajectory.Termination{Reason: trajectory.EndFinished, Step: 2},
		Stats:  trajectory.Stats{Turns: 2, ToolErrors: map[string]int{}},
		Source: trajectory.SourceProduction,
		Import: &trajectory.Import{ExternalID: "sess-42", Format: "openai", ImportedAt: now, PolicyVersion: "v7", GroupBy: "prompt", GroupKey: "ab",
			Missing: []string{"task.sandbox (an image)"}},
		Redactions: []trajectory.Redaction{{Kind: "email", Path: "messages[1].content", Count: 2}},
		Outcomes: &trajectory.Outcomes{Status: trajectory.OutcomePending, MaturesAt: now.Add(time.Hour), Spec: json.RawMessage(`{"type":"outcome"}`),
			Signals: []trajectory.Signal{{Name: "accepted", Value: 1, Raw: json.RawMessage("true"), At: "2026-11-30T12:05:00Z", Source: "editor", Recv: now}}},
		Reward: trajectory.Unscored(trajectory.RewardPending, nil, "the outcome window closes at 2026-11-30T13:00:00Z")}
	if scored {
		tr.Outcomes.Status = trajectory.OutcomeScored
		tr.Outcomes.Signals = append(tr.Outcomes.Signals, trajectory.Signal{Name: "tests_passed", Value: 1, At: "2026-11-30T14:00:00Z", Recv: now, Late: true})
		tr.Reward = &trajectory.Reward{Total: trajectory.Score(1), Components: map[string]float64{"accepted": 1}}
	}
	return tr
}

func TestAnImportedEpisodeShowsItsSourceSignalsAndRedactions(t *testing.T) {
	var buf bytes.Buffer
	inspect.Render(&buf, importedEpisode("imp-1", true), inspect.Options{})
	out := buf.String()
	for _, want := range []string{"source    production · imported 2026-11-30 12:00:00 UTC as openai · id sess-42 · policy version v7 · grouped by prompt",
		"redacted  email ×2 at messages[1].content", "user #1", "main.go, please", "outcomes  scored · 2 signal(s)",
		"accepted          1.000 (true) at 2026-11-30T12:05:00Z from editor", "late: not in the reward"} {
		if !strings.Contains(out, want) {
			t.Errorf("the terminal view lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	inspect.Render(&buf, importedEpisode("imp-2", false), inspect.Options{})
	if !strings.Contains(buf.String(), "none (unscored: pending)") || !strings.Contains(buf.String(), "pending until 2026-11-30 13:00:00 UTC") {
		t.Errorf("a pending episode:\n%s", buf.String())
	}

	// The viewer's API lists them with their source and filters by it.
	dir := t.TempDir()
	for _, tr := range []*trajectory.Trajectory{importedEpisode("imp-1", true), importedEpisode("imp-2", false)} {
		if err := trajectory.WriteFile(filepath.Join(dir, tr.EpisodeID+".json"), tr); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := inspect.NewServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	if l := getList(t, ts.URL, "?source=production&outcome=pending"); len(l.Episodes) != 1 || l.Episodes[0].ID != "imp-2" || l.Episodes[0].Signals != 1 {
		t.Errorf("source=production&outcome=pending: %+v", l.Episodes)
	}
	if l := getList(t, ts.URL, "?source=rollout"); len(l.Episodes) != 0 {
		t.Errorf("source=rollout: %d", len(l.Episodes))
	}

	// And the page shows the outcome and import cards.
	bctx := tab(t, 800, 600, 60*time.Second) // headless Chromium's default window
	if err := chromedp.Do(bctx,
		chromedp.Navigate(ts.URL+"/#/e/imp-1"),
		chromedp.WaitVisible(chromedp.CSS("#outcome-card")),
	); err != nil {
		t.Fatalf("the viewer: %v", err)
	}
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		return v
	}
	status := eval(`document.getElementById("outcome-status").textContent`)
	signals := eval(`[...document.querySelectorAll("#outcome-card [data-signal]")].map(e => e.dataset.signal + ":" + e.dataset.late).join(",")`)
	redaction := eval(`document.getElementById("import-card").textContent`)
	source := eval(`document.getElementById("source-badge").textContent`)
	user := eval(`document.querySelector("li.tl.user").textContent`)
	if !strings.HasPrefix(status, "scored") || signals != "accepted:false,tests_passed:true" || !strings.Contains(redaction, "redacted email at messages[1].content") ||
		!strings.Contains(redaction, "sess-42") || source != "source production" || !strings.Contains(user, "main.go, please") {
		t.Errorf("status %q signals %q import card %q source %q user %q", status, signals, redaction, source, user)
	}
}
