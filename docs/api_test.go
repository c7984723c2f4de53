package docs_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the generated parts of the docs (docs/api.md) from the code")

// node is a JSON object that remembers the order of its keys.
type node struct {
	keys []string
	vals map[string]json.RawMessage
}

func (n *node) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fmt.Errorf("not an object")
	}
	n.vals = map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		k := tok.(string)
		n.keys = append(n.keys, k)
		n.vals[k] = v
	}
	return nil
}

func (n *node) obj(k string) *node {
	var o node
	if raw, ok := n.vals[k]; ok && json.Unmarshal(raw, &o) == nil {
		return &o
	}
	return nil
}

func (n *node) str(k string) string {
	var s string
	json.Unmarshal(n.vals[k], &s)
	return s
}

func (n *node) list(k string) []json.RawMessage {
	var l []json.RawMessage
	json.Unmarshal(n.vals[k], &l)
	return l
}

// oneLine joins a description's lines and escapes table separators.
func oneLine(s string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(s), " "), "|", "\\|")
}

// typeOf describes a schema's type in a few words, linking named schemas.
func typeOf(n *node) string {
	if n == nil {
		return "any"
	}
	if ref := n.str("$ref"); ref != "" {
		name := ref[strings.LastIndex(ref, "/")+1:]
		return "[`" + name + "`](#" + strings.ToLower(name) + ")"
	}
	for _, k := range []string{"oneOf", "anyOf"} {
		if l := n.list(k); len(l) > 0 {
			var parts []string
			for _, raw := range l {
				var sub node
				json.Unmarshal(raw, &sub)
				parts = append(parts, typeOf(&sub))
			}
			return strings.Join(parts, " or ")
		}
	}
	if raw, ok := n.vals["enum"]; ok {
		var vals []any
		json.Unmarshal(raw, &vals)
		var s []string
		for _, v := range vals {
			b, _ := json.Marshal(v)
			s = append(s, "`"+string(b)+"`")
		}
		return "one of " + strings.Join(s, ", ")
	}
	if raw, ok := n.vals["const"]; ok {
		return "`" + string(raw) + "`"
	}
	var typ any
	json.Unmarshal(n.vals["type"], &typ)
	t := ""
	switch v := typ.(type) {
	case string:
		t = v
	case []any:
		var s []string
		for _, x := range v {
			s = append(s, fmt.Sprint(x))
		}
		t = strings.Join(s, " or ")
	}
	if t == "array" {
		if items := n.obj("items"); items != nil {
			return "array of " + typeOf(items)
		}
	}
	if t == "" {
		return "any"
	}
	return t
}

// properties writes the rows of an object schema's properties, nested
// objects as dotted names.
func properties(b *strings.Builder, n *node, prefix string, depth int) {
	props := n.obj("properties")
	if props == nil {
		return
	}
	var required []string
	json.Unmarshal(n.vals["required"], &required)
	for _, k := range props.keys {
		p := props.obj(k)
		req := ""
		if slices.Contains(required, k) {
			req = "yes"
		}
		desc := oneLine(p.str("description"))
		var extra []string
		for _, c := range []string{"minimum", "maximum", "default"} {
			if raw, ok := p.vals[c]; ok {
				extra = append(extra, c+" "+string(raw))
			}
		}
		if len(extra) > 0 {
			desc = strings.TrimSpace(desc + " (" + strings.Join(extra, ", ") + ")")
		}
		fmt.Fprintf(b, "| `%s%s` | %s | %s | %s |\n", prefix, k, typeOf(p), req, desc)
		if depth < 3 && p.obj("properties") != nil {
			properties(b, p, prefix+k+".", depth+1)
		}
		if items := p.obj("items"); depth < 3 && items != nil && items.obj("properties") != nil {
			properties(b, items, prefix+k+"[].", depth+1)
		}
	}
}

