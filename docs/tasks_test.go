package docs_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/reward"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// parseTask parses one task as a task file's line would be, relative
// paths resolving against base (relative to the repository).
func parseTask(body, base string) (*agent.Task, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(body)); err != nil {
		return nil, fmt.Errorf("not one JSON value: %v", err)
	}
	return agent.ParseTask(buf.Bytes(), filepath.Join(repoRoot, base), tools.Known)
}

// Every task example of the docs parses as a task file's line; every
// example shown refused is refused with the error the doc shows.
func TestEveryTaskExampleInTheDocsParsesOrIsRefusedAsShown(t *testing.T) {
	n := 0
	for _, f := range docFiles(t) {
		bs := blocks(t, f)
		for i, b := range bs {
			if len(b.info) < 2 || b.info[0] != "json" || !strings.HasPrefix(b.info[1], "task") {
				continue
			}
			n++
			task, err := parseTask(b.body, b.attr("base"))
			switch b.info[1] {
			case "task":
				if err != nil {
					t.Errorf("%s:%d: the example does not parse: %v", f, b.line, err)
				}
			case "task-refused":
				if i+1 >= len(bs) || bs[i+1].info[0] != "text" || len(bs[i+1].info) < 2 || bs[i+1].info[1] != "error" {
					t.Errorf("%s:%d: a refused example is followed by the error, in a ```text error block", f, b.line)
					continue
				}
				want := strings.TrimSpace(bs[i+1].body)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s:%d: the example is refused with %v, the doc says %q", f, b.line, err, want)
				}
			default:
				t.Errorf("%s:%d: unknown block kind %q", f, b.line, b.info[1])
			}
			_ = task
		}
	}
	if n < 15 {
		t.Errorf("only %d task examples in the docs", n)
	}
	// And the example task files of the repository.
	files, _ := filepath.Glob(filepath.Join(repoRoot, "examples", "*", "*tasks.jsonl"))
	for _, f := range files {
		if _, err := agent.LoadTasks(f, tools.Known); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// fieldPaths lists the JSON fields of a task, as dotted paths: the leaves
// and the top-level fields ("sandbox", "sandbox.limits.cpus",
// "reward.parts[].weight").
func fieldPaths(t reflect.Type, prefix string, seen map[reflect.Type]bool) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" || name == "" {
			continue
		}
		p := prefix + name
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		slice := false
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			ft, slice = ft.Elem(), true
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeOf(json.RawMessage{}) && !seen[ft] {
			if prefix == "" {
				out = append(out, p)
			}
			seen[ft] = true
			sub := p + "."
			if slice {
				sub = p + "[]."
			}
			out = append(out, fieldPaths(ft, sub, seen)...)
			delete(seen, ft)
			continue
		}
		out = append(out, p)
	}
	return out
}

// Every field a task may have is in a table of docs/tasks.md.
func TestTheTaskDocNamesEveryField(t *testing.T) {
	doc := readDoc(t, "docs/tasks.md")
	documented := map[string]bool{}
	for _, row := range tableRows(doc) {
		documented[strings.Trim(row[0], "`")] = true
	}
	paths := fieldPaths(reflect.TypeOf(agent.Task{}), "", map[reflect.Type]bool{reflect.TypeOf(agent.Task{}): true})
	if len(paths) < 50 {
		t.Fatalf("only %d fields found: %v", len(paths), paths)
	}
	for _, p := range paths {
		if !documented[p] {
			t.Errorf("docs/tasks.md has no table row for %s", p)
		}
	}
}

// setPath sets a dotted path in a JSON object.
func setPath(obj map[string]any, path string, v any) {
	parts := strings.Split(path, ".")
	for _, k := range parts[:len(parts)-1] {
		next, ok := obj[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			obj[k] = next
		}
		obj = next
	}
	obj[parts[len(parts)-1]] = v
}

var rangeRe = regexp.MustCompile(`^(\d+)–(\d+)`)

