package docs_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/tools"
)

// schemaPaths lists every property of a JSON Schema as a dotted path
// ("steps[].usage.prompt_tokens"), following $refs into $defs.
func schemaPaths(t *testing.T, schema []byte) []string {
	t.Helper()
	var root map[string]any
	if err := json.Unmarshal(schema, &root); err != nil {
		t.Fatal(err)
	}
	defs, _ := root["$defs"].(map[string]any)
	var out []string
	var walk func(node map[string]any, prefix string, seen map[string]bool)
	walk = func(node map[string]any, prefix string, seen map[string]bool) {
		if ref, ok := node["$ref"].(string); ok {
			name := ref[strings.LastIndex(ref, "/")+1:]
			if seen[name] || name == "bytes" {
				return
			}
			seen[name] = true
			walk(defs[name].(map[string]any), prefix, seen)
			delete(seen, name)
			return
		}
		for _, k := range []string{"oneOf", "anyOf"} {
			if list, ok := node[k].([]any); ok {
				for _, sub := range list {
					walk(sub.(map[string]any), prefix, seen)
				}
			}
		}
		if items, ok := node["items"].(map[string]any); ok {
			walk(items, prefix+"[]", seen)
		}
		props, _ := node["properties"].(map[string]any)
		for k, v := range props {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			out = append(out, p)
			walk(v.(map[string]any), p, seen)
		}
	}
	walk(root, "", map[string]bool{})
	slices.Sort(out)
	return slices.Compact(out)
}

// docs/trajectory.md has a row for every field of the JSON Schema, and no
// row for a field the schema does not have; its closed lists are the
// code's.
func TestTheTrajectoryDocIsTheSchemaFieldByField(t *testing.T) {
	doc := readDoc(t, "docs/trajectory.md")
	rows := map[string]bool{}
	for _, r := range tableRows(doc) {
		rows[strings.Trim(r[0], "`")] = true
	}
	paths := schemaPaths(t, trajectory.JSONSchema)
	if len(paths) < 150 {
		t.Fatalf("only %d schema paths", len(paths))
	}
	inSchema := map[string]bool{}
	for _, p := range paths {
		inSchema[p] = true
		if !rows[p] {
			t.Errorf("docs/trajectory.md has no row for %s", p)
		}
	}
	for _, r := range tableRows(doc) {
		p := strings.Trim(r[0], "`")
		if (strings.Contains(p, ".") || strings.Contains(p, "[]")) && !inSchema[p] {
			t.Errorf("docs/trajectory.md documents %s, which the schema does not have", p)
		}
	}
	// The closed lists: every tool error kind and every end reason has a row.
	for _, k := range tools.ErrorKinds() {
		if !rows[string(k)] {
			t.Errorf("the error kind %s has no row", k)
		}
	}
	for _, r := range trajectory.EndReasons() {
		if !rows[r] {
			t.Errorf("the end reason %s has no row", r)
		}
	}
}
