package textdiff

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestUnifiedShowsTheChangedLinesWithContext(t *testing.T) {
	tests := []struct {
		name, a, b, want string
	}{
		{"equal texts give no diff", "x\n", "x\n", ""},
		{"one changed line in the middle", "1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n2\n3\n4\nFIVE\n6\n7\n8\n9\n",
			"--- a\n+++ b\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+FIVE\n 6\n 7\n 8\n"},
		{"a line added at the end", "a\n", "a\nb\n", "--- a\n+++ b\n@@ -1 +1,2 @@\n a\n+b\n"},
		{"from nothing", "", "new\n", "--- a\n+++ b\n@@ -0,0 +1 @@\n+new\n"},
		{"a missing final newline is marked", "a\nb", "a\nc", "--- a\n+++ b\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"},
		{"changes far apart make two hunks", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n", "X\n2\n3\n4\n5\n6\n7\n8\n9\nY\n",
			"--- a\n+++ b\n@@ -1,2 +1,2 @@\n-1\n+X\n 2\n@@ -9,2 +9,2 @@\n 9\n-10\n+Y\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := 3
			if strings.HasPrefix(tt.name, "changes far") {
				ctx = 1
			}
			if got := Unified(tt.a, tt.b, "a", "b", ctx); got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// applying the edit script to a must give b, and it must be minimal enough
// to keep the common lines.
func TestTheEditScriptTurnsOneTextIntoTheOther(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		a := randomLines(r)
		b := randomLines(r)
		var gotA, gotB []string
		for _, e := range diffLines(a, b) {
			if e.op != '+' {
				gotA = append(gotA, e.line)
			}
			if e.op != '-' {
				gotB = append(gotB, e.line)
			}
		}
		if fmt.Sprint(gotA) != fmt.Sprint(a) || fmt.Sprint(gotB) != fmt.Sprint(b) {
			t.Fatalf("case %d: script does not reproduce the texts:\na=%q\nb=%q", i, a, b)
		}
	}
}

func randomLines(r *rand.Rand) []string {
	n := r.IntN(12)
	out := make([]string, n)
	for i := range out {
		out[i] = string(rune('a'+r.IntN(4))) + "\n"
	}
	return out
}

func TestAHugeDiffIsCappedAndCounted(t *testing.T) {
	var a, b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&a, "line %d\n", i)
		fmt.Fprintf(&b, "other %d\n", i)
	}
	got := Unified(a.String(), b.String(), "a", "b", 3)
	if !strings.Contains(got, "more diff line(s) not shown") || strings.Count(got, "\n") > DefaultMaxLines+10 {
		t.Errorf("diff of %d lines", strings.Count(got, "\n"))
	}
}
