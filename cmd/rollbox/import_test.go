package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
)

// prodLine is one synthetic production episode (OpenAI chat format).
func prodLine(i int) string {
	b, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("kill-%04d", i), "policy_version": "v1", "model": "m",
		"messages": []any{
			map[string]any{"role": "user", "content": fmt.Sprintf("Task %d: rename foo to bar in %s", i%20, strings.Repeat("x", 200))},
			map[string]any{"role": "assistant", "content": "Done."},
		}})
	return string(b) + "\n"
}

// postLines imports lines; ok reports a 200 answer.
func postLines(url string, body io.Reader) (*runtime.ImportResult, bool) {
	resp, err := http.Post(url+"/v1/imports", "application/x-ndjson", body)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	var res runtime.ImportResult
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&res) != nil {
		return nil, false
	}
	return &res, true
}

// waitListening reads a child rollbox serve's address from its log.
func waitListening(t *testing.T, out *bytes.Buffer) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if m := listenRe.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("rollbox serve did not listen:\n%s", out)
	return ""
}

// A `rollbox serve` killed with SIGKILL in the middle of an import loses
// nothing it acknowledged and, after the sender resends everything with
// rollbox import, holds every episode exactly once.
func TestAServiceKilledMidImportLosesNothingAcknowledgedAndStoresNothingTwice(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	const total, acked, batch, chunk = 2000, 500, 100, 1024 // chunk: runtime's importChunkEpisodes
	var all strings.Builder
	for i := 0; i < total; i++ {
		all.WriteString(prodLine(i))
	}
	file := filepath.Join(dir, "prod.ndjson")
	os.WriteFile(file, []byte(all.String()), 0o644)

	cmd, out := startRollbox(t, "serve", "--addr", "127.0.0.1:0", "--data", data)
	url := waitListening(t, out)
	// Five imports answered: every id they name is acknowledged.
	ackedIDs := map[string]string{}
	for from := 0; from < acked; from += batch {
		var b strings.Builder
		for i := from; i < from+batch; i++ {
			b.WriteString(prodLine(i))
		}
		res, ok := postLines(url, strings.NewReader(b.String()))
		if !ok || res.Accepted != batch {
			t.Fatalf("import of lines %d..%d: %+v", from, from+batch, res)
		}
		for _, e := range res.Episodes {
			ackedIDs[e.ExternalID] = e.ID
		}
	}
	// A sixth import is under way: its first chunk is stored, the rest is
	// still being sent, when the service is killed.
	pr, pw := io.Pipe()
	answered := make(chan bool, 1)
	go func() { _, ok := postLines(url, pr); answered <- ok }()
	for i := acked; i < acked+chunk+100; i++ {
		pw.Write([]byte(prodLine(i)))
	}
	deadline := time.Now().Add(30 * time.Second)
	stored := fmt.Sprintf("rollbox_imported_episodes_total %d", acked+chunk)
	for {
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		m, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(m), stored) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sixth import's first chunk was not stored")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	pw.Close()
	if <-answered {
		t.Fatal("the killed import was answered")
	}

	// Restarted on the same data: what was acknowledged is there, and no
	// record is on disk that the index does not know.
	_, out2 := startRollbox(t, "serve", "--addr", "127.0.0.1:0", "--data", data)
	url = waitListening(t, out2)
	if files, _ := filepath.Glob(filepath.Join(data, "episodes", "imp-*.json")); len(files) != acked+chunk {
		t.Errorf("%d records on disk after the restart, want the %d indexed", len(files), acked+chunk)
	}
	for ext, id := range ackedIDs {
		resp, err := http.Get(url + "/v1/episodes/" + id)
		if err != nil {
			t.Fatal(err)
		}
		var tr trajectory.Trajectory
		json.NewDecoder(resp.Body).Decode(&tr)
		resp.Body.Close()
		if resp.StatusCode != 200 || tr.Import == nil || tr.Import.ExternalID != ext {
			t.Fatalf("acknowledged episode %s (%s) after the kill: %d %+v", ext, id, resp.StatusCode, tr.Import)
		}
	}
	// The sender resends the whole file: everything stored before counts
	// as a duplicate, the rest is stored, nothing twice.
	code, stdout := rollboxProcess(t, "import", file, "--server", url, "--json")
	var res runtime.ImportResult
	if i := strings.Index(stdout, "{"); i >= 0 {
		json.NewDecoder(strings.NewReader(stdout[i:])).Decode(&res)
	}
	if code != 0 || res.Accepted+res.Duplicates != total || res.Duplicates != acked+chunk || res.RejectedCount != 0 {
		t.Fatalf("rollbox import after the restart: exit %d, %d accepted, %d duplicates\n%s", code, res.Accepted, res.Duplicates, stdout)
	}
	if !strings.Contains(stdout, fmt.Sprintf("%d stored, %d duplicates, 0 refused", res.Accepted, res.Duplicates)) {
		t.Errorf("the summary line:\n%s", stdout)
	}
	resp, err := http.Get(url + "/v1/export?source=production")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	seen := map[string]int{}
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		tr, err := trajectory.Decode(line)
		if err != nil {
			t.Fatal(err)
		}
		seen[tr.Import.ExternalID]++
	}
	if len(seen) != total {
		t.Errorf("%d distinct episodes exported, want %d", len(seen), total)
	}
	for ext, n := range seen {
		if n != 1 {
			t.Errorf("%s stored %d times", ext, n)
		}
	}
	files, _ := filepath.Glob(filepath.Join(data, "episodes", "imp-*.json"))
	if len(files) != total {
		t.Errorf("%d records on disk, want %d", len(files), total)
	}
}

func TestRollboxImportSaysWhichLinesItRefused(t *testing.T) {
	url, stop := serve(t, "--data", t.TempDir())
	defer stop()
	dir := t.TempDir()
	file := writeFile(t, dir, "mixed.ndjson", prodLine(1)+`{"id": "no-messages", "policy_version": "v1"}`+"\n"+prodLine(2)+"not json")
	code, out := rollboxProcess(t, "import", file, "--server", url)
	if code != exitBadInput {
		t.Fatalf("exit %d, want 2\n%s", code, out)
	}
	for _, want := range []string{"2 stored, 0 duplicates, 2 refused", "line 2: messages: is required", "line 4: (line): malformed JSON"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code, out := rollboxProcess(t, "import", file, "--server", "ftp://x"); code != exitBadInput || !strings.Contains(out, "not an http(s) URL") {
		t.Errorf("a bad --server: %d %s", code, out)
	}
	if code, out := rollboxProcess(t, "import", file, "--server", url, "--group-by", "colour"); code != exitBadInput || !strings.Contains(out, "group_by") {
		t.Errorf("a bad --group-by: %d %s", code, out)
	}
}
