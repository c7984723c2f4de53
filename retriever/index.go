package retriever

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/analysis"
	"github.com/blevesearch/bleve/v2/search/query"
	index "github.com/blevesearch/bleve_index_api"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Query bounds.
const (
	DefaultK = 10
	MaxK     = 100
	// SnippetBytes is the length of a search hit's snippet.
	SnippetBytes = 240
	// DefaultLockTimeout bounds how long Open waits for a writer's lock.
	DefaultLockTimeout = 5 * time.Second
)

// OpenOptions tune Open.
type OpenOptions struct {
	// LockTimeout bounds the wait for the store's lock when a writer holds
	// it; default DefaultLockTimeout.
	LockTimeout time.Duration
}

// Index is an open, read-only index. It is safe for concurrent use: open
// it once and share it across every episode.
type Index struct {
	dir      string
	info     Info
	idx      bleve.Index
	analyzer analysis.Analyzer

	closeOnce sync.Once
	closeErr  error
}

// Open opens the index built in dir, read-only.
//
// # Errors
//
// ErrNotIndex when dir holds no complete index; ErrLocked when a writer
// holds the store's lock for longer than the lock timeout.
func Open(dir string, opts OpenOptions) (*Index, error) {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	info, err := readRecord(dir)
	if err != nil {
		return nil, err
	}
	idx, err := bleve.OpenUsing(dir, map[string]any{
		"read_only":    true,
		"bolt_timeout": opts.LockTimeout.String(),
	})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("retriever: open %s: %w: a writer holds its store and did not release it within %v", dir, ErrLocked, opts.LockTimeout)
		}
		return nil, fmt.Errorf("retriever: open %s: %w", dir, err)
	}
	an := idx.Mapping().AnalyzerNamed(analyzerText)
	if an == nil {
		idx.Close()
		return nil, fmt.Errorf("retriever: open %s: %w: analyzer %q missing", dir, ErrNotIndex, analyzerText)
	}
	return &Index{dir: dir, info: info, idx: idx, analyzer: an}, nil
}

// Info returns the index's build record.
func (x *Index) Info() Info { return x.info }

// Dir returns the directory the index was opened from.
func (x *Index) Dir() string { return x.dir }

// Close releases the index. It is idempotent and safe to call
// concurrently; searches after Close fail with ErrClosed.
func (x *Index) Close() error {
	x.closeOnce.Do(func() { x.closeErr = x.idx.Close() })
	return x.closeErr
}

// Query is one search.
type Query struct {
	Text string
	// K is the number of hits wanted, 1..MaxK; 0 means DefaultK.
	K int
	// Filters keep only documents whose metadata field equals the value
	// exactly (for an array field: one of its values equals it).
	Filters map[string]string
}

// Results is a search's answer.
type Results struct {
	// Total counts the matching documents; Hits holds the best K.
	Total uint64
	Hits  []Hit
}

// Hit is one ranked result.
type Hit struct {
	ID     string
	Parent string
	// Chunk and Chunks place a chunk in its parent (0 when not chunked).
	Chunk, Chunks int
	Title         string
	Snippet       string
	Score         float64
}

// Search ranks the documents matching q.Text with BM25 over the title
// (boosted) and the text.
//
// # Errors
//
// ErrInvalidQuery for an empty query, K outside 0..MaxK or an empty filter
// name; ErrClosed after Close; the context's error when it ends first.
func (x *Index) Search(ctx context.Context, q Query) (Results, error) {
	return x.search(ctx, q, true)
}

