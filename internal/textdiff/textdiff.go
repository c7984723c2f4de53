// Package textdiff makes unified diffs of texts, line by line (Myers's
// algorithm, bounded), for replay's divergences and the workspace diffs
// judges read.
package textdiff

import (
	"fmt"
	"strings"
)

// maxEdits bounds the diff search: outputs that differ in more lines than
// this are shown as one replaced block (after their common head and tail).
const maxEdits = 2000

// DefaultMaxLines caps a rendered diff of Unified; the rest is counted.
const DefaultMaxLines = 200

type edit struct {
	op   byte // ' ', '-', '+'
	line string
}

// Unified is a unified diff of a and b, line by line, with context lines of
// context around each change, headed by the two names; "" when they are
// equal. A final line without a newline is marked as diff(1) marks it. At
// most DefaultMaxLines diff lines are shown.
func Unified(a, b, nameA, nameB string, context int) string {
	return UnifiedN(a, b, nameA, nameB, context, DefaultMaxLines)
}

// UnifiedN is Unified showing at most maxLines diff lines (the rest counted).
func UnifiedN(a, b, nameA, nameB string, context, maxLines int) string {
	maxDiffLines := maxLines
	if a == b {
		return ""
	}
	la, lb := splitLines(a), splitLines(b)
	edits := diffLines(la, lb)
	var out strings.Builder
	fmt.Fprintf(&out, "--- %s\n+++ %s\n", nameA, nameB)
	lines := 0
	more := 0
	for _, h := range hunks(edits, context) {
		if lines >= maxDiffLines {
			more += len(h.edits)
			continue
		}
		fmt.Fprintf(&out, "@@ -%s +%s @@\n", span(h.aStart, h.aLen), span(h.bStart, h.bLen))
		for _, e := range h.edits {
			if lines >= maxDiffLines {
				more++
				continue
			}
			text, nl := strings.CutSuffix(e.line, "\n")
			out.WriteByte(e.op)
			out.WriteString(text)
			out.WriteByte('\n')
			if !nl {
				out.WriteString("\\ No newline at end of file\n")
			}
			lines++
		}
	}
	if more > 0 {
		fmt.Fprintf(&out, "... %d more diff line(s) not shown\n", more)
	}
	return out.String()
}

func span(start, n int) string {
	if n == 1 {
		return fmt.Sprint(start)
	}
	if n == 0 {
		return fmt.Sprintf("%d,0", start-1)
	}
	return fmt.Sprintf("%d,%d", start, n)
}

// splitLines splits s after each newline, keeping them.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// diffLines is the shortest edit script from a to b (Myers), after cutting
// their common head and tail.
func diffLines(a, b []string) []edit {
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	var out []edit
	for _, l := range a[:pre] {
		out = append(out, edit{' ', l})
	}
	out = append(out, myers(a[pre:len(a)-suf], b[pre:len(b)-suf])...)
	for _, l := range a[len(a)-suf:] {
		out = append(out, edit{' ', l})
	}
	return out
}

// myers finds a shortest edit script, keeping for each round only the
// diagonals it can reach (memory grows with the square of the edits, not
// with the inputs); past maxEdits it gives up and replaces a with b.
func myers(a, b []string) []edit {
	n, m := len(a), len(b)
	if n == 0 || m == 0 {
		return replaceAll(a, b)
	}
	limit := min(n+m, maxEdits)
	off := limit + 1
	v := make([]int, 2*limit+3)
	var trace [][]int // trace[d] is v[-d..d] before round d
	for d := 0; d <= limit; d++ {
		trace = append(trace, append([]int(nil), v[off-d:off+d+1]...))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[off+k] = x
			if x >= n && y >= m {
				return backtrack(a, b, trace, d)
			}
		}
	}
	return replaceAll(a, b)
}

func backtrack(a, b []string, trace [][]int, last int) []edit {
	x, y := len(a), len(b)
	var rev []edit
	for d := last; d >= 0; d-- {
		at := func(k int) int { return trace[d][k+d] }
		k := x - y
		var pk int
		if k == -d || (k != d && at(k-1) < at(k+1)) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := 0
		if d > 0 {
			px = at(pk)
		}
		py := px - pk
		for x > px && y > py {
			rev = append(rev, edit{' ', a[x-1]})
			x--
			y--
		}
		if d > 0 {
			if x == px {
				rev = append(rev, edit{'+', b[py]})
			} else {
				rev = append(rev, edit{'-', a[px]})
			}
		}
		x, y = px, py
	}
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

func replaceAll(a, b []string) []edit {
	out := make([]edit, 0, len(a)+len(b))
	for _, l := range a {
		out = append(out, edit{'-', l})
	}
	for _, l := range b {
		out = append(out, edit{'+', l})
	}
	return out
}

type hunk struct {
	aStart, aLen, bStart, bLen int
	edits                      []edit
}

// hunks groups an edit script into hunks with context lines around changes.
func hunks(edits []edit, context int) []hunk {
	var out []hunk
	ai, bi := 1, 1 // 1-based line numbers at edits[i]
	type pos struct{ a, b int }
	at := make([]pos, len(edits)+1)
	for i, e := range edits {
		at[i] = pos{ai, bi}
		if e.op != '+' {
			ai++
		}
		if e.op != '-' {
			bi++
		}
	}
	at[len(edits)] = pos{ai, bi}
	i := 0
	for i < len(edits) {
		for i < len(edits) && edits[i].op == ' ' {
			i++
		}
		if i == len(edits) {
			break
		}
		start := max(0, i-context)
		end := i
		for end < len(edits) {
			if edits[end].op != ' ' {
				end++
				continue
			}
			run := end
			for run < len(edits) && edits[run].op == ' ' {
				run++
			}
			if run == len(edits) || run-end > 2*context {
				end = min(end+context, len(edits))
				break
			}
			end = run
		}
		h := hunk{aStart: at[start].a, bStart: at[start].b, edits: edits[start:end]}
		h.aLen = at[end].a - at[start].a
		h.bLen = at[end].b - at[start].b
		out = append(out, h)
		i = end
	}
	return out
}
