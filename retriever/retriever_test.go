package retriever

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/mapping"
)

// build writes corpus lines to a file and builds an index from it.
func build(t testing.TB, lines []string, opts BuildOptions) string {
	t.Helper()
	dir := t.TempDir()
	corpus := filepath.Join(dir, "corpus.jsonl")
	if err := os.WriteFile(corpus, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "index")
	if _, err := BuildFile(context.Background(), out, corpus, opts); err != nil {
		t.Fatal(err)
	}
	return out
}

func open(t testing.TB, dir string) *Index {
	t.Helper()
	x, err := Open(dir, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return x
}

func ids(hits []Hit) []string {
	out := make([]string, len(hits))
	for i, h := range hits {
		out[i] = h.ID
	}
	return out
}

var small = []string{
	`{"id": "fox", "title": "The quick fox", "text": "A quick brown fox jumps over the lazy dog.", "lang": "en", "year": 2020}`,
	`{"id": "zebra", "title": "Zebras", "text": "Zebras are African equines with distinctive black-and-white striped coats.", "lang": "en", "tags": ["animal", "africa"]}`,
	`{"id": "http", "title": "net/http", "text": "Package http provides HTTP client and server implementations. Get, Head, Post and PostForm make HTTP requests.", "lang": "go"}`,
	`{"id": "gzip", "title": "compress/gzip", "text": "Package gzip implements reading and writing of gzip format compressed files, as specified in RFC 1952.", "lang": "go"}`,
	`{"id": "golang", "title": "The Go language", "text": "Go is an open source programming language that makes it simple to build secure, scalable systems.", "lang": "golang"}`,
}

func TestBuildRefusesABadCorpusNamingTheLine(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
		want  string
	}{
		{"a line that is not JSON", []string{small[0], `{"id": "b", "text": "x"`}, "corpus.jsonl line 2: bad corpus: not valid JSON"},
		{"a line without an id", []string{small[0], small[1], `{"title": "t", "text": "x"}`}, `line 3: bad corpus: no "id" field`},
		{"an id that is not a string", []string{`{"id": 7, "text": "x"}`}, `line 1: bad corpus: "id" must be a string, got a number`},
		{"an empty id", []string{`{"id": " ", "text": "x"}`}, `line 1: bad corpus: "id" is empty`},
		{"an id that would break the context markers", []string{`{"id": "a>>b", "text": "x"}`}, `contains "<<" or ">>"`},
		{"a duplicate id", []string{small[0], small[1], small[0]}, `line 3: bad corpus: duplicate id "fox" (first on line 1)`},
		{"a document with neither title nor text", []string{`{"id": "e", "lang": "x"}`}, `line 1: bad corpus: document "e" has neither title nor text`},
		{"a non-object line", []string{`["a"]`}, "line 1: bad corpus: want a JSON object, got an array"},
		{"a text that is not a string", []string{`{"id": "a", "text": 5}`}, `"text" must be a string`},
		{"no documents at all", []string{"", "# a comment"}, "bad corpus: no documents"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			corpus := filepath.Join(dir, "corpus.jsonl")
			os.WriteFile(corpus, []byte(strings.Join(tt.lines, "\n")+"\n"), 0o644)
			out := filepath.Join(dir, "index")
			_, err := BuildFile(context.Background(), out, corpus, BuildOptions{})
			if !errors.Is(err, ErrBadCorpus) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrBadCorpus containing %q", err, tt.want)
			}
			if _, serr := os.Stat(out); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("a failed build left %s behind (%v)", out, serr)
			}
		})
	}
}

func TestBuildRefusesAChunkIDThatIsAlreadADocumentID(t *testing.T) {
	dir := t.TempDir()
	_, err := Build(context.Background(), filepath.Join(dir, "ix"), strings.NewReader(
		`{"id": "a#1", "text": "first"}`+"\n"+`{"id": "a", "text": "second"}`+"\n"), BuildOptions{ChunkTokens: 50})
	if !errors.Is(err, ErrBadCorpus) || !strings.Contains(err.Error(), `line 2`) || !strings.Contains(err.Error(), `chunk id "a#1"`) {
		t.Fatalf("err = %v", err)
	}
}

