package retriever

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func FuzzParseDoc(f *testing.F) {
	for _, l := range small {
		f.Add([]byte(l))
	}
	f.Add([]byte(`{"id": "x", "text": "t", "n": 1.5e300, "a": [1, "b", null, {"c": 2}]}`))
	f.Add([]byte(`{"id": "a\u0000b", "text": "t"}`))
	f.Add([]byte(`{"id": "x"} {"id": "y"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		d, err := ParseDoc(line)
		if err != nil {
			return
		}
		if checkID(d.ID) != nil || d.Parent != d.ID {
			t.Fatalf("accepted id %q", d.ID)
		}
		if strings.TrimSpace(d.Title) == "" && strings.TrimSpace(d.Text) == "" {
			t.Fatal("accepted a document with neither title nor text")
		}
		metaTerms(d.Metadata) // must not panic on any JSON
	})
}

func FuzzChunk(f *testing.F) {
	f.Add("Alpha beta. Gamma delta!\n\nEpsilon zeta eta theta iota kappa.", 3)
	f.Add(strings.Repeat("x", 100)+" é漢字 done", 2)
	f.Add("", 1)
	f.Fuzz(func(t *testing.T, text string, tokens int) {
		if tokens <= 0 || tokens > 64 || !utf8.ValidString(text) {
			return // corpus text comes from JSON: always valid UTF-8
		}
		d := Doc{ID: "d", Parent: "d", Title: "T", Text: text}
		chunks := Chunk(d, tokens)
		var joined strings.Builder
		for i, c := range chunks {
			if c.ID != ChunkID("d", i+1) || c.Chunk != i+1 || c.Chunks != len(chunks) || c.Parent != "d" {
				t.Fatalf("chunk %d = %+v", i, c)
			}
			if len(c.Text) > tokens*4 {
				t.Fatalf("chunk %d has %d bytes, over %d", i, len(c.Text), tokens*4)
			}
			joined.WriteString(c.Text)
		}
		squeeze := func(s string) string {
			return strings.Map(func(r rune) rune {
				if unicode.IsSpace(r) {
					return -1
				}
				return r
			}, s)
		}
		if squeeze(joined.String()) != squeeze(text) {
			t.Fatalf("the chunks do not hold the text: %q vs %q", joined.String(), text)
		}
		again := Chunk(d, tokens)
		for i := range again {
			if again[i].Text != chunks[i].Text {
				t.Fatal("chunking is not deterministic")
			}
		}
	})
}