// search is Search; without details it returns ids and scores only (the
// benchmarks' baseline: ranking without stored fields and snippets).
func (x *Index) search(ctx context.Context, q Query, details bool) (Results, error) {
	text := strings.TrimSpace(q.Text)
	if text == "" {
		return Results{}, fmt.Errorf("%w: the query is empty", ErrInvalidQuery)
	}
	k := q.K
	if k == 0 {
		k = DefaultK
	}
	if k < 1 || k > MaxK {
		return Results{}, fmt.Errorf("%w: k %d is outside 1..%d", ErrInvalidQuery, q.K, MaxK)
	}
	title := bleve.NewMatchQuery(text)
	title.SetField(fieldTitle)
	title.SetBoost(x.info.TitleBoost)
	body := bleve.NewMatchQuery(text)
	body.SetField(fieldText)
	var qq query.Query = bleve.NewDisjunctionQuery(title, body)
	if len(q.Filters) > 0 {
		names := make([]string, 0, len(q.Filters))
		for n := range q.Filters {
			if strings.TrimSpace(n) == "" {
				return Results{}, fmt.Errorf("%w: a filter has an empty field name", ErrInvalidQuery)
			}
			names = append(names, n)
		}
		sort.Strings(names)
		var terms []query.Query
		for _, n := range names {
			tq := bleve.NewTermQuery(q.Filters[n])
			tq.SetField(fieldMeta + "." + n)
			terms = append(terms, tq)
		}
		bq := bleve.NewBooleanQuery()
		bq.AddMust(qq)
		bq.AddFilter(bleve.NewConjunctionQuery(terms...))
		qq = bq
	}
	req := bleve.NewSearchRequestOptions(qq, k, 0, false)
	if details {
		req.Fields = []string{fieldTitle, fieldText, fieldParent, fieldChunk, fieldChunks}
	}
	res, err := x.idx.SearchInContext(ctx, req)
	if err != nil {
		return Results{}, x.wrap(err)
	}
	var terms map[string]bool
	if details {
		terms = x.terms(text)
	}
	out := Results{Total: res.Total, Hits: make([]Hit, 0, len(res.Hits))}
	for _, h := range res.Hits {
		hit := Hit{ID: h.ID, Score: h.Score, Title: str(h.Fields[fieldTitle]), Parent: str(h.Fields[fieldParent])}
		hit.Chunk, _ = strconv.Atoi(str(h.Fields[fieldChunk]))
		hit.Chunks, _ = strconv.Atoi(str(h.Fields[fieldChunks]))
		if hit.Parent == "" {
			hit.Parent = h.ID
		}
		if details {
			hit.Snippet = x.snippet(str(h.Fields[fieldText]), terms)
		}
		out.Hits = append(out.Hits, hit)
	}
	return out, nil
}

// Document returns the document or chunk with the id.
//
// # Errors
//
// ErrNotFound when no document has the id; ErrClosed after Close.
func (x *Index) Document(ctx context.Context, id string) (Doc, error) {
	if err := ctx.Err(); err != nil {
		return Doc{}, err
	}
	d, err := x.idx.Document(id)
	if err != nil {
		return Doc{}, x.wrap(err)
	}
	if d == nil {
		return Doc{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	out := Doc{ID: id}
	var metaJSON []byte
	d.VisitFields(func(f index.Field) {
		switch f.Name() {
		case fieldTitle:
			out.Title = string(f.Value())
		case fieldText:
			out.Text = string(f.Value())
		case fieldParent:
			out.Parent = string(f.Value())
		case fieldChunk:
			out.Chunk, _ = strconv.Atoi(string(f.Value()))
		case fieldChunks:
			out.Chunks, _ = strconv.Atoi(string(f.Value()))
		case fieldMetaJSON:
			metaJSON = append([]byte(nil), f.Value()...)
		}
	})
	if out.Parent == "" {
		out.Parent = id
	}
	if len(metaJSON) > 0 {
		_ = json.Unmarshal(metaJSON, &out.Metadata)
	}
	return out, nil
}

// Chunks lists the ids of the chunks cut from the corpus document parent,
// in order (nil when there are none, or the index is not chunked).
func (x *Index) Chunks(ctx context.Context, parent string) ([]string, error) {
	if x.info.ChunkTokens == 0 {
		return nil, nil
	}
	tq := bleve.NewTermQuery(parent)
	tq.SetField(fieldParent)
	req := bleve.NewSearchRequestOptions(tq, 10000, 0, false)
	req.Fields = []string{fieldChunk}
	res, err := x.idx.SearchInContext(ctx, req)
	if err != nil {
		return nil, x.wrap(err)
	}
	type c struct {
		id string
		n  int
	}
	var cs []c
	for _, h := range res.Hits {
		n, _ := strconv.Atoi(str(h.Fields[fieldChunk]))
		cs = append(cs, c{h.ID, n})
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].n < cs[j].n })
	out := make([]string, len(cs))
	for i, x := range cs {
		out[i] = x.id
	}
	return out, nil
}