func TestBuildRefusesADirectoryThatIsNotEmpty(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "keep"), []byte("x"), 0o644)
	_, err := Build(context.Background(), dir, strings.NewReader(small[0]), BuildOptions{})
	if !errors.Is(err, ErrExists) {
		t.Fatalf("err = %v, want ErrExists", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "keep")); err != nil {
		t.Fatal("a refused build removed what was there")
	}
}

func TestOpenRefusesWhatIsNotACompleteIndex(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "none"), OpenOptions{}); !errors.Is(err, ErrNotIndex) {
		t.Errorf("missing directory: %v", err)
	}
	if _, err := Open(t.TempDir(), OpenOptions{}); !errors.Is(err, ErrNotIndex) {
		t.Errorf("empty directory: %v", err)
	}
}

func TestChunkIDsAreStableAcrossBuilds(t *testing.T) {
	long := strings.Repeat("Alpha beta gamma delta epsilon. ", 40) + "\n\n" + strings.Repeat("Zeta eta theta iota kappa lambda. ", 30)
	lines := []string{
		fmt.Sprintf(`{"id": "long", "title": "Greek", "text": %q}`, long),
		`{"id": "short", "title": "Short", "text": "Just one chunk."}`,
	}
	var first []Doc
	for build1 := 0; build1 < 2; build1++ {
		x := open(t, build(t, lines, BuildOptions{ChunkTokens: 64}))
		if x.Info().Units <= 3 || x.Info().Docs != 2 {
			t.Fatalf("info = %+v", x.Info())
		}
		var docs []Doc
		for _, parent := range []string{"long", "short"} {
			chunks, err := x.Chunks(context.Background(), parent)
			if err != nil || len(chunks) == 0 {
				t.Fatalf("chunks(%s) = %v, %v", parent, chunks, err)
			}
			for i, id := range chunks {
				if id != ChunkID(parent, i+1) {
					t.Errorf("chunk %d of %s has id %s", i+1, parent, id)
				}
				d, err := x.Document(context.Background(), id)
				if err != nil {
					t.Fatal(err)
				}
				if d.Parent != parent || d.Chunk != i+1 || d.Chunks != len(chunks) || EstimateTokens(d.Text) > 64 {
					t.Errorf("chunk %s = parent %q %d/%d, %d tokens", id, d.Parent, d.Chunk, d.Chunks, EstimateTokens(d.Text))
				}
				docs = append(docs, d)
			}
		}
		if build1 == 0 {
			first = docs
		} else if !reflect.DeepEqual(first, docs) {
			t.Errorf("the second build's chunks differ from the first's")
		}
	}
	if _, err := open(t, build(t, lines, BuildOptions{ChunkTokens: 64})).Document(context.Background(), "long"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a chunked parent's own id: %v, want ErrNotFound", err)
	}
}

func TestSearchRanksWithBM25AndTheMatchingDocumentFirst(t *testing.T) {
	dir := build(t, small, BuildOptions{})
	x := open(t, dir)
	if x.Info().Scoring != "bm25" {
		t.Errorf("scoring = %q", x.Info().Scoring)
	}
	if m, ok := x.idx.Mapping().(*mapping.IndexMappingImpl); !ok || m.ScoringModel != "bm25" {
		t.Errorf("the index's mapping does not score with bm25")
	}
	mq := bleve.NewMatchQuery("gzip")
	mq.SetField(fieldText)
	req := bleve.NewSearchRequest(mq)
	req.Explain = true
	if res, err := x.idx.Search(req); err != nil || len(res.Hits) == 0 || !strings.Contains(res.Hits[0].Expl.String(), "as per bm25 model") {
		t.Errorf("the scores are not bm25 scores: %v", err)
	}
	tests := []struct{ query, first string }{
		{"gzip compressed files", "gzip"},
		{"HTTP client", "http"},
		{"striped equine", "zebra"}, // stemming: striped/stripe, equine/equines
		{"lazy dog", "fox"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			res, err := x.Search(context.Background(), Query{Text: tt.query, K: 3})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Hits) == 0 || res.Hits[0].ID != tt.first {
				t.Fatalf("hits = %v, want %s first", ids(res.Hits), tt.first)
			}
			if res.Hits[0].Title == "" || res.Hits[0].Snippet == "" || res.Hits[0].Parent != tt.first {
				t.Errorf("hit = %+v", res.Hits[0])
			}
		})
	}
}

