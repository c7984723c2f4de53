package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the module root (this package's parent).
const repoRoot = ".."

// block is a fenced code block: its info string's words and its text.
type block struct {
	file string
	line int
	info []string
	body string
}

func (b block) attr(name string) string {
	for _, w := range b.info {
		if v, ok := strings.CutPrefix(w, name+"="); ok {
			return v
		}
	}
	return ""
}

// readDoc reads a Markdown file of the repository.
func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// blocks returns the fenced code blocks of a Markdown file.
func blocks(t *testing.T, name string) []block {
	t.Helper()
	var out []block
	var cur *block
	for i, line := range strings.Split(readDoc(t, name), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &block{file: name, line: i + 1, info: strings.Fields(strings.TrimPrefix(trimmed, "```"))}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: a code block is not closed", name, cur.line)
	}
	return out
}

// docFiles are the Markdown files the tests read.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "SECURITY.md", "RATIONALE.md"}
	docs, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	examples, _ := filepath.Glob(filepath.Join(repoRoot, "examples", "*", "README.md"))
	for _, e := range examples {
		rel, _ := filepath.Rel(repoRoot, e)
		files = append(files, rel)
	}
	return files
}

// tableRows returns the rows of the Markdown tables of a text: cells,
// trimmed, by row.
func tableRows(text string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "| ---") {
			continue
		}
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), " | ") {
			cells = append(cells, strings.TrimSpace(c))
		}
		rows = append(rows, cells)
	}
	return rows
}

// section returns the text of a Markdown section from its heading to the
// next heading of the same or a higher level.
func section(text, heading string) string {
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		return ""
	}
	level := strings.Count(strings.Fields(heading)[0], "#")
	rest := text[i+len(heading)+2:]
	re := regexp.MustCompile(`(?m)^#{1,` + string(rune('0'+level)) + `} `)
	if j := re.FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	return rest
}

var linkRe = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)

// Every relative link of the README and the docs points to a file of the
// repository, and none points outside it (a clone has nothing else).
func TestLinksStayInTheRepositoryAndResolve(t *testing.T) {
	for _, f := range docFiles(t) {
		text := readDoc(t, f)
		if strings.Contains(text, "shared/DESIGN.md") {
			t.Errorf("%s points to shared/DESIGN.md, which a clone does not have", f)
		}
		for _, m := range linkRe.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			p := filepath.Clean(filepath.Join(repoRoot, filepath.Dir(f), target))
			rel, err := filepath.Rel(repoRoot, p)
			if err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links to %s, outside the repository", f, target)
				continue
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s links to %s, which does not exist", f, target)
			}
		}
	}
}

// The README links every page of docs/.
func TestTheReadmeLinksEveryPage(t *testing.T) {
	readme := readDoc(t, "README.md")
	docs, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	for _, d := range docs {
		if !strings.Contains(readme, "](docs/"+filepath.Base(d)+")") {
			t.Errorf("README.md does not link docs/%s", filepath.Base(d))
		}
	}
}
