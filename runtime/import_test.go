package runtime_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
)

// fakeClock is the outcome windows' clock, moved by the test.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// importNDJSON posts an NDJSON body to /v1/imports.
func (s *service) importNDJSON(query string, body io.Reader) (int, *runtime.ImportResult, apiErr) {
	s.t.Helper()
	req, _ := http.NewRequest("POST", s.url+"/v1/imports"+query, body)
	req.Header.Set("Content-Type", "application/x-ndjson")
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("POST /v1/imports: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var res runtime.ImportResult
	var ae apiErr
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(raw, &res); err != nil {
			s.t.Fatalf("import answer %s: %v", raw, err)
		}
	} else {
		json.Unmarshal(raw, &ae)
	}
	return resp.StatusCode, &res, ae
}

// exportJSONL reads GET /v1/export?query as trajectories.
func (s *service) exportJSONL(query string) []*trajectory.Trajectory {
	s.t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/v1/export?"+query, nil)
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		s.t.Fatalf("GET /v1/export?%s: %d %s", query, resp.StatusCode, raw)
	}
	var out []*trajectory.Trajectory
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		t, err := trajectory.Decode(line)
		if err != nil {
			s.t.Fatalf("export line: %v", err)
		}
		out = append(out, t)
	}
	return out
}

// chatEpisode is a synthetic production episode in OpenAI chat format:
// a user asks, the model calls a tool, gets its result and answers.
func chatEpisode(id, prompt, version string, withIDs bool) map[string]any {
	asst1 := map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
		"function": map[string]any{"name": "read_file", "arguments": `{"path":"main.go"}`}}}}
	asst2 := map[string]any{"role": "assistant", "content": "Done: the bug is fixed."}
	if withIDs {
		asst1["prompt_token_ids"] = []int{1, 2, 3}
		asst1["completion_token_ids"] = []int{4, 5}
		asst1["logprobs"] = map[string]any{"content": []any{map[string]any{"token": "a", "logprob": -0.5}, map[string]any{"token": "b", "logprob": -0.25}}}
		asst2["prompt_token_ids"] = []int{1, 2, 3, 4, 5, 6, 7}
		asst2["completion_token_ids"] = []int{8}
		asst2["logprobs"] = []float64{-0.125}
	}
	return map[string]any{"id": id, "policy_version": version, "model": "composer-2", "temperature": 0.7,
		"messages": []any{
			map[string]any{"role": "system", "content": "You are a coding agent."},
			map[string]any{"role": "user", "content": prompt},
			asst1,
			map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "package main\n"},
			asst2,
		}}
}

