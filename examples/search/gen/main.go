// Command gen writes the search example: a corpus of the Go standard
// library's package documentation (parsed from $(go env GOROOT)/src with
// go/doc, no downloads), a bleve index of it, search tasks whose relevant
// documents are known by construction (which packages export a function or
// a type of some name; which package implements what its synopsis says),
// and a scripted policy that plays plausible search episodes for them.
//
//	go run ./examples/search/gen [-dir examples/search] [-chunk-tokens 400]
//
// The corpus and the index are generated (git-ignored); tasks.jsonl and
// policy.jsonl are deterministic for a given Go release and are committed.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/doc"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"

	"github.com/rollbox/rollbox/retriever"
)

func main() {
	dir := flag.String("dir", "examples/search", "directory to write corpus.jsonl, index/, tasks.jsonl and policy.jsonl into")
	chunkTokens := flag.Int("chunk-tokens", 400, "chunk size of the index (0: whole packages)")
	flag.Parse()
	if err := run(*dir, *chunkTokens); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

// pkgDoc is one package as the corpus and the task generator see it.
type pkgDoc struct {
	Path     string
	Synopsis string
	Text     string
	Funcs    []string // exported top-level functions (and type constructors)
	Types    []string
}

func run(dir string, chunkTokens int) error {
	pkgs, err := loadStd()
	if err != nil {
		return err
	}
	corpus := filepath.Join(dir, "corpus.jsonl")
	var b bytes.Buffer
	for _, p := range pkgs {
		line, _ := json.Marshal(map[string]any{
			"id": p.Path, "title": p.Path, "text": p.Text,
			"top": strings.SplitN(p.Path, "/", 2)[0], "funcs": p.Funcs, "types": p.Types,
		})
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(corpus, b.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "gen: %s: %d packages, %.1f MB\n", corpus, len(pkgs), float64(b.Len())/1e6)

	indexDir := filepath.Join(dir, "index")
	if err := os.RemoveAll(indexDir); err != nil {
		return err
	}
	info, err := retriever.BuildFile(context.Background(), indexDir, corpus, retriever.BuildOptions{ChunkTokens: chunkTokens})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "gen: %s: %d documents, %d indexed units, %.1fs\n", indexDir, info.Docs, info.Units, info.BuildSeconds)
	ix, err := retriever.Open(indexDir, retriever.OpenOptions{})
	if err != nil {
		return err
	}
	defer ix.Close()

	tasks, scripts, err := makeTasks(ix, pkgs)
	if err != nil {
		return err
	}
	if err := writeJSONL(filepath.Join(dir, "tasks.jsonl"), tasks); err != nil {
		return err
	}
	if err := writeJSONL(filepath.Join(dir, "policy.jsonl"), scripts); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "gen: %s and %s: %d tasks\n", filepath.Join(dir, "tasks.jsonl"), filepath.Join(dir, "policy.jsonl"), len(tasks))
	return nil
}

// loadStd parses every public standard library package for this GOOS and
// GOARCH, sorted by import path.
func loadStd() ([]pkgDoc, error) {
	out, err := exec.Command("go", "list", "std").Output()
	if err != nil {
		return nil, fmt.Errorf("go list std: %w", err)
	}
	var pkgs []pkgDoc
	for _, path := range strings.Fields(string(out)) {
		if hidden(path) {
			continue
		}
		p, err := loadPackage(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if p != nil {
			pkgs = append(pkgs, *p)
		}
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Path < pkgs[j].Path })
	return pkgs, nil
}

func hidden(path string) bool {
	for _, seg := range strings.Split(path, "/") {
		if seg == "internal" || seg == "vendor" {
			return true
		}
	}
	return false
}

