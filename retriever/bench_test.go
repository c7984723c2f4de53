package retriever

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blevesearch/bleve/v2"
)

// A synthetic corpus: words of a fixed vocabulary drawn with a Zipf law,
// as in natural text, so that BM25 sees common and rare terms.
type synth struct {
	vocab []string
	rng   *rand.Rand
	zipf  *rand.Zipf
}

func newSynth(seed uint64) *synth {
	vrng := rand.New(rand.NewPCG(0, 0)) // one vocabulary for every corpus and query set
	rng := rand.New(rand.NewPCG(seed, 1))
	s := &synth{rng: rng}
	letters := "abcdefghijklmnopqrstuvwxyz"
	seen := map[string]bool{}
	for len(s.vocab) < 20000 {
		n := 3 + vrng.IntN(8)
		b := make([]byte, n)
		for i := range b {
			b[i] = letters[vrng.IntN(len(letters))]
		}
		if w := string(b); !seen[w] {
			seen[w] = true
			s.vocab = append(s.vocab, w)
		}
	}
	s.zipf = rand.NewZipf(rng, 1.1, 2, uint64(len(s.vocab)-1))
	return s
}

func (s *synth) words(n int) string {
	ws := make([]string, n)
	for i := range ws {
		ws[i] = s.vocab[s.zipf.Uint64()]
	}
	return strings.Join(ws, " ")
}

// corpus writes n documents of about 150 words (~1 KB) and returns the file.
func (s *synth) corpus(tb testing.TB, dir string, n int) string {
	tb.Helper()
	f, err := os.Create(filepath.Join(dir, "corpus.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for i := range n {
		enc.Encode(map[string]any{"id": "doc-" + strconv.Itoa(i), "title": s.words(3 + s.rng.IntN(4)),
			"text": s.words(100 + s.rng.IntN(100)), "cat": "c" + strconv.Itoa(i%20)})
	}
	return f.Name()
}

// queries are 2-3 words drawn like the text but for the 50 commonest (the
// stop words of this language, which a searcher rarely types).
func (s *synth) queries(n int) []string {
	out := make([]string, n)
	for i := range out {
		ws := make([]string, 2+s.rng.IntN(2))
		for j := range ws {
			r := s.zipf.Uint64()
			for r < 50 {
				r = s.zipf.Uint64()
			}
			ws[j] = s.vocab[r]
		}
		out[i] = strings.Join(ws, " ")
	}
	return out
}

const benchDocs = 20000

var shared struct {
	once sync.Once
	dir  string
	err  error
}

// sharedIndex builds the query benchmarks' index once per process.
func sharedIndex(b *testing.B) string {
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "rollbox-retriever-bench")
		if shared.err != nil {
			return
		}
		corpus := newSynth(1).corpus(b, shared.dir, benchDocs)
		_, shared.err = BuildFile(context.Background(), filepath.Join(shared.dir, "index"), corpus, BuildOptions{})
	})
	if shared.err != nil {
		b.Fatal(shared.err)
	}
	return filepath.Join(shared.dir, "index")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// BenchmarkBuild measures index build throughput over a 5,000-document
// (~5 MB) corpus: this package's Build (bleve's offline builder, one merged
// segment) beside the baseline of a plain bleve index fed batches of 1,000.
func BenchmarkBuild(b *testing.B) {
	const n = 5000
	dir := b.TempDir()
	corpus := newSynth(2).corpus(b, dir, n)
	st, _ := os.Stat(corpus)
	b.Run("retriever.Build", func(b *testing.B) {
		for i := range b.N {
			out := filepath.Join(dir, "ix-"+strconv.Itoa(i))
			if _, err := BuildFile(context.Background(), out, corpus, BuildOptions{}); err != nil {
				b.Fatal(err)
			}
			os.RemoveAll(out)
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "docs/s")
		b.ReportMetric(float64(st.Size())*float64(b.N)/1e6/b.Elapsed().Seconds(), "MB/s")
	})
	b.Run("baseline=bleve.Batch", func(b *testing.B) {
		data, _ := os.ReadFile(corpus)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		for i := range b.N {
			out := filepath.Join(dir, "batch-"+strconv.Itoa(i))
			ix, err := bleve.New(out, newMapping())
			if err != nil {
				b.Fatal(err)
			}
			batch := ix.NewBatch()
			for _, l := range lines {
				d, err := ParseDoc([]byte(l))
				if err != nil {
					b.Fatal(err)
				}
				batch.Index(d.ID, fields(d))
				if batch.Size() >= DefaultBatchSize {
					if err := ix.Batch(batch); err != nil {
						b.Fatal(err)
					}
					batch.Reset()
				}
			}
			if err := ix.Batch(batch); err != nil {
				b.Fatal(err)
			}
			ix.Close()
			os.RemoveAll(out)
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "docs/s")
		b.ReportMetric(float64(st.Size())*float64(b.N)/1e6/b.Elapsed().Seconds(), "MB/s")
	})
}

