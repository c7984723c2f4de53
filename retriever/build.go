package retriever

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/mapping"
	index "github.com/blevesearch/bleve_index_api"
)

// Build defaults and bounds.
const (
	DefaultBatchSize  = 1000
	DefaultTitleBoost = 2.0
	// MaxLineBytes bounds one corpus line.
	MaxLineBytes = 64 << 20
	// recordFile is written last by a build; Open requires it.
	recordFile = "rollbox-index.json"
	// FormatVersion is the index layout this package writes and reads.
	FormatVersion = 1
)

// Info is an index's build record (rollbox-index.json in its directory).
type Info struct {
	Format int `json:"format"`
	// Docs counts corpus documents; Units counts what was indexed (chunks
	// when ChunkTokens > 0, else Docs).
	Docs        int     `json:"docs"`
	Units       int     `json:"units"`
	ChunkTokens int     `json:"chunk_tokens,omitempty"`
	Scoring     string  `json:"scoring"`
	TitleBoost  float64 `json:"title_boost"`
	// MetadataFields are the metadata names a filter may use.
	MetadataFields []string  `json:"metadata_fields,omitempty"`
	CorpusBytes    int64     `json:"corpus_bytes"`
	CorpusSHA256   string    `json:"corpus_sha256"`
	BuiltAt        time.Time `json:"built_at"`
	BuildSeconds   float64   `json:"build_seconds"`
}

// BuildOptions tune Build.
type BuildOptions struct {
	// ChunkTokens > 0 splits each document into chunks of about that many
	// tokens, with ids "<doc-id>#<n>" (n from 1).
	ChunkTokens int
	// BatchSize is the number of documents indexed per batch (one segment
	// each before the final merge); default DefaultBatchSize.
	BatchSize int
	// TitleBoost weighs title matches over text matches; default
	// DefaultTitleBoost.
	TitleBoost float64
	// Name names the corpus in error messages ("corpus.jsonl line 3: ...").
	Name string
	// TotalBytes is the corpus size, for progress (0 if unknown).
	TotalBytes int64
	// Progress, if set, is called after every batch and once at the end.
	Progress func(BuildProgress)
}

// BuildProgress is a build's progress so far.
type BuildProgress struct {
	Lines, Docs, Units int
	Bytes, TotalBytes  int64
	Elapsed            time.Duration
	// Merging is set while the batches are merged into the final segment.
	Merging bool
	Done    bool
}

// BuildFile builds an index in dir from the JSONL corpus file.
func BuildFile(ctx context.Context, dir, corpus string, opts BuildOptions) (Info, error) {
	f, err := os.Open(corpus)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	if opts.Name == "" {
		opts.Name = corpus
	}
	if st, err := f.Stat(); err == nil && opts.TotalBytes == 0 {
		opts.TotalBytes = st.Size()
	}
	return Build(ctx, dir, f, opts)
}