func ndjson(lines ...any) string {
	var b strings.Builder
	for _, l := range lines {
		switch v := l.(type) {
		case string:
			b.WriteString(v)
		default:
			js, _ := json.Marshal(v)
			b.Write(js)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func TestProductionEpisodesAreImportedScoredFromLateOutcomesAndExportedInGroups(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	zero := 0.0
	spec := &runtime.OutcomeSpec{Type: "outcome", WindowS: 3600, Signals: []runtime.OutcomeSignalSpec{
		{Name: "accepted", Weight: 1, Default: &zero}, {Name: "tests_passed", Weight: 2, Default: &zero}, {Name: "thumbs", Weight: 0.5, Default: &zero}}}
	s := startService(t, "", func(o *runtime.Options) {
		o.Now, o.OutcomeSpec = clock.Now, spec
		o.Limits.MaxImportEpisodeBytes = 64 << 10
	})

	// 300 episodes over 30 prompts (10 each), every third with token ids,
	// two policy versions, and lines that must be refused.
	var lines []any
	bad := map[int]string{} // line → field
	for i := 0; i < 300; i++ {
		version := "v1"
		if i >= 150 {
			version = "v2"
		}
		prompt := fmt.Sprintf("Fix   the bug in module %d.", i%30)
		if i%2 == 1 {
			prompt = strings.ToUpper(prompt) // the same prompt once normalized
		}
		lines = append(lines, chatEpisode(fmt.Sprintf("sess-%03d", i), prompt, version, i%3 == 0))
	}
	secret := chatEpisode("sess-secret", "Fix the bug in module 0.", "v1", false)
	secret["messages"].([]any)[3].(map[string]any)["content"] = "my key is sk-abcdefghijklmnopqrstuvwx and mail me at dev@example.com, or dev2@example.org"
	secret["metadata"] = map[string]any{"note": "Authorization: Bearer abcdefghijklmnop0123456789"}
	lines = append(lines, secret)
	malformed := []struct {
		line  string
		field string
	}{
		{`{"id": "x1", "policy_version": "v1", "messages": [`, ""},
		{`[1, 2]`, ""},
		{ndjson(map[string]any{"policy_version": "v1", "messages": []any{map[string]any{"role": "user", "content": "q"}}}), "id"},
		{ndjson(map[string]any{"id": "x2", "messages": []any{map[string]any{"role": "user", "content": "q"}, map[string]any{"role": "assistant", "content": "a"}}}), "policy_version"},
		{ndjson(map[string]any{"id": "x3", "policy_version": "v1", "messages": []any{map[string]any{"role": "user", "content": "q"},
			map[string]any{"role": "tool", "tool_call_id": "nope", "content": "r"}}}), "messages[1].tool_call_id"},
		{ndjson(map[string]any{"id": "x4", "policy_version": "v1", "messages": []any{map[string]any{"role": "wizard", "content": "q"}}}), "messages[0].role"},
		{ndjson(map[string]any{"id": "x5", "policy_version": "v1", "colour": "blue", "messages": []any{}}), "colour"},
		{ndjson(map[string]any{"id": "x6", "policy_version": "v1", "messages": []any{map[string]any{"role": "user", "content": strings.Repeat("a", 70<<10)},
			map[string]any{"role": "assistant", "content": "a"}}}), ""},
		{ndjson(map[string]any{"id": "x7", "policy_version": "v1", "signals": []any{map[string]any{"name": "accepted", "value": "maybe"}},
			"messages": []any{map[string]any{"role": "user", "content": "q"}, map[string]any{"role": "assistant", "content": "a"}}}), "signals[0].value"},
		{ndjson(map[string]any{"id": "owner@example.com", "policy_version": "v1", "messages": []any{map[string]any{"role": "user", "content": "q"}, map[string]any{"role": "assistant", "content": "a"}}}), "id"},
	}
	for i, m := range malformed {
		at := 40 + i*25 // spread among the good lines
		lines = append(lines[:at], append([]any{strings.TrimSuffix(m.line, "\n")}, lines[at:]...)...)
	}
	for i, l := range lines {
		if s, ok := l.(string); ok {
			for _, m := range malformed {
				if strings.TrimSuffix(m.line, "\n") == s {
					bad[i+1] = m.field
				}
			}
		}
	}
	body := ndjson(lines...) + "\n" // a blank line is skipped
	code, res, ae := s.importNDJSON("", strings.NewReader(body))
	if code != 200 {
		t.Fatalf("import: %d %+v", code, ae)
	}
	if res.Accepted != 301 || res.Duplicates != 0 || res.RejectedCount != len(malformed) {
		t.Fatalf("accepted %d duplicates %d rejected %d (%+v), want 301, 0, %d", res.Accepted, res.Duplicates, res.RejectedCount, res.Rejected, len(malformed))
	}
	for _, r := range res.Rejected {
		field, ok := bad[r.Line]
		if !ok {
			t.Errorf("line %d refused but is good: %+v", r.Line, r)
		} else if field != "" && r.Field != field {
			t.Errorf("line %d: field %q, want %q (%s)", r.Line, r.Field, field, r.Message)
		}
	}
	ids := map[string]string{} // external → episode id
	for _, e := range res.Episodes {
		ids[e.ExternalID] = e.ID
	}
	if len(ids) != 301 {
		t.Fatalf("%d episode ids in the answer", len(ids))
	}

	t.Run("a resend is all duplicates and stores nothing twice", func(t *testing.T) {
		files, _ := filepath.Glob(filepath.Join(s.data, "episodes", "imp-*.json"))
		code, res2, _ := s.importNDJSON("", strings.NewReader(body))
		if code != 200 || res2.Accepted != 0 || res2.Duplicates != 301 || res2.RejectedCount != len(malformed) {
			t.Fatalf("resend: %d accepted %d duplicates %d rejected %d", code, res2.Accepted, res2.Duplicates, res2.RejectedCount)
		}
		for _, e := range res2.Episodes {
			if ids[e.ExternalID] != e.ID || !e.Duplicate {
				t.Errorf("resend of %s: %+v", e.ExternalID, e)
			}
		}
		again, _ := filepath.Glob(filepath.Join(s.data, "episodes", "imp-*.json"))
		if len(files) != 301 || len(again) != 301 {
			t.Errorf("%d then %d records, want 301", len(files), len(again))
		}
		// Another source is another namespace of ids.
		code, res3, _ := s.importNDJSON("?source=staging", strings.NewReader(ndjson(lines[0])))
		if code != 200 || res3.Accepted != 1 || res3.Episodes[0].ID == ids["sess-000"] {
			t.Errorf("another source: %d %+v", code, res3)
		}
	})

	t.Run("secrets are redacted before storage and recorded without the secret", func(t *testing.T) {
		raw, err := os.ReadFile(filepath.Join(s.data, "episodes", ids["sess-secret"]+".json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, leak := range []string{"sk-abcdefghijklmnopqrstuvwx", "dev@example.com", "dev2@example.org", "abcdefghijklmnop0123456789"} {
			if bytes.Contains(raw, []byte(leak)) {
				t.Errorf("the stored record holds %q", leak)
			}
		}
		var tr trajectory.Trajectory
		json.Unmarshal(raw, &tr)
		got := map[string]trajectory.Redaction{}
		for _, r := range tr.Redactions {
			got[r.Kind+" "+r.Path] = r
		}
		want := map[string]int{"api_key messages[3].content": 1, "email messages[3].content": 2, "bearer_token metadata.note": 1}
		for k, n := range want {
			if got[k].Count != n {
				t.Errorf("redaction %s: %+v, want count %d (all: %+v)", k, got[k], n, tr.Redactions)
			}
		}
		if out := tr.Steps[1].Output; !strings.Contains(out, "my key is [REDACTED:api_key] and mail me at [REDACTED:email], or [REDACTED:email]") {
			t.Errorf("tool output %q", out)
		}
		if err := trajectory.Validate(raw); err != nil {
			t.Errorf("the imported record does not match the schema: %v", err)
		}
	})

	// Outcomes: out of order, duplicated, one after the window.
	post := func(id string, sigs ...map[string]any) (int, runtime.OutcomeResult) {
		var out runtime.OutcomeResult
		code, _ := s.do("POST", "/v1/episodes/"+id+"/outcomes", map[string]any{"signals": sigs}, &out)
		return code, out
	}
	at := func(min int) string { return clock.Now().Add(time.Duration(min) * time.Minute).Format(time.RFC3339) }
	// Module 0's group (10 episodes + the secret one): every episode gets
	// accepted (later reverted to false for one), tests pass on even ones.
	for i := 0; i < 300; i++ {
		id := ids[fmt.Sprintf("sess-%03d", i)]
		switch i % 30 {
		case 0:
			// out of order: the later "accepted: false" arrives first for i == 0
			if i == 0 {
				post(id, map[string]any{"name": "accepted", "value": false, "at": at(20), "source": "editor"})
			}
			code, r := post(id, map[string]any{"name": "accepted", "value": true, "at": at(5), "source": "editor"},
				map[string]any{"name": "tests_passed", "value": i%60 == 0, "at": at(7), "source": "ci"})
			if code != 200 || r.Status != "pending" || r.Reward == nil || r.Reward.Total != nil || r.Reward.ErrorKind != "pending" {
				t.Fatalf("outcome of %s: %d %+v", id, code, r)
			}
			// a duplicate (same name, at, source; another spelling of the instant)
			dupAt := clock.Now().Add(5 * time.Minute).In(time.FixedZone("X", 3600)).Format(time.RFC3339)
			if code, r := post(id, map[string]any{"name": "accepted", "value": true, "at": dupAt, "source": "editor"}); code != 200 || r.Duplicates != 1 || r.Added != 0 {
				t.Errorf("duplicate: %d %+v", code, r)
			}
		case 1:
			// Module 1's group: everyone thumbs up, nothing else: zero variance.
			post(id, map[string]any{"name": "thumbs", "value": "up"})
		}
	}
	// Before the window closes nothing is scored: no 0, no early reward.
	early := s.exportJSONL("source=production")
	for _, tr := range early {
		if _, ok := tr.Value(); ok || tr.Reward == nil || tr.Reward.ErrorKind != trajectory.RewardPending || tr.Outcomes.Status != "pending" {
			t.Fatalf("episode %s scored before its window closed: %+v", tr.EpisodeID, tr.Reward)
		}
	}
	if code, r := post(ids["sess-000"], map[string]any{"name": "bogus value", "value": 1}); code != 400 {
		t.Errorf("a bad signal name: %d %+v", code, r)
	}
	var e apiErr
	if code, _ := s.do("POST", "/v1/episodes/imp-000000000000000000000000/outcomes", map[string]any{"signals": []any{map[string]any{"name": "accepted", "value": 1}}}, &e); code != 404 {
		t.Errorf("unknown episode: %d %+v", code, e)
	}

	clock.Add(61 * time.Minute)
	// Read at once after the window closed (before any sweep): scored.
	var read trajectory.Trajectory
	if s.do("GET", "/v1/episodes/"+ids["sess-060"], nil, &read); read.Outcomes.Status != "scored" || read.Reward.Total == nil || *read.Reward.Total != 3 {
		t.Errorf("sess-060 read after its window closed: %+v %+v", read.Outcomes.Status, read.Reward)
	}
	// A signal after the window closed is recorded late and changes nothing.
	code, late := post(ids["sess-030"], map[string]any{"name": "tests_passed", "value": true, "at": at(0), "source": "ci"})
	if code != 200 || late.Late != 1 || late.Status != "scored" || late.Reward.Total == nil || *late.Reward.Total != 1 {
		t.Errorf("a late signal: %d %+v", code, late)
	}

	all := s.exportJSONL("source=production")
	if len(all) != 301 {
		t.Fatalf("exported %d production episodes, want 301", len(all))
	}
	byExt := map[string]*trajectory.Trajectory{}
	for _, tr := range all {
		byExt[tr.Import.ExternalID] = tr
		if tr.Source != "production" || tr.Outcomes.Status != "scored" {
			t.Errorf("%s: source %q outcome %q", tr.EpisodeID, tr.Source, tr.Outcomes.Status)
		}
	}
	reward := func(ext string) float64 {
		v, ok := byExt[ext].Value()
		if !ok {
			t.Fatalf("%s unscored: %+v", ext, byExt[ext].Reward)
		}
		return v
	}
	// sess-000: accepted false at +20 is the last by time (it arrived
	// first), tests passed: 0 + 2.
	if r := reward("sess-000"); r != 2 {
		t.Errorf("sess-000 reward %v, want 2 (accepted false is the latest)", r)
	}
	if r := reward("sess-030"); r != 1 {
		t.Errorf("sess-030 reward %v, want 1 (accepted, tests failed, the late pass left out)", r)
	}
	if r := reward("sess-060"); r != 3 {
		t.Errorf("sess-060 reward %v, want 3", r)
	}
	if r := reward("sess-005"); r != 0 {
		t.Errorf("sess-005 reward %v, want 0 (defaults)", r)
	}
	// Groups: the normalized prompt groups sess-001, 031, 061, ... (module 1)
	// together across both policy versions; all thumbs up: zero variance.
	g1 := byExt["sess-001"].Group
	if g1 == nil || g1.Size != 10 || !g1.ZeroVariance || g1.RewardMean != 0.5 {
		t.Errorf("module 1's group: %+v", g1)
	}
	g0 := byExt["sess-000"].Group
	if g0 == nil || g0.Size != 11 || g0.ZeroVariance || math.Abs(byExt["sess-060"].Group.Advantage-(3-g0.RewardMean)) > 1e-9 {
		t.Errorf("module 0's group: %+v", g0)
	}
	if byExt["sess-000"].GroupID != byExt["sess-secret"].GroupID || byExt["sess-000"].GroupID == byExt["sess-001"].GroupID {
		t.Errorf("groups by prompt: %s %s %s", byExt["sess-000"].GroupID, byExt["sess-secret"].GroupID, byExt["sess-001"].GroupID)
	}

	t.Run("the export filters by policy version, time window and outcome", func(t *testing.T) {
		if n := len(s.exportJSONL("source=production&policy_version=v2")); n != 150 {
			t.Errorf("policy_version=v2: %d, want 150", n)
		}
		if n := len(s.exportJSONL("source=staging")); n != 1 {
			t.Errorf("source=staging: %d", n)
		}
		if n := len(s.exportJSONL("source=rollout")); n != 0 {
			t.Errorf("source=rollout: %d", n)
		}
		if n := len(s.exportJSONL("until=2026-11-30T11:00:00Z")); n != 0 {
			t.Errorf("until before the imports: %d", n)
		}
		if n := len(s.exportJSONL("since=2026-11-30T11:00:00Z&until=2026-11-30T13:00:00Z&source=production")); n != 301 {
			t.Errorf("a window around the imports: %d", n)
		}
		if n := len(s.exportJSONL("outcome=pending")); n != 0 {
			t.Errorf("outcome=pending after the windows closed: %d", n)
		}
	})

	t.Run("the export has the rollout columns and the token columns where ids were imported", func(t *testing.T) {
		resp, err := http.Get(s.url + "/v1/export?source=production&format=parquet&policy_version=v1")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		rows, err := runtime.ReadParquet(bytes.NewReader(raw), int64(len(raw)))
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 151 {
			t.Fatalf("%d rows", len(rows))
		}
		for _, r := range rows {
			if r.EpisodeID == ids["sess-000"] {
				var msgs []map[string]any
				json.Unmarshal([]byte(r.Messages), &msgs)
				if r.Source != "production" || r.PolicyVersion != "v1" || r.OutcomeStatus != "scored" || r.RewardTotal == nil || *r.RewardTotal != 2 ||
					r.GroupSize == nil || *r.GroupSize != 6 || // module 0 in v1: 0, 30, 60, 90, 120 and the secret one
					r.Turns != 2 || r.ToolCalls != 1 || len(msgs) != 5 || r.PolicyModel != "composer-2" {
					t.Errorf("row of sess-000: %+v", r)
				}
			}
			if r.EpisodeID == ids["sess-secret"] && !strings.Contains(r.Redactions, `"email"`) {
				t.Errorf("redactions column %q", r.Redactions)
			}
		}
		resp, err = http.Get(s.url + "/v1/export?source=production&layout=segments&policy_version=v1")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		segs := bytes.Split(bytes.TrimSpace(raw), []byte("\n"))
		if len(segs) != 50 { // every third of 150
			t.Fatalf("%d segment rows, want 50", len(segs))
		}
		var row runtime.SegmentRow
		json.Unmarshal(segs[0], &row)
		wantIDs := []int64{1, 2, 3, 4, 5, 6, 7, 8}
		if fmt.Sprint(row.InputIDs) != fmt.Sprint(wantIDs) || fmt.Sprint(row.LossMask) != "[0 0 0 1 1 0 0 1]" ||
			fmt.Sprint(row.Logprobs) != "[0 0 0 -0.5 -0.25 0 0 -0.125]" || row.PolicyVersion != "v1" || row.Source != "production" || !row.Scored {
			t.Errorf("segment row: %+v", row)
		}
	})

	t.Run("an imported episode reads back with its signals", func(t *testing.T) {
		var tr trajectory.Trajectory
		if code, _ := s.do("GET", "/v1/episodes/"+ids["sess-000"], nil, &tr); code != 200 {
			t.Fatalf("GET: %d", code)
		}
		if len(tr.Outcomes.Signals) != 3 || tr.Import.PolicyVersion != "v1" || tr.Source != "production" || tr.Steps[0].Type != "model" {
			t.Errorf("%+v", tr.Outcomes)
		}
	})
}

func TestImportsAreBoundedAndRefuseWhatTheyCannotTake(t *testing.T) {
	s := startService(t, "", func(o *runtime.Options) { o.Limits.MaxImports = 1 })
	// One import holds the only slot while its body trickles in.
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code, _, _ := s.importNDJSON("", pr)
		done <- code
	}()
	pw.Write([]byte(ndjson(chatEpisode("slow-1", "q", "v1", false))))
	// Probe only once the first holds the slot: a probe sent before its
	// request reached the handler could take the slot itself, and the first
	// would then be the one refused (its 429 held back until its body ends).
	for deadline := time.Now().Add(10 * time.Second); s.srv.ImportsRunning() != 1; time.Sleep(5 * time.Millisecond) {
		select {
		case first := <-done:
			t.Fatalf("the first import ended with %d before its body did", first)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the first import did not take a slot within 10 s")
		}
	}
	code, _, ae := s.importNDJSON("", strings.NewReader(ndjson(chatEpisode("probe", "q", "v1", false))))
	if code != 429 || ae.Error.Code != "overloaded" {
		t.Fatalf("a second import while the first ran: %d %+v", code, ae)
	}
	pw.Close()
	if code := <-done; code != 200 {
		t.Fatalf("the first import: %d", code)
	}
	if code, res, _ := s.importNDJSON("", strings.NewReader(ndjson(chatEpisode("fast-1", "q", "v1", false)))); code != 200 || res.Accepted != 1 {
		t.Errorf("after the first ended: %d %+v", code, res)
	}
	for _, tt := range []struct{ query, field string }{{"?source=rollout", "source"}, {"?group_by=colour", "group_by"}, {"?source=Bad%20Label", "source"}} {
		code, _, ae := s.importNDJSON(tt.query, strings.NewReader(""))
		if code != 400 || ae.Error.Field != tt.field {
			t.Errorf("%s: %d %+v", tt.query, code, ae)
		}
	}
	// An import that takes longer than the write timeout to send is still
	// answered: the answer's deadline starts when the body has been read.
	slow := startService(t, "", func(o *runtime.Options) { o.HTTP.Write = 100 * time.Millisecond })
	hs := httptest.NewUnstartedServer(slow.srv.Handler())
	hs.Config = slow.srv.HTTPServer()
	hs.Start()
	defer hs.Close()
	slow.url = hs.URL
	pr2, pw2 := io.Pipe()
	go func() {
		pw2.Write([]byte(ndjson(chatEpisode("slow-a", "q", "v1", false))))
		time.Sleep(250 * time.Millisecond)
		pw2.Write([]byte(ndjson(chatEpisode("slow-b", "q", "v1", false))))
		pw2.Close()
	}()
	if code, res, ae := slow.importNDJSON("", pr2); code != 200 || res.Accepted != 2 {
		t.Errorf("a slow import: %d %+v %+v", code, res, ae)
	}
	if code, _ := s.raw("POST", "/v1/imports", "text/plain", "{}"); code != 415 {
		t.Errorf("text/plain: %d", code)
	}
}

func TestRollboxTrajectoriesAreImportedAndCheckedAgainstTheSchema(t *testing.T) {
	s := startService(t, "")
	now := time.Now().UTC()
	kind := "nonzero_exit"
	code := 1
	rec := trajectory.Trajectory{Schema: trajectory.Schema, EpisodeID: "r1.fix.0", RolloutID: "r1", GroupID: "r1.fix", TaskID: "fix",
		Task: json.RawMessage(`{"id":"fix","prompt":"Fix it","sandbox":{"image":"python"}}`), StartedAt: now, EndedAt: &now,
		Sandbox: trajectory.Sandbox{Backend: "docker", Image: "python"}, Policy: trajectory.Policy{Kind: "openai", Model: "m"},
		Steps: []trajectory.Step{
			{Type: trajectory.StepModel, PolicyVersion: "v9", ToolCalls: []trajectory.ToolCall{{ID: "c", Name: "bash", Arguments: `{"command":"pytest"}`}}},
			{Index: 1, Type: trajectory.StepTool, Name: "bash", CallID: "c", ErrorKind: &kind, ExitCode: &code, Output: "1 failed"},
		},
		ContextEvents: []trajectory.ContextEvent{}, Termination: &trajectory.Termination{Reason: trajectory.EndFinished, Step: 1},
		Reward: &trajectory.Reward{Total: trajectory.Score(1), Components: map[string]float64{"tests": 1}},
		Stats:  trajectory.Stats{Turns: 1, ToolCalls: 1, ToolErrors: map[string]int{"nonzero_exit": 1}, PolicyVersions: map[string]int{"v9": 1}}}
	good, _ := json.Marshal(rec)
	rec.Steps[0].Type = "thought"
	bad, _ := json.Marshal(rec)
	codeHTTP, res, ae := s.importNDJSON("", strings.NewReader(ndjson(string(good), string(bad))))
	if codeHTTP != 200 || res.Accepted != 1 || res.RejectedCount != 1 {
		t.Fatalf("%d %+v %+v", codeHTTP, res, ae)
	}
	if r := res.Rejected[0]; r.Line != 2 || r.Field != "steps[0].type" {
		t.Errorf("rejected %+v", r)
	}
	var tr trajectory.Trajectory
	s.do("GET", "/v1/episodes/"+res.Episodes[0].ID, nil, &tr)
	if tr.Import.ExternalID != "r1.fix.0" || tr.Import.PolicyVersion != "v9" || tr.Import.GroupBy != "group_id" || tr.Source != "production" ||
		tr.Reward.ErrorKind != "pending" || tr.RolloutID != "" || len(tr.Steps) != 2 || tr.Stats.ToolErrors["nonzero_exit"] != 1 {
		t.Errorf("imported record: %+v %+v %+v", tr.Import, tr.Reward, tr.Stats)
	}
}

func TestRedactionFindsEveryDefaultKindWhereverItIsAndHowEverItIsEscaped(t *testing.T) {
	r, err := runtime.NewRedactor(runtime.RedactionConfig{Patterns: []runtime.RedactionPattern{{Kind: "customer", Regex: `cust=(?P<secret>[0-9]{6})`}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ in, want string }{
		{"key sk-proj-0123456789abcdefghijKLMN end", "key [REDACTED:api_key] end"},
		{"AKIAABCDEFGHIJKLMNOP", "[REDACTED:api_key]"},
		{"ghp_" + strings.Repeat("a1", 18), "[REDACTED:api_key]"},
		{"Authorization: bEaReR abcdefghijklmnopqrstu.v-w", "Authorization: bEaReR [REDACTED:bearer_token]"},
		{"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlX3g", "[REDACTED:jwt]"},
		{"postgres://admin:hunter2@db:5432/x", "postgres://admin:[REDACTED:url_credentials]@db:5432/x"},
		{"-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----", "[REDACTED:private_key]"},
		{"write to Jane.Doe+x@mail.example.co.uk now", "write to [REDACTED:email] now"},
		{"order cust=123456 shipped", "order cust=[REDACTED:customer] shipped"},
		{"nothing secret: a@b is not an email, sk-short neither", "nothing secret: a@b is not an email, sk-short neither"},
	} {
		if got := r.String(tt.in, func(string, int) {}); got != tt.want {
			t.Errorf("%q\n got %q\nwant %q", tt.in, got, tt.want)
		}
	}
	if _, err := runtime.NewRedactor(runtime.RedactionConfig{Patterns: []runtime.RedactionPattern{{Kind: "x", Regex: `a*`}}}); err == nil {
		t.Error("a pattern matching the empty string was taken")
	}

	// Through an import: a secret written with JSON escapes is found too,
	// by the default patterns and by the operator's.
	for _, tt := range []struct {
		redactor *runtime.Redactor
		content  string
		leaks    []string
	}{
		{nil, `mail jane\u0040example.com`, []string{"jane@example.com"}},
		{nil, `Bearer\tabcdefghijklmnopqrstuvwx`, []string{"abcdefghijklmnopqrstuvwx"}},
		{r, `db https:\/\/u:pw12345@h\/ , CUST=1 cust=654321`, []string{"pw12345", "654321"}},
	} {
		s := startService(t, "", func(o *runtime.Options) { o.Redactor = tt.redactor })
		line := `{"id": "esc", "policy_version": "v1", "messages": [{"role": "user", "content": "` + tt.content + `"}, {"role": "assistant", "content": "ok"}]}`
		code, res, _ := s.importNDJSON("", strings.NewReader(line+"\n"))
		if code != 200 || res.Accepted != 1 {
			t.Fatalf("%d %+v", code, res)
		}
		raw, _ := os.ReadFile(filepath.Join(s.data, "episodes", res.Episodes[0].ID+".json"))
		for _, leak := range tt.leaks {
			if bytes.Contains(raw, []byte(leak)) {
				t.Errorf("%s: stored %q", tt.content, leak)
			}
		}
	}
}

func TestTenantsImportSeeAndScoreOnlyTheirOwnEpisodes(t *testing.T) {
	tenants, err := runtime.ParseTenants(strings.NewReader("alice 0123456789abcdef0123\nbob fedcba9876543210fedc\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	s := startService(t, "", func(o *runtime.Options) { o.Tenants = tenants })
	alice := &service{t: t, srv: s.srv, http: s.http, url: s.url, token: "0123456789abcdef0123"}
	bob := &service{t: t, srv: s.srv, http: s.http, url: s.url, token: "fedcba9876543210fedc"}
	line := ndjson(chatEpisode("sess-1", "q", "v1", false))
	if code, _, _ := s.importNDJSON("", strings.NewReader(line)); code != 401 {
		t.Errorf("an import without a token: %d", code)
	}
	_, a, _ := alice.importNDJSON("", strings.NewReader(line))
	_, b, _ := bob.importNDJSON("", strings.NewReader(line))
	// The same caller's id from another tenant is another episode, not a
	// duplicate: a tenant learns nothing of another's ids.
	if a.Accepted != 1 || b.Accepted != 1 || b.Duplicates != 0 || a.Episodes[0].ID == b.Episodes[0].ID {
		t.Fatalf("alice %+v bob %+v", a, b)
	}
	if got := bob.exportJSONL(""); len(got) != 1 || got[0].EpisodeID != b.Episodes[0].ID {
		t.Errorf("bob's export: %d episodes", len(got))
	}
	var e apiErr
	if code, _ := bob.do("POST", "/v1/episodes/"+a.Episodes[0].ID+"/outcomes", map[string]any{"signals": []any{map[string]any{"name": "accepted", "value": 1}}}, &e); code != 404 {
		t.Errorf("bob scoring alice's episode: %d %+v", code, e)
	}
	if code, _ := bob.do("GET", "/v1/episodes/"+a.Episodes[0].ID, nil, nil); code != 404 {
		t.Errorf("bob reading alice's episode: %d", code)
	}
}

func TestARecordWrittenButNeverIndexedIsRemovedAtTheNextStart(t *testing.T) {
	dir := t.TempDir()
	s := startService(t, dir)
	_, res, _ := s.importNDJSON("", strings.NewReader(ndjson(chatEpisode("kept", "q", "v1", false))))
	kept := filepath.Join(dir, "episodes", res.Episodes[0].ID+".json")
	if err := s.srv.Close(); err != nil {
		t.Fatal(err)
	}
	// What a process killed between a chunk's records and its index
	// leaves: a record no answer ever named.
	raw, _ := os.ReadFile(kept)
	stray := filepath.Join(dir, "episodes", "imp-0000000000000000000000ff.json")
	os.WriteFile(stray, raw, 0o644)
	s2 := startService(t, dir)
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Errorf("the unindexed record is still there: %v", err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("the indexed record: %v", err)
	}
	if fmt.Sprint(s2.rec.UnindexedImports) != "[imp-0000000000000000000000ff]" {
		t.Errorf("recovery: %+v", s2.rec)
	}
}

// Imported production episodes are read by the same reward-hacking monitors
// as the episodes Rollbox ran, computed from their record at import (a
// rollbox trajectory's own monitors are not trusted: they are recomputed),
// and counted in the metrics and the export's group statistics.
func TestImportedEpisodesGetTheirMonitors(t *testing.T) {
	s := startService(t, "")
	call := func(id string) map[string]any {
		return map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": id, "type": "function",
			"function": map[string]any{"name": "read_file", "arguments": `{"path":"main.go"}`}}}}
	}
	repeats := map[string]any{"id": "mon-chat", "policy_version": "v1", "model": "m", "messages": []any{
		map[string]any{"role": "user", "content": "Fix main.go"},
		call("c1"), map[string]any{"role": "tool", "tool_call_id": "c1", "content": "package main\n"},
		call("c2"), map[string]any{"role": "tool", "tool_call_id": "c2", "content": "package main\n"},
		call("c3"), map[string]any{"role": "tool", "tool_call_id": "c3", "content": "package main\n"},
		map[string]any{"role": "assistant", "content": "Done."},
	}}
	now := time.Now().UTC()
	zero := 0
	forged := trajectory.Trajectory{Schema: trajectory.Schema, EpisodeID: "mon-traj", RolloutID: "r1", GroupID: "r1.fix", TaskID: "fix",
		Task: json.RawMessage(`{"id":"fix","prompt":"Fix it"}`), StartedAt: now, EndedAt: &now,
		Sandbox: trajectory.Sandbox{Backend: "docker", Image: "python"}, Policy: trajectory.Policy{Kind: "openai", Model: "m"},
		Steps: []trajectory.Step{
			{Type: trajectory.StepModel, PolicyVersion: "v1", ToolCalls: []trajectory.ToolCall{{ID: "a", Name: "bash", Arguments: `{"command":"ls"}`}}},
			{Index: 1, Type: trajectory.StepTool, Name: "bash", CallID: "a", ExitCode: &zero, Output: "x\n"},
			{Index: 2, Type: trajectory.StepModel, PolicyVersion: "v1", ToolCalls: []trajectory.ToolCall{{ID: "b", Name: "bash", Arguments: `{"command":"ls"}`}}},
			{Index: 3, Type: trajectory.StepTool, Name: "bash", CallID: "b", ExitCode: &zero, Output: "x\n"},
		},
		ContextEvents: []trajectory.ContextEvent{}, Termination: &trajectory.Termination{Reason: trajectory.EndFinished, Step: 3},
		Monitors: &trajectory.Monitors{RepeatedCalls: &zero}, // forged: the record repeats a call
		Stats:    trajectory.Stats{Turns: 2, ToolCalls: 2, ToolErrors: map[string]int{}, PolicyVersions: map[string]int{"v1": 2}}}
	code, res, ae := s.importNDJSON("?source=mon", strings.NewReader(ndjson(repeats, forged)))
	if code != 200 || res.Accepted != 2 {
		t.Fatalf("%d %+v %+v", code, res, ae)
	}
	for i, want := range []int{2, 1} {
		var tr trajectory.Trajectory
		s.do("GET", "/v1/episodes/"+res.Episodes[i].ID, nil, &tr)
		if tr.Monitors == nil || tr.Monitors.RepeatedCalls == nil || *tr.Monitors.RepeatedCalls != want {
			t.Errorf("%s: monitors %+v, want repeated_calls %d", res.Episodes[i].ID, tr.Monitors, want)
		}
	}
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `rollbox_monitor_episodes_total{monitor="repeated_calls"} 2`) {
		t.Errorf("metrics count no imported episode's monitor:\n%s", grepLines(string(metrics), "rollbox_monitor"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