// BenchmarkQuery measures search latency (BM25, k=10, snippets) with 1, 100
// and 1,000 concurrent episodes sharing one index of 20,000 documents.
//
// In "closed" runs each episode is a goroutine issuing queries back to
// back: the index saturates, queries/s is its throughput, and latency is
// mostly queueing for the 2 CPUs (Little's law: mean ≈ episodes ÷
// throughput; the Go scheduler lets most queries through at once and makes
// a few wait a whole round of time slices, hence a low p50 and a high
// p99). In "paced" runs each episode thinks between queries, as an agent
// waiting for its model does, for episodes × 1 ms on average: 1,000
// queries/s in all whatever the number of episodes. The baseline is the
// same ranking without loading stored fields or making snippets.
func BenchmarkQuery(b *testing.B) {
	dir := sharedIndex(b)
	x, err := Open(dir, OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close()
	qs := newSynth(3).queries(4096)
	for _, mode := range []string{"retriever.Search", "baseline=bleve", "retriever.Search/paced"} {
		for _, episodes := range []int{1, 100, 1000} {
			b.Run(fmt.Sprintf("%s/episodes=%d", mode, episodes), func(b *testing.B) {
				think := time.Duration(0)
				if strings.HasSuffix(mode, "/paced") {
					think = time.Duration(episodes) * time.Millisecond
				}
				var hits atomic.Int64
				search := func(q string) error {
					res, err := x.search(context.Background(), Query{Text: q, K: 10}, mode != "baseline=bleve")
					hits.Add(int64(len(res.Hits)))
					return err
				}
				lat := runEpisodes(b, episodes, think, qs, search)
				b.ReportMetric(float64(hits.Load())/float64(b.N), "hits/query")
				report(b, lat)
			})
		}
	}
}

// runEpisodes runs b.N queries spread over n goroutines, each sleeping
// think on average (uniformly 0.5-1.5×) before every query, and returns
// each query's latency.
func runEpisodes(b *testing.B, n int, think time.Duration, qs []string, search func(string) error) []time.Duration {
	var next atomic.Int64
	lats := make([][]time.Duration, n)
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for {
				if think > 0 {
					time.Sleep(think/2 + time.Duration(rng.Int64N(int64(think))))
				}
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				if err := search(qs[int(i)%len(qs)]); err != nil {
					failed.Store(err)
					return
				}
				lats[g] = append(lats[g], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	return all
}

func report(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "queries/s")
}

// BenchmarkMemory compares 100 episodes sharing one open index with 100
// episodes each opening its own (the baseline), after each has run one
// query: Go heap in use and process RSS (anonymous and file-backed) added,
// in MB. Run each
// sub-benchmark in its own process (-bench 'Memory/shared' and
// -bench 'Memory/per-episode') for clean RSS numbers.
func BenchmarkMemory(b *testing.B) {
	const episodes = 100
	dir := sharedIndex(b)
	qs := newSynth(4).queries(episodes)
	measure := func(b *testing.B, open func() []*Index) {
		for range b.N {
			heap0, anon0, file0 := memNow()
			ixs := open()
			ledgers := make([]*Ledger, episodes)
			for i := range episodes {
				ledgers[i] = NewLedger(16384)
				if _, err := ixs[i%len(ixs)].Search(context.Background(), Query{Text: qs[i]}); err != nil {
					b.Fatal(err)
				}
			}
			heap1, anon1, file1 := memNow()
			b.ReportMetric((heap1-heap0)/1e6, "heap-MB")
			b.ReportMetric((anon1-anon0)/1e6, "rss-anon-MB")
			b.ReportMetric((file1-file0)/1e6, "rss-file-MB")
			b.ReportMetric(float64(len(ixs)), "opens")
			runtime.KeepAlive(ledgers)
			for _, x := range ixs {
				x.Close()
			}
		}
	}
	b.Run("shared", func(b *testing.B) {
		measure(b, func() []*Index {
			x, err := Open(dir, OpenOptions{})
			if err != nil {
				b.Fatal(err)
			}
			return []*Index{x}
		})
	})
	b.Run("baseline=per-episode", func(b *testing.B) {
		measure(b, func() []*Index {
			out := make([]*Index, episodes)
			for i := range out {
				x, err := Open(dir, OpenOptions{})
				if err != nil {
					b.Fatal(err)
				}
				out[i] = x
			}
			return out
		})
	})
}

// memNow returns the Go heap in use and the process's anonymous and
// file-backed resident memory (RssAnon, RssFile), in bytes. File-backed
// pages of the index are the kernel's page cache: mapping the same file
// twice counts them twice here but costs the machine nothing more.
func memNow() (heap, anon, file float64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap = float64(ms.HeapInuse)
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "RssAnon:":
			anon = kb * 1024
		case "RssFile:":
			file = kb * 1024
		}
	}
	return heap, anon, file
}