// apiMarkdown renders runtime/openapi.json: every route, then every schema.
func apiMarkdown(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "runtime", "openapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc node
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	paths := doc.obj("paths")
	fmt.Fprintf(&b, "## Routes\n\n| route | what it does |\n| --- | --- |\n")
	for _, p := range paths.keys {
		ops := paths.obj(p)
		for _, m := range ops.keys {
			if m == "parameters" {
				continue
			}
			op := ops.obj(m)
			route := strings.ToUpper(m) + " " + p
			fmt.Fprintf(&b, "| [`%s`](#%s) | %s |\n", route, anchor(route), oneLine(op.str("summary")))
		}
	}
	for _, p := range paths.keys {
		ops := paths.obj(p)
		var shared []json.RawMessage
		if ops.vals["parameters"] != nil {
			shared = ops.list("parameters")
		}
		for _, m := range ops.keys {
			if m == "parameters" {
				continue
			}
			op := ops.obj(m)
			route := strings.ToUpper(m) + " " + p
			fmt.Fprintf(&b, "\n### %s\n\n%s.", route, strings.TrimSuffix(oneLine(op.str("summary")), "."))
			if d := op.str("description"); d != "" {
				fmt.Fprintf(&b, " %s", oneLine(d))
			}
			b.WriteString("\n")
			params := append(append([]json.RawMessage{}, shared...), op.list("parameters")...)
			if len(params) > 0 {
				b.WriteString("\n| parameter | in | type | what it is |\n| --- | --- | --- | --- |\n")
				for _, raw := range params {
					var prm node
					json.Unmarshal(raw, &prm)
					fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", prm.str("name"), prm.str("in"), typeOf(prm.obj("schema")), oneLine(prm.str("description")))
				}
			}
			if body := op.obj("requestBody"); body != nil {
				content := body.obj("content")
				for _, ct := range content.keys {
					fmt.Fprintf(&b, "\nRequest body (`%s`): %s\n", ct, typeOf(content.obj(ct).obj("schema")))
				}
			}
			b.WriteString("\n| status | body | meaning |\n| --- | --- | --- |\n")
			resp := op.obj("responses")
			for _, code := range resp.keys {
				r := resp.obj(code)
				body := ""
				if content := r.obj("content"); content != nil {
					var parts []string
					for _, ct := range content.keys {
						parts = append(parts, typeOf(content.obj(ct).obj("schema"))+" (`"+ct+"`)")
					}
					body = strings.Join(parts, ", ")
				}
				desc := oneLine(r.str("description"))
				if h := r.obj("headers"); h != nil {
					desc += " Headers: " + strings.Join(h.keys, ", ") + "."
				}
				fmt.Fprintf(&b, "| %s | %s | %s |\n", code, body, desc)
			}
		}
	}
	b.WriteString("\n## Schemas\n")
	schemas := doc.obj("components").obj("schemas")
	for _, name := range schemas.keys {
		s := schemas.obj(name)
		fmt.Fprintf(&b, "\n### %s\n\n", name)
		if d := s.str("description"); d != "" {
			fmt.Fprintf(&b, "%s\n\n", oneLine(d))
		}
		if s.obj("properties") == nil {
			fmt.Fprintf(&b, "Type: %s.\n", typeOf(s))
			continue
		}
		b.WriteString("| field | type | required | what it is |\n| --- | --- | --- | --- |\n")
		properties(&b, s, "", 0)
	}
	return b.String()
}

// anchor is GitHub's anchor of a heading.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

const (
	beginGenerated = "<!-- BEGIN GENERATED from runtime/openapi.json by `go test ./docs -run API -update`; do not edit -->\n"
	endGenerated   = "<!-- END GENERATED -->\n"
)

// docs/api.md's reference is runtime/openapi.json rendered: a change of the
// API that the doc does not follow fails here (go test ./docs -run API
// -update rewrites it).
func TestTheAPIDocIsGeneratedFromTheOpenAPIDocument(t *testing.T) {
	path := filepath.Join(repoRoot, "docs", "api.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, beginGenerated), strings.Index(doc, endGenerated)
	if i < 0 || j < i {
		t.Fatalf("docs/api.md lacks the generated section's markers")
	}
	want := apiMarkdown(t)
	got := doc[i+len(beginGenerated) : j]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(doc[:i+len(beginGenerated)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/api.md is not runtime/openapi.json rendered: run go test ./docs -run API -update")
}