// Build reads a JSONL corpus (one document a line; blank lines and lines
// starting with '#' are skipped) and writes a new index in dir.
//
// # Errors
//
// dir must not exist or be empty (ErrExists otherwise). A line that is not
// a document, or whose id (or a chunk's id) was used before, stops the
// build with ErrBadCorpus naming the line. On any error, what the build
// wrote in dir is removed.
func Build(ctx context.Context, dir string, corpus io.Reader, opts BuildOptions) (info Info, err error) {
	start := time.Now()
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.TitleBoost <= 0 {
		opts.TitleBoost = DefaultTitleBoost
	}
	if opts.ChunkTokens < 0 {
		return Info{}, fmt.Errorf("retriever: chunk tokens %d is negative", opts.ChunkTokens)
	}
	name := opts.Name
	if name == "" {
		name = "corpus"
	}
	if err := checkEmptyDir(dir); err != nil {
		return Info{}, err
	}
	b, err := bleve.NewBuilder(dir, newMapping(), map[string]any{
		"batchSize":       opts.BatchSize,
		"buildPathPrefix": dir, // temporary segments beside the final one: same filesystem
	})
	if err != nil {
		if errors.Is(err, bleve.ErrorIndexPathExists) {
			return Info{}, fmt.Errorf("retriever: build %s: %w (another build is writing there?)", dir, ErrExists)
		}
		return Info{}, fmt.Errorf("retriever: build %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			// The builder has no abort; its temporary segments are under dir.
			os.RemoveAll(dir)
		}
	}()

	h := sha256.New()
	r := bufio.NewReaderSize(io.TeeReader(corpus, h), 1<<20)
	type origin struct {
		line   int
		parent string
	}
	ids := map[string]origin{}
	metaSeen := map[string]bool{}
	var p BuildProgress
	p.TotalBytes = opts.TotalBytes
	report := func() {
		if opts.Progress != nil {
			p.Elapsed = time.Since(start)
			opts.Progress(p)
		}
	}
	inBatch := 0
	for {
		if err := ctx.Err(); err != nil {
			return Info{}, err
		}
		line, rerr := readLine(r)
		if rerr != nil && rerr != io.EOF {
			return Info{}, fmt.Errorf("retriever: %s line %d: %w", name, p.Lines+1, rerr)
		}
		if len(line) == 0 && rerr == io.EOF {
			break
		}
		p.Lines++
		p.Bytes += int64(len(line))
		trimmed := strings.TrimSpace(string(line))
		if trimmed == "" || trimmed[0] == '#' {
			if rerr == io.EOF {
				break
			}
			continue
		}
		d, perr := ParseDoc([]byte(trimmed))
		if perr != nil {
			return Info{}, fmt.Errorf("retriever: %s line %d: %w: %v", name, p.Lines, ErrBadCorpus, perr)
		}
		if prev, dup := ids[d.ID]; dup {
			if prev.parent != d.ID {
				return Info{}, fmt.Errorf("retriever: %s line %d: %w: id %q is already the id of a chunk of %q (line %d)", name, p.Lines, ErrBadCorpus, d.ID, prev.parent, prev.line)
			}
			return Info{}, fmt.Errorf("retriever: %s line %d: %w: duplicate id %q (first on line %d)", name, p.Lines, ErrBadCorpus, d.ID, prev.line)
		}
		ids[d.ID] = origin{p.Lines, d.ID}
		for k := range d.Metadata {
			metaSeen[k] = true
		}
		p.Docs++
		units := Chunk(d, opts.ChunkTokens)
		for _, u := range units {
			if opts.ChunkTokens > 0 {
				if prev, dup := ids[u.ID]; dup {
					return Info{}, fmt.Errorf("retriever: %s line %d: %w: chunk id %q of %q is already the id of the document on line %d", name, p.Lines, ErrBadCorpus, u.ID, d.ID, prev.line)
				}
				ids[u.ID] = origin{p.Lines, d.ID}
			}
			if err := b.Index(u.ID, fields(u)); err != nil {
				return Info{}, fmt.Errorf("retriever: %s line %d: index %q: %w", name, p.Lines, u.ID, err)
			}
			p.Units++
			inBatch++
		}
		if inBatch >= opts.BatchSize {
			inBatch = 0
			report()
		}
		if rerr == io.EOF {
			break
		}
	}
	if p.Docs == 0 {
		return Info{}, fmt.Errorf("retriever: %s: %w: no documents", name, ErrBadCorpus)
	}
	p.Merging = true
	report()
	if err := b.Close(); err != nil {
		return Info{}, fmt.Errorf("retriever: build %s: %w", dir, err)
	}
	info = Info{
		Format: FormatVersion, Docs: p.Docs, Units: p.Units, ChunkTokens: opts.ChunkTokens,
		Scoring: index.BM25Scoring, TitleBoost: opts.TitleBoost, MetadataFields: metadataFields(metaSeen),
		CorpusBytes: p.Bytes, CorpusSHA256: hex.EncodeToString(h.Sum(nil)),
		BuiltAt: time.Now().UTC().Truncate(time.Second), BuildSeconds: time.Since(start).Seconds(),
	}
	if err := writeRecord(dir, info); err != nil {
		return Info{}, err
	}
	p.Merging, p.Done = false, true
	report()
	return info, nil
}

// readLine reads one line (without its newline) of at most MaxLineBytes.
func readLine(r *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > MaxLineBytes {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrBadCorpus, MaxLineBytes)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == nil {
			return buf[:len(buf)-1], nil
		}
		return buf, err
	}
}

func checkEmptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("retriever: build %s: %w", dir, err)
	case len(ents) > 0:
		return fmt.Errorf("retriever: build %s: %w and is not empty; remove it or choose another directory", dir, ErrExists)
	}
	// An empty directory: bleve wants to create it itself.
	if err := os.Remove(dir); err != nil {
		return fmt.Errorf("retriever: build %s: %w", dir, err)
	}
	return nil
}