func TestSnippetsShowTheMatchingPassage(t *testing.T) {
	text := strings.Repeat("filler words here. ", 50) + "The needle is in this sentence. " + strings.Repeat("more filler. ", 50)
	x := open(t, build(t, []string{fmt.Sprintf(`{"id": "hay", "title": "Haystack", "text": %q}`, text)}, BuildOptions{}))
	res, err := x.Search(context.Background(), Query{Text: "needles"})
	if err != nil || len(res.Hits) != 1 {
		t.Fatal(res, err)
	}
	if s := res.Hits[0].Snippet; !strings.Contains(s, "needle is in this sentence") || len(s) > SnippetBytes+8 || !strings.HasPrefix(s, "…") {
		t.Errorf("snippet = %q", s)
	}
}

func TestTitleMatchesAreBoostedOverTextMatches(t *testing.T) {
	lines := []string{
		`{"id": "in-title", "title": "Quasar", "text": "An astronomical object of very high luminosity found in galaxies."}`,
		`{"id": "in-text", "title": "Galaxy notes", "text": "A quasar is an astronomical object of very high luminosity."}`,
	}
	res, err := open(t, build(t, lines, BuildOptions{})).Search(context.Background(), Query{Text: "quasar"})
	if err != nil || len(res.Hits) != 2 || res.Hits[0].ID != "in-title" {
		t.Fatalf("boosted: %v, %v", ids(res.Hits), err)
	}
	// The same corpus with the title weighed far below the text ranks the
	// other way: the boost is what put the title match first.
	res, err = open(t, build(t, lines, BuildOptions{TitleBoost: 0.01})).Search(context.Background(), Query{Text: "quasar"})
	if err != nil || len(res.Hits) != 2 || res.Hits[0].ID != "in-text" {
		t.Fatalf("unboosted: %v, %v", ids(res.Hits), err)
	}
}