func loadPackage(path string) (*pkgDoc, error) {
	bp, err := build.Default.Import(path, "", 0)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range append(append([]string{}, bp.GoFiles...), bp.CgoFiles...) {
		f, err := parser.ParseFile(fset, filepath.Join(bp.Dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, nil
	}
	dp, err := doc.NewFromFiles(fset, files, path)
	if err != nil {
		return nil, err
	}
	p := &pkgDoc{Path: path, Synopsis: dp.Synopsis(dp.Doc)}
	var t strings.Builder
	t.WriteString(strings.TrimSpace(dp.Doc) + "\n")
	section := func(title string) { fmt.Fprintf(&t, "\n%s:\n", title) }
	line := func(decl ast.Node, d string) {
		fmt.Fprintf(&t, "%s", oneLine(fset, decl))
		if s := dp.Synopsis(d); s != "" {
			fmt.Fprintf(&t, " — %s", s)
		}
		t.WriteByte('\n')
	}
	funcs := append([]*doc.Func{}, dp.Funcs...)
	for _, ty := range dp.Types {
		funcs = append(funcs, ty.Funcs...) // constructors are top-level functions too
	}
	sort.Slice(funcs, func(i, j int) bool { return funcs[i].Name < funcs[j].Name })
	if len(funcs) > 0 {
		section("Functions")
		for _, f := range funcs {
			line(f.Decl, f.Doc)
			p.Funcs = append(p.Funcs, f.Name)
		}
	}
	if len(dp.Types) > 0 {
		section("Types")
		for _, ty := range dp.Types {
			fmt.Fprintf(&t, "type %s", ty.Name)
			if s := dp.Synopsis(ty.Doc); s != "" {
				fmt.Fprintf(&t, " — %s", s)
			}
			t.WriteByte('\n')
			p.Types = append(p.Types, ty.Name)
			for _, m := range ty.Methods {
				t.WriteString("  ")
				line(m.Decl, m.Doc)
			}
		}
	}
	p.Text = t.String()
	return p, nil
}

var spaces = regexp.MustCompile(`\s+`)

// oneLine prints a declaration without its body on one line.
func oneLine(fset *token.FileSet, decl ast.Node) string {
	if fd, ok := decl.(*ast.FuncDecl); ok {
		c := *fd
		c.Body, c.Doc = nil, nil
		decl = &c
	}
	var b bytes.Buffer
	if err := format.Node(&b, fset, decl); err != nil {
		return fmt.Sprintf("%T", decl)
	}
	return spaces.ReplaceAllString(b.String(), " ")
}

// task is one line of tasks.jsonl.
type task struct {
	ID        string         `json:"id"`
	Prompt    string         `json:"prompt"`
	Retriever map[string]any `json:"retriever"`
	Reward    map[string]any `json:"reward"`
	Limits    map[string]any `json:"limits"`
	Metadata  map[string]any `json:"metadata"`
}

// script is one line of policy.jsonl (agent/scripted's format).
type script struct {
	TaskID string `json:"task_id"`
	Turns  []turn `json:"turns"`
}

type turn struct {
	Content   string `json:"content,omitempty"`
	ToolCalls []call `json:"tool_calls"`
}

type call struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

const instructions = " Search the Go standard library's package documentation, read what you need, prune what you no longer need, " +
	"and call finish with the ids of the relevant documents: package import paths such as \"net/http\" " +
	"(a part's id such as \"net/http#3\" counts as its package)."

func newTask(id, kind, question string, relevant []string) task {
	return task{
		ID:        id,
		Prompt:    question + instructions,
		Retriever: map[string]any{"index": "index", "context_tokens": 4000},
		Reward: map[string]any{"type": "fbeta", "beta": 4, "relevant": relevant,
			"trajectory_recall_weight": 0.2, "prune_penalty": 0.05, "prune_free": 1},
		Limits:   map[string]any{"max_turns": 12, "max_context_tokens": 16384},
		Metadata: map[string]any{"kind": kind, "go": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH},
	}
}

// makeTasks derives questions from the docs and plays each through the
// index to script a plausible episode: search, read the best two hits,
// prune them together, search again wider, finish with the packages whose
// snippets show the answer.
func makeTasks(ix *retriever.Index, pkgs []pkgDoc) ([]any, []any, error) {
	var tasks, scripts []any
	add := func(t task, s script, err error) error {
		if err != nil {
			return fmt.Errorf("task %s: %w", t.ID, err)
		}
		tasks = append(tasks, t)
		scripts = append(scripts, s)
		return nil
	}
	// Functions and types exported by 2..5 packages: "which packages ...".
	for _, kind := range []string{"func", "type"} {
		owners := map[string][]string{}
		for _, p := range pkgs {
			names := p.Funcs
			if kind == "type" {
				names = p.Types
			}
			for _, n := range dedup(names) {
				owners[n] = append(owners[n], p.Path)
			}
		}
		var names []string
		for n, ps := range owners {
			if len(ps) >= 2 && len(ps) <= 5 && len(n) >= 5 {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		for _, n := range pick(names, 8) {
			what := "a top-level function named " + n
			if kind == "type" {
				what = "a type named " + n
			}
			t := newTask(fmt.Sprintf("std-%s-%s", kind, n), kind, fmt.Sprintf("Which Go standard library packages export %s?", what), owners[n])
			s, err := play(ix, t.ID, []string{kind + " " + n, n}, func(h retriever.Hit) bool {
				return strings.Contains(h.Snippet, kind+" "+n+"(") || strings.Contains(h.Snippet, kind+" "+n+" ") ||
					strings.Contains(h.Snippet, kind+" "+n+"[") || strings.HasSuffix(h.Snippet, kind+" "+n)
			}, false)
			if err := add(t, s, err); err != nil {
				return nil, nil, err
			}
		}
	}
	// "Package X implements Y." → "Which package implements Y?"
	implRe := regexp.MustCompile(`^Package \S+ (implements|provides) (.{12,90})\.$`)
	var impl []pkgDoc
	for _, p := range pkgs {
		if implRe.MatchString(p.Synopsis) {
			impl = append(impl, p)
		}
	}
	for _, p := range pick(impl, 8) {
		m := implRe.FindStringSubmatch(p.Synopsis)
		t := newTask("std-pkg-"+strings.ReplaceAll(p.Path, "/", "-"), "synopsis",
			fmt.Sprintf("Which Go standard library package %s %s?", m[1], m[2]), []string{p.Path})
		s, err := play(ix, t.ID, []string{m[2]}, nil, true)
		if err := add(t, s, err); err != nil {
			return nil, nil, err
		}
	}
	return tasks, scripts, nil
}

// play scripts an episode for a task: the queries in turn, reading and
// pruning the first query's best two hits, finishing with the parents of
// the hits accepted (or, with top, the best hit's).
func play(ix *retriever.Index, taskID string, queries []string, accept func(retriever.Hit) bool, top bool) (script, error) {
	s := script{TaskID: taskID}
	chosen := map[string]bool{}
	var order []string
	choose := func(id string) {
		if !chosen[id] {
			chosen[id] = true
			order = append(order, id)
		}
	}
	for qi, q := range queries {
		k := 8
		if qi > 0 {
			k = 20
		}
		res, err := ix.Search(context.Background(), retriever.Query{Text: q, K: k})
		if err != nil {
			return s, err
		}
		s.Turns = append(s.Turns, turn{ToolCalls: []call{{Name: "search", Arguments: map[string]any{"query": q, "k": k}}}})
		if len(res.Hits) == 0 {
			continue
		}
		if qi == 0 {
			var reads []call
			var ids []any
			for _, h := range res.Hits[:min(2, len(res.Hits))] {
				reads = append(reads, call{Name: "read", Arguments: map[string]any{"id": h.ID}})
				ids = append(ids, h.ID)
			}
			s.Turns = append(s.Turns, turn{ToolCalls: reads})
			if top {
				choose(res.Hits[0].Parent)
			}
			s.Turns = append(s.Turns, turn{Content: "Noted what these say; freeing the context.", ToolCalls: []call{{Name: "prune", Arguments: map[string]any{"ids": ids}}}})
		}
		if accept != nil {
			for _, h := range res.Hits {
				if accept(h) {
					choose(h.Parent)
				}
			}
		}
	}
	ids := make([]any, len(order))
	for i, id := range order {
		ids[i] = id
	}
	s.Turns = append(s.Turns, turn{ToolCalls: []call{{Name: "finish", Arguments: map[string]any{"ids": ids}}}})
	return s, nil
}

func dedup(ss []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// pick takes n items spread evenly over xs (deterministically).
func pick[T any](xs []T, n int) []T {
	if len(xs) <= n {
		return xs
	}
	out := make([]T, 0, n)
	for i := range n {
		out = append(out, xs[i*len(xs)/n])
	}
	return out
}

func writeJSONL(file string, lines []any) error {
	var b bytes.Buffer
	for _, l := range lines {
		j, err := json.Marshal(l)
		if err != nil {
			return err
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	return os.WriteFile(file, b.Bytes(), 0o644)
}