func (x *Index) wrap(err error) error {
	switch {
	case errors.Is(err, bleve.ErrorIndexClosed):
		return fmt.Errorf("retriever: %s: %w", x.dir, ErrClosed)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("retriever: %s: %w", x.dir, err)
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// terms analyses the query as the index analyses text.
func (x *Index) terms(q string) map[string]bool {
	out := map[string]bool{}
	for _, t := range x.analyzer.Analyze([]byte(q)) {
		out[string(t.Term)] = true
	}
	return out
}

// snippetScanBytes bounds how much of a long text a snippet looks at.
const snippetScanBytes = 64 << 10

// snippet picks the SnippetBytes window of text holding the most distinct
// query terms (the text's start when none matches), on word boundaries,
// with whitespace folded.
func (x *Index) snippet(text string, terms map[string]bool) string {
	scan := text
	if len(scan) > snippetScanBytes {
		scan = scan[:snippetScanBytes]
	}
	type match struct {
		start int
		term  string
	}
	var ms []match
	if len(terms) > 0 {
		// Analysing the whole text costs more than the search itself: scan
		// its words, and analyse only those that start like a query term
		// (a stemmer rewrites a word's end, never its start).
		prefixes := make([]string, 0, len(terms))
		for t := range terms {
			prefixes = append(prefixes, t[:max(1, min(len(t), len(t)-1))])
		}
		var lower []byte
		forWords(scan, func(start, end int) {
			lower = appendLower(lower[:0], scan[start:end])
			for _, p := range prefixes {
				if len(lower) >= len(p) && string(lower[:len(p)]) == p {
					for _, tok := range x.analyzer.Analyze([]byte(scan[start:end])) {
						if terms[string(tok.Term)] {
							ms = append(ms, match{start, string(tok.Term)})
						}
					}
					return
				}
			}
		})
	}
	from := 0
	best := 0
	for i := range ms {
		seen := map[string]bool{}
		for j := i; j < len(ms) && ms[j].start-ms[i].start < SnippetBytes*2/3; j++ {
			seen[ms[j].term] = true
		}
		if len(seen) > best {
			best, from = len(seen), ms[i].start
		}
	}
	// Start a little before the best match, keep the window full at the
	// text's end, and cut on word boundaries.
	from = max(0, from-SnippetBytes/6)
	if from+SnippetBytes > len(text) {
		from = max(0, len(text)-SnippetBytes)
	}
	if from > 0 {
		if i := strings.IndexAny(text[from:], " \n\t"); i >= 0 && i < SnippetBytes/3 {
			from += i + 1
		}
		for from < len(text) && !utf8.RuneStart(text[from]) {
			from++
		}
	}
	to := min(len(text), from+SnippetBytes)
	if to < len(text) {
		if i := strings.LastIndexAny(text[from:to], " \n\t"); i > SnippetBytes/2 {
			to = from + i
		}
		for to > from && !utf8.RuneStart(text[to]) {
			to--
		}
	}
	s := strings.Join(strings.Fields(text[from:to]), " ")
	if from > 0 {
		s = "…" + s
	}
	if to < len(text) {
		s += "…"
	}
	return s
}

// forWords calls fn with the byte span of each run of letters and digits.
func forWords(s string, fn func(start, end int)) {
	start := -1
	for i, r := range s {
		word := unicode.IsLetter(r) || unicode.IsDigit(r)
		switch {
		case word && start < 0:
			start = i
		case !word && start >= 0:
			fn(start, i)
			start = -1
		}
	}
	if start >= 0 {
		fn(start, len(s))
	}
}

func appendLower(dst []byte, s string) []byte {
	for _, r := range s {
		dst = utf8.AppendRune(dst, unicode.ToLower(r))
	}
	return dst
}