func writeRecord(dir string, info Info) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, recordFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("retriever: build %s: %w", dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, recordFile)); err != nil {
		return fmt.Errorf("retriever: build %s: %w", dir, err)
	}
	return nil
}

func readRecord(dir string) (Info, error) {
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if _, serr := os.Stat(dir); serr != nil {
				return Info{}, fmt.Errorf("retriever: open %s: %w: no such directory (build one with rollbox index build)", dir, ErrNotIndex)
			}
			if _, serr := os.Stat(filepath.Join(dir, "index_meta.json")); serr == nil {
				return Info{}, fmt.Errorf("retriever: open %s: %w: the build did not finish (no %s); rebuild it", dir, ErrNotIndex, recordFile)
			}
			return Info{}, fmt.Errorf("retriever: open %s: %w: no %s (build one with rollbox index build)", dir, ErrNotIndex, recordFile)
		}
		return Info{}, fmt.Errorf("retriever: open %s: %w", dir, err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("retriever: open %s: %w: %s: %v", dir, ErrNotIndex, recordFile, err)
	}
	if info.Format != FormatVersion {
		return Info{}, fmt.Errorf("retriever: open %s: %w: format %d, this build reads %d; rebuild it", dir, ErrNotIndex, info.Format, FormatVersion)
	}
	return info, nil
}

// Field names in the index.
const (
	fieldTitle    = "title"
	fieldText     = "text"
	fieldParent   = "parent"
	fieldChunk    = "chunk"
	fieldChunks   = "chunks"
	fieldMetaJSON = "meta_json"
	fieldMeta     = "meta"
	analyzerText  = "en"
)

// fields is what is indexed for a document or chunk.
func fields(d Doc) map[string]any {
	m := map[string]any{fieldTitle: d.Title, fieldText: d.Text, fieldParent: d.Parent}
	if d.Chunks > 0 {
		m[fieldChunk] = strconv.Itoa(d.Chunk)
		m[fieldChunks] = strconv.Itoa(d.Chunks)
	}
	if len(d.Metadata) > 0 {
		b, _ := json.Marshal(d.Metadata)
		m[fieldMetaJSON] = string(b)
		if t := metaTerms(d.Metadata); len(t) > 0 {
			m[fieldMeta] = t
		}
	}
	return m
}

// newMapping is the index mapping: English-analysed title and text
// (stored, for snippets and read), a keyword parent, stored-only chunk
// numbers and metadata JSON, keyword-analysed metadata terms for filters,
// and BM25 scoring.
func newMapping() *mapping.IndexMappingImpl {
	im := bleve.NewIndexMapping()
	im.ScoringModel = index.BM25Scoring
	im.DefaultAnalyzer = analyzerText
	im.StoreDynamic = false
	im.DocValuesDynamic = false

	text := func() *mapping.FieldMapping {
		f := bleve.NewTextFieldMapping()
		f.Analyzer = analyzerText
		f.Store = true
		f.IncludeInAll = false
		f.IncludeTermVectors = false
		f.DocValues = false
		return f
	}
	storedOnly := func() *mapping.FieldMapping {
		f := bleve.NewTextFieldMapping()
		f.Index = false
		f.Store = true
		f.IncludeInAll = false
		f.IncludeTermVectors = false
		f.DocValues = false
		return f
	}
	kw := bleve.NewKeywordFieldMapping()
	kw.Store = true
	kw.IncludeInAll = false
	kw.IncludeTermVectors = false
	kw.DocValues = false

	dm := bleve.NewDocumentStaticMapping()
	dm.AddFieldMappingsAt(fieldTitle, text())
	dm.AddFieldMappingsAt(fieldText, text())
	dm.AddFieldMappingsAt(fieldParent, kw)
	dm.AddFieldMappingsAt(fieldChunk, storedOnly())
	dm.AddFieldMappingsAt(fieldChunks, storedOnly())
	dm.AddFieldMappingsAt(fieldMetaJSON, storedOnly())
	meta := bleve.NewDocumentMapping()
	meta.Dynamic = true
	meta.DefaultAnalyzer = "keyword"
	dm.AddSubDocumentMapping(fieldMeta, meta)
	im.DefaultMapping = dm
	return im
}