func TestFiltersKeepExactMetadataMatches(t *testing.T) {
	x := open(t, build(t, small, BuildOptions{}))
	if got := x.Info().MetadataFields; !reflect.DeepEqual(got, []string{"lang", "tags", "year"}) {
		t.Errorf("metadata fields = %v", got)
	}
	tests := []struct {
		name    string
		query   string
		filters map[string]string
		want    []string
	}{
		{"a string value, exactly (go is not golang)", "package language", map[string]string{"lang": "go"}, []string{"gzip", "http"}},
		{"one value of an array", "zebras fox", map[string]string{"tags": "africa"}, []string{"zebra"}},
		{"a number as written", "quick fox zebras", map[string]string{"year": "2020"}, []string{"fox"}},
		{"two filters together", "package", map[string]string{"lang": "go", "year": "2020"}, []string{}},
		{"an unknown field matches nothing", "fox", map[string]string{"color": "red"}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := x.Search(context.Background(), Query{Text: tt.query, Filters: tt.filters})
			if err != nil {
				t.Fatal(err)
			}
			got := ids(res.Hits)
			sortStrings(got)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("hits = %v, want %v", got, tt.want)
			}
		})
	}
	d, err := x.Document(context.Background(), "zebra")
	if err != nil || !reflect.DeepEqual(d.Metadata["tags"], []any{"animal", "africa"}) || d.Metadata["lang"] != "en" {
		t.Errorf("document metadata = %#v, %v", d.Metadata, err)
	}
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func TestBadQueriesAndIDsAreErrorsOfTheirKind(t *testing.T) {
	x := open(t, build(t, small, BuildOptions{}))
	ctx := context.Background()
	for _, q := range []Query{{Text: ""}, {Text: "  \n"}, {Text: "fox", K: -1}, {Text: "fox", K: MaxK + 1}, {Text: "fox", Filters: map[string]string{"": "x"}}} {
		if _, err := x.Search(ctx, q); !errors.Is(err, ErrInvalidQuery) {
			t.Errorf("search %+v: %v, want ErrInvalidQuery", q, err)
		}
	}
	if _, err := x.Document(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	x.Close()
	x.Close()
	if _, err := x.Search(ctx, Query{Text: "fox"}); !errors.Is(err, ErrClosed) {
		t.Errorf("search after close: %v", err)
	}
	if _, err := x.Document(ctx, "fox"); !errors.Is(err, ErrClosed) {
		t.Errorf("document after close: %v", err)
	}
}

func TestManyGoroutinesQueryOneSharedIndex(t *testing.T) {
	x := open(t, build(t, small, BuildOptions{}))
	queries := []string{"gzip compressed files", "HTTP client", "striped equine", "lazy dog", "programming language"}
	want := map[string][]string{}
	for _, q := range queries {
		res, err := x.Search(context.Background(), Query{Text: q, K: 3})
		if err != nil {
			t.Fatal(err)
		}
		want[q] = ids(res.Hits)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				q := queries[(g+i)%len(queries)]
				res, err := x.Search(context.Background(), Query{Text: q, K: 3})
				if err != nil {
					errs <- err
					return
				}
				if got := ids(res.Hits); !reflect.DeepEqual(got, want[q]) {
					errs <- fmt.Errorf("goroutine %d query %q: %v, want %v", g, q, got, want[q])
					return
				}
				if _, err := x.Document(context.Background(), want[q][0]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestManyReadOnlyOpensShareTheStore(t *testing.T) {
	dir := build(t, small, BuildOptions{})
	a, b := open(t, dir), open(t, dir)
	for _, x := range []*Index{a, b} {
		if res, err := x.Search(context.Background(), Query{Text: "fox"}); err != nil || len(res.Hits) == 0 {
			t.Fatal(res, err)
		}
	}
}

func TestAWriterHoldingTheStoreGivesReadersAClearErrorWithinTheTimeout(t *testing.T) {
	dir := build(t, small, BuildOptions{})
	w, err := bleve.Open(dir) // a writer, as another tool appending to the index would be
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	start := time.Now()
	_, err = Open(dir, OpenOptions{LockTimeout: 200 * time.Millisecond})
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("open waited %v", el)
	}
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "a writer holds its store") {
		t.Fatalf("err = %v, want ErrLocked", err)
	}
}

func TestAReaderHoldingTheStoreGivesASecondWriterAClearErrorWithinTheTimeout(t *testing.T) {
	dir := build(t, small, BuildOptions{})
	open(t, dir)
	start := time.Now()
	_, err := bleve.OpenUsing(dir, map[string]any{"bolt_timeout": "200ms"})
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("a writer opened a store readers hold: %v after %v", err, time.Since(start))
	}
}

func TestASecondBuildIntoTheSameDirectoryFailsAtOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ix")
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := Build(context.Background(), dir, pr, BuildOptions{})
		done <- err
	}()
	// The first build is under way once its first document is read.
	if _, err := io.WriteString(pw, small[0]+"\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "index_meta.json")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first build never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	_, err := Build(context.Background(), dir, strings.NewReader(small[1]), BuildOptions{})
	if !errors.Is(err, ErrExists) || time.Since(start) > time.Second {
		t.Errorf("second build: %v after %v, want ErrExists at once", err, time.Since(start))
	}
	if _, err := Open(dir, OpenOptions{LockTimeout: 100 * time.Millisecond}); !errors.Is(err, ErrNotIndex) || !strings.Contains(err.Error(), "did not finish") {
		t.Errorf("open during the build: %v, want ErrNotIndex (did not finish)", err)
	}
	io.WriteString(pw, small[1]+"\n")
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if x := open(t, dir); x.Info().Docs != 2 {
		t.Errorf("docs = %d", x.Info().Docs)
	}
}

func TestBuildStopsWhenTheContextIsCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := filepath.Join(t.TempDir(), "ix")
	if _, err := Build(ctx, dir, strings.NewReader(small[0]), BuildOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a cancelled build left %s", dir)
	}
}

func TestBuildReportsProgress(t *testing.T) {
	var lines []string
	for i := range 25 {
		lines = append(lines, fmt.Sprintf(`{"id": "d%d", "text": "document number %d"}`, i, i))
	}
	var got []BuildProgress
	dir := t.TempDir()
	_, err := Build(context.Background(), filepath.Join(dir, "ix"), strings.NewReader(strings.Join(lines, "\n")), BuildOptions{
		BatchSize: 10, Progress: func(p BuildProgress) { got = append(got, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 3 || !got[len(got)-1].Done || got[len(got)-1].Docs != 25 || got[0].Docs != 10 {
		t.Errorf("progress = %+v", got)
	}
}
