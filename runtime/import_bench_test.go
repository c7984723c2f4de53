package runtime_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/runtime"
)

// benchImportFile writes an NDJSON file of about mb MiB of production
// episodes: a coding conversation of ~7 KiB (a system prompt, the user's
// request, a tool call, the file it read, the answer), a tenth with token
// ids and logprobs, a twentieth with an email and an API key to redact.
func benchImportFile(b *testing.B, dir string, mb int) (path string, episodes int, size int64) {
	b.Helper()
	path = filepath.Join(dir, "prod.ndjson")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	code := strings.Repeat("func handler(w http.ResponseWriter, r *http.Request) {\n\tfmt.Fprintf(w, \"hello %s\", r.URL.Path)\n}\n", 60)
	ids := make([]int, 400)
	lps := make([]float64, 100)
	for i := range ids {
		ids[i] = 1000 + i*7
	}
	for i := range lps {
		lps[i] = -0.01 * float64(i)
	}
	for size < int64(mb)<<20 {
		user := fmt.Sprintf("In service %d, make the handler return JSON instead of text.", episodes%5000)
		if episodes%20 == 0 {
			user += " My key is sk-proj0123456789abcdefghijkl, mail ops@example.com if stuck."
		}
		asst := map[string]any{"role": "assistant", "content": "Done: the handler now writes JSON with the path."}
		if episodes%10 == 0 {
			asst["prompt_token_ids"], asst["completion_token_ids"], asst["logprobs"] = ids, ids[:100], lps
		}
		line, _ := json.Marshal(map[string]any{"id": "bench-" + strconv.Itoa(episodes), "policy_version": "v" + strconv.Itoa(episodes/20000),
			"model": "composer-2", "temperature": 0.6, "messages": []any{
				map[string]any{"role": "system", "content": "You are a careful coding agent working in the user's repository."},
				map[string]any{"role": "user", "content": user},
				map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
					"function": map[string]any{"name": "read_file", "arguments": `{"path":"server/handler.go"}`}}}},
				map[string]any{"role": "tool", "tool_call_id": "call_1", "content": code},
				asst,
			}})
		w.Write(line)
		w.WriteByte('\n')
		size += int64(len(line) + 1)
		episodes++
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	return path, episodes, size
}

// resetPeakRSS resets this process's VmHWM (Linux: clear_refs 5).
func resetPeakRSS() { os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// BenchmarkImport measures POST /v1/imports of a 1 GiB NDJSON file
// (ROLLBOX_IMPORT_BENCH_MB sets another size) through a real HTTP server
// into a data directory, against the baseline of decoding every line of
// the same file as JSON (the least any importer does): episodes/s, MB/s
// and the process's peak RSS during each.
//
//	go test ./runtime -run '^$' -bench BenchmarkImport -benchtime 1x
func BenchmarkImport(b *testing.B) {
	mb := 1024
	if v, err := strconv.Atoi(os.Getenv("ROLLBOX_IMPORT_BENCH_MB")); err == nil && v > 0 {
		mb = v
	}
	dir := b.TempDir() // removed after the benchmark, with the data directory
	path, episodes, size := benchImportFile(b, dir, mb)
	report := func(b *testing.B, took time.Duration) {
		b.ReportMetric(float64(episodes)*float64(b.N)/took.Seconds(), "episodes/s")
		b.ReportMetric(float64(size)*float64(b.N)/took.Seconds()/1e6, "MB/s")
		b.ReportMetric(float64(runtime.PeakRSS())/(1<<20), "peak_rss_MiB")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("baseline_json_decode", func(b *testing.B) {
		resetPeakRSS()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			f, _ := os.Open(path)
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 16<<20)
			n := 0
			for sc.Scan() {
				var v any
				if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
					b.Fatal(err)
				}
				n++
			}
			f.Close()
			if n != episodes {
				b.Fatalf("%d lines", n)
			}
		}
		report(b, time.Since(start))
	})
	b.Run("import", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s := startService(b, filepath.Join(dir, fmt.Sprintf("data-%d", i)))
			f, _ := os.Open(path)
			resetPeakRSS()
			start := time.Now()
			req, _ := http.NewRequest("POST", s.url+"/v1/imports", f)
			req.Header.Set("Content-Type", "application/x-ndjson")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			var res runtime.ImportResult
			json.NewDecoder(resp.Body).Decode(&res)
			resp.Body.Close()
			took := time.Since(start)
			f.Close()
			if resp.StatusCode != 200 || res.Accepted != episodes {
				b.Fatalf("%d: accepted %d of %d (%d rejected: %+v)", resp.StatusCode, res.Accepted, episodes, res.RejectedCount, res.Rejected[:min(3, len(res.Rejected))])
			}
			report(b, took)
			b.Logf("%d episodes, %.0f MiB in %s", episodes, float64(size)/(1<<20), took.Round(time.Millisecond))
		}
	})
}