// The defaults and ranges of the limits tables are the code's: the default
// is what an unset field becomes, the top of the range is accepted and one
// past it refused naming the field, and so is one below the bottom.
func TestTheDocumentedLimitsAreTheCodes(t *testing.T) {
	doc := readDoc(t, "docs/tasks.md")
	base := func() map[string]any {
		return map[string]any{"id": "t", "prompt": "p", "reward": map[string]any{"type": "tests", "command": "true"}}
	}
	def, err := parseTask(`{"id": "t", "prompt": "p", "reward": {"type": "exact", "answer": "x"}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	limits, _ := json.Marshal(def.Limits)
	effective := map[string]float64{}
	var el map[string]any
	json.Unmarshal(limits, &el)
	for k, v := range el {
		if f, ok := v.(float64); ok {
			effective["limits."+k] = f
		}
	}
	sl := sandbox.Spec{}.WithDefaults().Limits
	for k, v := range map[string]float64{"cpus": sl.CPUs, "memory_mb": float64(sl.MemoryMB), "pids": float64(sl.PIDs),
		"disk_mb": float64(sl.DiskMB), "tmp_mb": float64(sl.TmpMB), "exec_timeout_s": sl.ExecTimeout.Seconds()} {
		effective["sandbox.limits."+k] = v
	}
	checked := 0
	for _, row := range tableRows(doc) {
		if len(row) < 4 {
			continue
		}
		path := strings.Trim(row[0], "`")
		m := rangeRe.FindStringSubmatch(row[3])
		if m == nil {
			continue
		}
		checked++
		lo, _ := strconv.ParseFloat(m[1], 64)
		hi, _ := strconv.ParseFloat(m[2], 64)
		if want, ok := effective[path]; ok {
			got, err := strconv.ParseFloat(strings.Fields(row[2])[0], 64)
			if err != nil || got != want {
				t.Errorf("%s: the doc's default is %q, the code's %v", path, row[2], want)
			}
		}
		try := func(v float64) error {
			obj := base()
			if strings.HasPrefix(path, "retriever.") {
				setPath(obj, "retriever.index", "index")
			}
			if strings.HasPrefix(path, "orchestrator.") || parlField(path) {
				setPath(obj, "orchestrator.subagent_policy", "scripted:sub.jsonl")
			}
			if parlField(path) {
				obj["reward"] = map[string]any{"type": "parl", "perf": map[string]any{"type": "exact", "answer": "a"}}
			}
			setPath(obj, path, v)
			b, _ := json.Marshal(obj)
			_, err := parseTask(string(b), "")
			return err
		}
		if err := try(hi); err != nil {
			t.Errorf("%s: %v, the top of the documented range, is refused: %v", path, hi, err)
		}
		over := hi + 1
		if row[1] == "number" {
			over = hi * 1.001
		}
		if err := try(over); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, past the documented range, is not refused naming the field: %v", path, over, err)
		}
		if lo > 1 {
			if err := try(lo - 1); err == nil || !strings.Contains(err.Error(), path) {
				t.Errorf("%s: %v, below the documented range, is not refused naming the field: %v", path, lo-1, err)
			}
		}
		if err := try(-1); err == nil {
			t.Errorf("%s: -1 is accepted", path)
		}
	}
	if checked < 14 {
		t.Errorf("only %d ranges checked", checked)
	}
}

// Every reward type has an example, and every tool its section naming its
// arguments; the default tools are the code's.
func TestEveryRewardTypeAndToolIsDocumented(t *testing.T) {
	doc := readDoc(t, "docs/tasks.md")
	types := map[string]bool{}
	for _, b := range blocks(t, "docs/tasks.md") {
		var task struct {
			Reward reward.Spec `json:"reward"`
		}
		if len(b.info) > 1 && strings.HasPrefix(b.info[1], "task") && json.Unmarshal([]byte(b.body), &task) == nil {
			types[task.Reward.Type] = true
			for _, p := range task.Reward.Parts {
				types[p.Reward.Type] = true
			}
		}
	}
	for _, typ := range reward.Types {
		if !types[typ] {
			t.Errorf("no example of a %s reward", typ)
		}
		if section(doc, "### "+typ) == "" {
			t.Errorf("no section ### %s", typ)
		}
	}
	all := map[string]tools.Tool{}
	for n, tool := range tools.Builtins() {
		all[n] = tool
	}
	all[tools.NameSearch], all[tools.NameRead], all[tools.NamePrune] = tools.Search{}, tools.Read{}, tools.Prune{}
	for name, tool := range all {
		sec := section(doc, "### `"+name+"`")
		if sec == "" {
			t.Errorf("no section ### `%s`", name)
			continue
		}
		var params struct {
			Properties map[string]any `json:"properties"`
		}
		json.Unmarshal(tool.Schema().Parameters, &params)
		for p := range params.Properties {
			if !strings.Contains(sec, "`"+p+"`") {
				t.Errorf("the section of %s does not name its argument %s", name, p)
			}
		}
	}
	for _, row := range tableRows(doc) {
		if row[0] != "`tools`" {
			continue
		}
		for _, list := range [][]string{tools.DefaultNames(true), tools.DefaultSearchNames()} {
			pos := 0
			for _, name := range list {
				i := strings.Index(row[2][pos:], "`"+name+"`")
				if i < 0 {
					t.Errorf("the tools row's default does not list %s in order: %s", name, row[2])
					break
				}
				pos += i
			}
		}
	}
}

// parlField reports whether path is a parl reward's own field.
func parlField(path string) bool {
	for _, f := range []string{"perf", "lambda_parallel", "lambda_finish", "anneal", "parallel_cap", "latency"} {
		if strings.HasPrefix(path, "reward."+f) {
			return true
		}
	}
	return false
}
