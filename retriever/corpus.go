package retriever

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Doc is one document of a corpus, or one chunk of one.
type Doc struct {
	ID string `json:"id"`
	// Parent is the corpus document a chunk was cut from; for a document
	// that was not chunked it is ID itself.
	Parent string `json:"parent"`
	// Chunk is the chunk's 1-based position in its parent and Chunks the
	// parent's number of chunks; both are 0 when the index is not chunked.
	Chunk  int    `json:"chunk,omitempty"`
	Chunks int    `json:"chunks,omitempty"`
	Title  string `json:"title,omitempty"`
	Text   string `json:"text"`
	// Metadata holds the corpus line's other fields, as decoded JSON.
	Metadata map[string]any `json:"metadata,omitempty"`
}

// MaxIDBytes bounds a document id.
const MaxIDBytes = 512

// ParseDoc decodes one corpus line: a JSON object with a string "id", an
// optional string "title", a string "text", and any other fields as
// metadata. The error says what is wrong, not where (the caller names the
// line).
func ParseDoc(line []byte) (Doc, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return Doc{}, fmt.Errorf("not valid JSON: %v", err)
	}
	if dec.More() {
		return Doc{}, fmt.Errorf("more than one JSON value on the line")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return Doc{}, fmt.Errorf("want a JSON object, got %s", jsonKind(v))
	}
	var d Doc
	rawID, ok := obj["id"]
	if !ok {
		return Doc{}, fmt.Errorf(`no "id" field`)
	}
	id, ok := rawID.(string)
	if !ok {
		return Doc{}, fmt.Errorf(`"id" must be a string, got %s`, jsonKind(rawID))
	}
	if err := checkID(id); err != nil {
		return Doc{}, err
	}
	d.ID, d.Parent = id, id
	for _, f := range []struct {
		name string
		to   *string
	}{{"title", &d.Title}, {"text", &d.Text}} {
		raw, ok := obj[f.name]
		if !ok || raw == nil {
			continue
		}
		s, ok := raw.(string)
		if !ok {
			return Doc{}, fmt.Errorf("document %q: %q must be a string, got %s", id, f.name, jsonKind(raw))
		}
		*f.to = s
	}
	if strings.TrimSpace(d.Title) == "" && strings.TrimSpace(d.Text) == "" {
		return Doc{}, fmt.Errorf("document %q has neither title nor text", id)
	}
	for k, val := range obj {
		switch k {
		case "id", "title", "text":
			continue
		}
		if k == "" {
			return Doc{}, fmt.Errorf("document %q: a metadata field has an empty name", id)
		}
		if d.Metadata == nil {
			d.Metadata = map[string]any{}
		}
		d.Metadata[k] = val
	}
	return d, nil
}

// checkID refuses ids that the context markers (<<doc ID>>) or the
// transcript could not carry.
func checkID(id string) error {
	switch {
	case strings.TrimSpace(id) == "":
		return fmt.Errorf(`"id" is empty`)
	case len(id) > MaxIDBytes:
		return fmt.Errorf("id %.40q… is longer than %d bytes", id, MaxIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("id %q is not valid UTF-8", id)
	case strings.Contains(id, "<<") || strings.Contains(id, ">>"):
		return fmt.Errorf(`id %q contains "<<" or ">>", which mark documents in the model's context`, id)
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("id %q contains a control character", id)
		}
	}
	return nil
}

// ChunkID is the id of the n-th (1-based) chunk of document id.
func ChunkID(id string, n int) string { return id + "#" + strconv.Itoa(n) }

// Chunk splits d into pieces of at most maxTokens estimated tokens (4 bytes
// a token), on paragraph, then sentence, then word boundaries. Chunk ids
// are ChunkID(d.ID, n): the same text and maxTokens give the same ids in
// every build. maxTokens <= 0 returns d unchanged.
func Chunk(d Doc, maxTokens int) []Doc {
	if maxTokens <= 0 {
		return []Doc{d}
	}
	parts := splitText(d.Text, maxTokens*4)
	if len(parts) == 0 {
		parts = []string{""} // a title-only document is one chunk
	}
	out := make([]Doc, len(parts))
	for i, p := range parts {
		out[i] = Doc{ID: ChunkID(d.ID, i+1), Parent: d.ID, Chunk: i + 1, Chunks: len(parts),
			Title: d.Title, Text: p, Metadata: d.Metadata}
	}
	return out
}

// splitText packs the text's pieces greedily into chunks of at most max
// bytes. Pieces are paragraphs; a paragraph too long is cut into sentences,
// a sentence into words, a word at rune boundaries.
func splitText(text string, max int) []string {
	var pieces []string
	for _, para := range splitKeep(text, "\n\n") {
		if len(para) <= max {
			pieces = append(pieces, para)
			continue
		}
		for _, sent := range splitSentences(para) {
			if len(sent) <= max {
				pieces = append(pieces, sent)
				continue
			}
			for _, w := range splitKeep(sent, " ") {
				for len(w) > max {
					cut := max
					for cut > 0 && !utf8.RuneStart(w[cut]) {
						cut--
					}
					if cut == 0 {
						cut = max
					}
					pieces = append(pieces, w[:cut])
					w = w[cut:]
				}
				pieces = append(pieces, w)
			}
		}
	}
	var out []string
	var cur strings.Builder
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	for _, p := range pieces {
		if cur.Len() > 0 && cur.Len()+len(p) > max {
			flush()
		}
		cur.WriteString(p)
	}
	flush()
	return out
}

// splitKeep splits s after each sep, keeping sep at the end of its piece.
func splitKeep(s, sep string) []string {
	var out []string
	for s != "" {
		i := strings.Index(s, sep)
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+len(sep)])
		s = s[i+len(sep):]
	}
	return out
}

// splitSentences splits after ". ", "? ", "! " and single newlines.
func splitSentences(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s)-1; i++ {
		c, next := s[i], s[i+1]
		if (c == '.' || c == '?' || c == '!') && (next == ' ' || next == '\n') || c == '\n' {
			out = append(out, s[start:i+1])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// metaTerms turns metadata into the exact-match terms indexed for filters:
// strings as they are, numbers as written, booleans as true/false, arrays
// of those as several values. Objects are kept (stored) but not indexed.
func metaTerms(md map[string]any) map[string]any {
	if len(md) == 0 {
		return nil
	}
	out := map[string]any{}
	for k, v := range md {
		var vals []string
		add := func(x any) {
			switch x := x.(type) {
			case string:
				vals = append(vals, x)
			case json.Number:
				vals = append(vals, x.String())
			case bool:
				vals = append(vals, strconv.FormatBool(x))
			}
		}
		if arr, ok := v.([]any); ok {
			for _, x := range arr {
				add(x)
			}
		} else {
			add(v)
		}
		switch len(vals) {
		case 0:
		case 1:
			out[k] = vals[0]
		default:
			anys := make([]any, len(vals))
			for i, s := range vals {
				anys[i] = s
			}
			out[k] = anys
		}
	}
	return out
}

// MetadataFields lists the metadata names seen, sorted.
func metadataFields(seen map[string]bool) []string {
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number, float64:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
